/* SPDX-License-Identifier: Apache-2.0 */
/* The names a write-once tree takes. .cache/ (DESIGN.md §9): components
 * of 1-255 bytes without '/' or NUL, not "." or "..". .blocks/ (§10): a
 * key is 1-512 bytes of segments of [A-Za-z0-9._:-] joined by '/', no
 * empty, "." or ".." segment; each segment is a component. Fuzzed alone
 * (tests/fuzz/fuzz_tree_names.c). */
#ifndef ARTFS_TREES_NAMES_H
#define ARTFS_TREES_NAMES_H

#include <stddef.h>

#define WTREE_NAME_MAX 255
#define WBLOCKS_KEY_MAX 512

/* 0, -ENAMETOOLONG, or -EINVAL (empty, ".", "..", a '/'). */
int wtree_name_check(const char *name);

/* The same for len bytes that may hold anything (a NUL among them is
 * -EINVAL): what a fuzzer feeds. */
int wtree_name_check_bytes(const char *name, size_t len);

/* One segment of a block key (a component of .blocks/): 0, -ENAMETOOLONG
 * or -EINVAL. */
int wblocks_segment_check(const char *name);
int wblocks_segment_check_bytes(const char *name, size_t len);

/* A whole block key of len bytes: 0, -ENAMETOOLONG (past
 * WBLOCKS_KEY_MAX) or -EINVAL. */
int wblocks_key_check(const char *key, size_t len);

#endif
