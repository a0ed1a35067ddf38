/* SPDX-License-Identifier: Apache-2.0 */
/* What .blocks/'s files share (DESIGN.md §10): blocks by key
 * (blocks_keys.c) for its batches, .put (blocks_put.c) and .get
 * (blocks_get.c). Inside src/trees/ only. */
#ifndef ARTFS_TREES_BLOCKS_H
#define ARTFS_TREES_BLOCKS_H

#include "trees/wtree_i.h"

/* The block of key (len bytes, checked by wblocks_key_check), referenced,
 * with its size; NULL when this node holds none. */
struct wnode *wblocks_find(struct wtree *w, const char *key, size_t len, uint64_t *size);
/* The block v (SHA-256 then bytes) committed as key: its directories made
 * as needed, sent to the cluster first (remote=, unless fetched from it).
 * A key held already keeps its first bytes (other bytes: counted, logged)
 * and is 0. *out (when not NULL) the key's block, referenced. -EEXIST: a
 * directory holds the key's name or a block a directory's; -ENOSPC,
 * -EIO (the cluster did not take it), -errno: nothing committed. */
int wblocks_place(struct tree *t, struct wtree *w, const char *key, size_t len,
		  const struct wvalue *v, bool fetched, struct wnode **out);

#endif
