/* SPDX-License-Identifier: Apache-2.0 */
/* What each kind of node does in the namespace: its attributes, opening
 * it, for a directory the node of a name in it and the names in it, and
 * finding it again after a takeover. The tree's calls (tree_getattr,
 * tree_open_file, tree_lookup, opendir, tree_node) dispatch through one
 * table by node type and name no kind, as open files dispatch through
 * struct handle_ops. Each function lives with its concern (attr.c,
 * files.c, lookup.c, listing.c, revive.c; weights/ for the kinds of loaded
 * weights); node_ops.c holds the table that says which kind does what. */
#ifndef ARTFS_NODE_OPS_H
#define ARTFS_NODE_OPS_H

#include <sys/stat.h>

#include "state/base.h"

struct listing;

/* An operation left NULL is not one of the kind's: getattr -ENOENT (gone,
 * never seen by the kernel), open -EISDIR for a directory (lookup set),
 * else -ENOENT, lookup and list -ENOTDIR, revive: the id is stale. A
 * stale id (NODE_STALE: a node of a daemon before this one that is gone,
 * or not the one the id named) answers every operation -ENOENT, as a
 * removed file or directory does, a name in it too: the kernel forgets
 * the entry that led there when it expires (1 s) and looks the path up
 * again. */
struct node_ops {
	/* The attributes of n; *timeout comes as CACHE_FOREVER. 0 or -errno. */
	int (*getattr)(struct tree *t, struct node *n, struct stat *st, double *timeout);
	/* Opens n with flags, without numbering the handle. 0 or -errno. */
	int (*open)(struct tree *t, struct node *n, int flags, struct handle **h,
		    struct open_reply *r);
	/* A directory: the node of name in dir (e is zeroed), and the names in
	 * it after "." and ".." (a failure goes to the listing's error). */
	int (*lookup)(struct tree *t, struct node *dir, const char *name, struct tree_entry *e);
	void (*list)(struct tree *t, struct node *dir, struct listing *l);
	/* A daemon that took over: the node that r (what a daemon before
	 * wrote of it, held.h) names, referenced once; NULL when there is
	 * none any more. */
	struct node *(*revive)(struct tree *t, const struct held_node *r);
};

/* The operations of a node type (enum node_type); an unknown one has none. */
const struct node_ops *node_ops_of(unsigned type);

/* attr.c */
int attr_root(struct tree *t, struct node *n, struct stat *st, double *timeout);
int attr_info_dir(struct tree *t, struct node *n, struct stat *st, double *timeout);
int attr_info_file(struct tree *t, struct node *n, struct stat *st, double *timeout);
int attr_socket(struct tree *t, struct node *n, struct stat *st, double *timeout);
int attr_version(struct tree *t, struct node *n, struct stat *st, double *timeout);
int attr_object(struct tree *t, struct node *n, struct stat *st, double *timeout);
int attr_key(struct tree *t, struct node *n, struct stat *st, double *timeout);
int attr_keys_dir(struct tree *t, struct node *n, struct stat *st, double *timeout);
int attr_put(struct tree *t, struct node *n, struct stat *st, double *timeout);
int attr_get(struct tree *t, struct node *n, struct stat *st, double *timeout);
int attr_materialize(struct tree *t, struct node *n, struct stat *st, double *timeout);
int attr_cache(struct tree *t, struct node *n, struct stat *st, double *timeout);

/* files.c */
int files_open_info(struct tree *t, struct node *n, int flags, struct handle **h,
		    struct open_reply *r);
int files_open_object(struct tree *t, struct node *n, int flags, struct handle **h,
		      struct open_reply *r);
int files_open_key(struct tree *t, struct node *n, int flags, struct handle **h,
		   struct open_reply *r);
int files_open_put(struct tree *t, struct node *n, int flags, struct handle **h,
		   struct open_reply *r);
int files_open_get(struct tree *t, struct node *n, int flags, struct handle **h,
		   struct open_reply *r);
int attr_blocks_batch(struct tree *t, struct node *n, struct stat *st, double *timeout);
int files_open_blocks_batch(struct tree *t, struct node *n, int flags, struct handle **h,
			    struct open_reply *r);
int files_open_cache(struct tree *t, struct node *n, int flags, struct handle **h,
		     struct open_reply *r);
int files_open_materialize(struct tree *t, struct node *n, int flags, struct handle **h,
			   struct open_reply *r);
int files_open_stale(struct tree *t, struct node *n, int flags, struct handle **h,
		     struct open_reply *r);

/* lookup.c */
int lookup_in_root(struct tree *t, struct node *dir, const char *name, struct tree_entry *e);
int lookup_in_info_dir(struct tree *t, struct node *dir, const char *name, struct tree_entry *e);
int lookup_in_version(struct tree *t, struct node *dir, const char *name, struct tree_entry *e);
int lookup_in_keys_dir(struct tree *t, struct node *dir, const char *name, struct tree_entry *e);
int lookup_in_weights_dir(struct tree *t, struct node *dir, const char *name,
			  struct tree_entry *e);
int lookup_in_cache_dir(struct tree *t, struct node *dir, const char *name, struct tree_entry *e);
int lookup_in_stale(struct tree *t, struct node *dir, const char *name, struct tree_entry *e);

/* revive.c */
struct node *revive_version(struct tree *t, const struct held_node *r);
struct node *revive_materialize(struct tree *t, const struct held_node *r);
struct node *revive_put(struct tree *t, const struct held_node *r);
struct node *revive_object(struct tree *t, const struct held_node *r);

/* listing.c */
void listing_root(struct tree *t, struct node *dir, struct listing *l);
void listing_info_dir(struct tree *t, struct node *dir, struct listing *l);
void listing_version(struct tree *t, struct node *dir, struct listing *l);
void listing_keys_dir(struct tree *t, struct node *dir, struct listing *l);
void listing_weights_dir(struct tree *t, struct node *dir, struct listing *l);
void listing_cache_dir(struct tree *t, struct node *dir, struct listing *l);
void listing_stale(struct tree *t, struct node *dir, struct listing *l);

#endif
