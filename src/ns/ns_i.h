/* SPDX-License-Identifier: Apache-2.0 */
/* What the files of the tree's calls share (src/ns/start.c, attr.c,
 * lookup.c, names.c, files.c, reopen.c, tree.c; other folders see only
 * ns/tree.h): the nodes that sit inside a version or an object, and the
 * functions one file gives the others. */
#ifndef ARTFS_NS_I_H
#define ARTFS_NS_I_H

#include <stddef.h>

#include "state/base.h"

/* The version or object a node embedded in it belongs to. */
static inline struct version *version_of_materialize(struct node *n)
{
	return (struct version *)((char *)n - offsetof(struct version, materialize));
}

static inline struct version *version_of_put(struct node *n)
{
	return (struct version *)((char *)n - offsetof(struct version, put));
}

static inline struct object *object_of_key(struct node *n)
{
	return (struct object *)((char *)n - offsetof(struct object, keynode));
}

/* lookup.c: e answers with n, whose reference (taken by the caller)
 * becomes the kernel's; on failure it is dropped. 0 or -errno. */
int lookup_positive(struct tree *t, struct node *n, struct tree_entry *e);
/* lookup.c: the same for a node of the .cache/ tree, whose entries the
 * daemon may change (eviction, a damaged file, the first entry kept by a
 * rename): the kernel keeps them a second, a file being written not at all. */
int lookup_cache_positive(struct tree *t, struct node *n, struct tree_entry *e);

/* files.c: h (opened on n with flags) is whole: registered (shutdown
 * releases it) and numbered for the kernel. 0, or -ENFILE (no number: h
 * released). */
int files_handle_ready(struct tree *t, struct handle *h, struct node *n, int flags);
/* files.c: opens n as its kind says, without numbering the handle. */
int files_open_node(struct tree *t, struct node *n, int flags, struct handle **h,
		    struct open_reply *r);

#endif
