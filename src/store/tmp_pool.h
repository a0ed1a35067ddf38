/* SPDX-License-Identifier: Apache-2.0 */
/* Unnamed temporary files (O_TMPFILE) made ahead of need by a thread of
 * their own, so that a publish takes one ready instead of making it: a
 * batch stages dozens of records at once, and making a file is a fifth of
 * what a record costs its thread. The maker fills the pool between
 * batches, when the threads that stage records are idle. A publish that
 * finds the pool empty makes its file itself, as before; so does every
 * publish where the file system has no O_TMPFILE (the maker stops).
 * The maker also allocates each file's pages for the size last asked for
 * (up to TMP_POOL_PREALLOC_MAX; a batch's records are mostly of one
 * size), so that writing the object only copies; a file taken for less
 * gives back the pages it will not hold. */
#ifndef ARTFS_TMP_POOL_H
#define ARTFS_TMP_POOL_H

#include <stdint.h>

/* Files a pool holds when full; the maker starts again below half. */
#define TMP_POOL_FILES 256
#define TMP_POOL_PREALLOC_MAX (64u << 10)

struct tmp_pool;

/* A pool that makes its files in the directory dirfd (kept open by the
 * caller); its maker starts at once. NULL when it cannot be had. */
struct tmp_pool *tmp_pool_start(int dirfd);
/* A ready file (O_RDWR, empty, unnamed) for an object of size bytes (0:
 * unknown), or -1 when none is ready. */
int tmp_pool_take(struct tmp_pool *p, uint64_t size);
/* Stops the maker and closes the files it made. */
void tmp_pool_stop(struct tmp_pool *p);

#endif
