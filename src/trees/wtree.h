/* SPDX-License-Identifier: Apache-2.0 */
/* The write-once trees: directories of files that are written once,
 * invisible until their close commits them, immutable after, checked
 * (SHA-256) before the first byte they serve, and kept in the store across
 * daemons. One mechanism, two policies (policy.c):
 * - `.cache/` (DESIGN.md §9): any tool's cache files; bounded by use (least
 *   recently opened files go first); a damaged file is a miss.
 * - `.blocks/` (§10): upstream vLLM's auxiliary-output blocks by key; never
 *   evicted (full: ENOSPC), idle namespace directories expire (ttl=), a
 *   damaged block is EIO (fail closed), batches through .put and .get.
 * The namespace (src/ns/) dispatches the calls on NODE_CACHE_DIR and
 * NODE_CACHE_FILE nodes (of either tree: a node knows its tree) here;
 * everything below is in this folder.
 *
 * Store layout: <store>/cache/ (<store>/blocks/) mirrors the tree; a committed file is a
 * header of WTREE_HEADER bytes (magic, size, SHA-256) and its bytes. A
 * file being written is an unnamed temporary file of the store until its
 * commit links it in (a crash leaves nothing). A node is known to the next
 * daemon by its store file's inode number, which renames keep. */
#ifndef ARTFS_TREES_WTREE_H
#define ARTFS_TREES_WTREE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>

#include "state/base.h"

#define WTREE_MOUNT_NAME ".cache"   /* the cache tree's name in the mount's root */
#define WBLOCKS_MOUNT_NAME ".blocks"/* the blocks tree's */
#define WTREE_DEPTH_MAX 256         /* directories below a tree's root (.cache/: 32) */
#define WTREE_PATH_MAX 4000         /* bytes of a path below a tree's root */

enum wtree_kind { WTREE_CACHE, WTREE_BLOCKS };

/* Opens the tree of kind in the store and indexes what it holds (a fresh
 * start or a takeover alike: what the daemon before committed is in the
 * store); t->cache or t->blocks from then on. 0 or -errno with why in err. */
int wtree_open(struct tree *t, enum wtree_kind kind, char *err, size_t errlen);
void wtree_close(struct tree *t, enum wtree_kind kind);
/* For a daemon that takes over, before it serves: drops what a daemon
 * before left in the trees' tmp directories that no writer holds. */
void wtrees_take_over(struct tree *t);

/* The tree's root directory node (.cache, .blocks), referenced. */
struct node *wtree_root(struct wtree *w);
/* The tree a node of it (NODE_CACHE_DIR, NODE_CACHE_FILE) is part of. */
struct wtree *wtree_of(const struct node *n);
/* Whether n is the root of the .blocks tree (where .put and .get are). */
bool wtree_is_blocks_root(const struct node *n);

/* Calls on the tree's nodes, as the namespace's (ns/tree.h) are. */
int wtree_getattr(struct tree *t, struct node *n, struct stat *st, double *timeout);
/* The node of name in dir, referenced (committed files and directories
 * only). 0 or -errno. */
int wtree_lookup(struct tree *t, struct node *dir, const char *name, struct node **out);
int wtree_mkdir(struct tree *t, struct node *dir, const char *name, struct node **out);
int wtree_rmdir(struct tree *t, struct node *dir, const char *name);
int wtree_unlink(struct tree *t, struct node *dir, const char *name);
int wtree_rename(struct tree *t, struct node *from_dir, const char *from, struct node *to_dir,
		 const char *to, unsigned flags);
/* A file made for writing: invisible to every other process until its
 * close commits it. */
int wtree_create(struct tree *t, struct node *dir, const char *name, int flags,
		 struct node **out, struct handle **h, struct open_reply *r);
/* Whether n is a file not committed yet (the kernel must not keep its entry). */
bool wtree_pending(const struct node *n);
/* A created file's handle h has its number: its record (held.h) names what
 * a next daemon needs to go on with it. */
void wtree_handle_ready(struct tree *t, struct handle *h);
/* The handle of a file being written when its daemon died or drained,
 * opened again from its record: the writer goes on. -EALREADY: it was
 * committed before (its close answers 0), -ENOENT: it is gone. */
int wtree_reopen_write(struct tree *t, struct node *n, const struct held_handle *rec,
		       struct handle **h);
int wtree_open_file(struct tree *t, struct node *n, int flags, struct handle **h,
		    struct open_reply *r);
/* chmod/chown (perm), truncation to *size (NULL: none); times are the
 * tree's own and a change of them is accepted and left. */
int wtree_setattr(struct tree *t, struct node *n, bool perm, const uint64_t *size);

/* A listing's names: fn(ctx, name, id, DT_*) for each entry of dir. */
typedef void (*wtree_list_fn)(void *ctx, const char *name, uint64_t id, unsigned char type);
void wtree_list(struct tree *t, struct node *dir, wtree_list_fn fn, void *ctx);

/* What the next daemon needs to find n again (held.h), and finding it. */
void wtree_describe(const struct node *n, struct held_node *d);
struct node *wtree_revive(struct tree *t, const struct held_node *r);

/* The tree's gauges for .artfs/metrics. */
void wtree_gauges(struct wtree *w, uint64_t *bytes, uint64_t *files, uint64_t *capacity);

/* .blocks/.put and .blocks/.get (DESIGN.md §10): each open is one
 * transaction (blocks_put.c, blocks_get.c). */
int wblocks_put_open(struct tree *t, struct handle **h, struct open_reply *r);
int wblocks_get_open(struct tree *t, struct handle **h, struct open_reply *r);
/* A .blocks/.put a drained daemon handed over (its record's text): the
 * next daemon goes on with it. 0, -EIO (it cannot), -ENOMEM. */
int wblocks_put_resume(struct tree *t, const uint8_t *text, size_t len, struct handle **h);

/* .blocks/ (DESIGN.md §10): ttl= collection of its idle namespace
 * directories (from the expiry sweep and before a full tree answers
 * ENOSPC): blocks removed, 0 when none. */
uint64_t wblocks_collect(struct tree *t, int64_t now);

#endif
