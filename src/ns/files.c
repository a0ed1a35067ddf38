/* SPDX-License-Identifier: Apache-2.0 */
/* Files created and opened: create of an object (by version and hash, or
 * by key) begins its publish; open hands each kind of node to the module
 * that owns its handle. */
#include "autoconf.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>

#include "format/key.h"
#include "lib/log.h"
#include "ns/control.h"
#include "ns/info.h"
#include "ns/node_ops.h"
#include "ns/ns_i.h"
#include "ns/tree.h"
#include "r3/get.h"
#include "r3/keyfile.h"
#include "r3/materialize.h"
#include "r3/object.h"
#include "r3/publish.h"
#include "r3/put.h"
#include "state/ids.h"
#include "trees/wtree.h"

/* h (opened on n with flags) is whole: registered (shutdown releases it)
 * and numbered for the kernel. 0, or -ENFILE (no number: h released). */
int files_handle_ready(struct tree *t, struct handle *h, struct node *n, int flags)
{
	handle_register(h);
	if (!ids_handle_bind(t, h, atomic_load(&n->id))) {
		handle_put(t, h);
		return -ENFILE;
	}
	struct held_handle *rec = ids_handle_record(t, h->fh);
	rec->flags = (uint16_t)(flags & O_ACCMODE);
	return 0;
}

/* A fresh object o (its creation reference becomes the kernel's on shown,
 * the node the create answers with) and its publish. */
static int begin_publish(struct tree *t, struct object *o, struct node *shown,
			 struct tree_entry *e, struct handle **h, struct open_reply *r)
{
	int rc = publish_begin(t, o, h);

	if (rc < 0) {
		node_unref(&o->node, 1);
		return rc;
	}
	r->direct_io = true; /* the bytes written are not the bytes read */
	rc = lookup_positive(t, shown, e);
	if (rc < 0) {
		publish_discard(*h);
		handle_put(t, *h);
		*h = NULL;
		return rc;
	}
	rc = files_handle_ready(t, *h, shown, O_WRONLY);
	if (rc < 0) {
		ids_node_forget(t, e->id, 1);
		*h = NULL;
	}
	return rc;
}

/* A .cache/ file: invisible to others until its close commits it. */
static int create_cache(struct tree *t, struct node *parent, const char *name, int flags,
			struct tree_entry *e, struct handle **h, struct open_reply *r)
{
	struct node *n;
	int rc = wtree_create(t, parent, name, flags, &n, h, r);

	if (rc < 0)
		return rc;
	rc = lookup_cache_positive(t, n, e);
	if (rc < 0) {
		handle_put(t, *h);
		*h = NULL;
		return rc;
	}
	rc = files_handle_ready(t, *h, n, O_WRONLY);
	if (rc < 0) {
		ids_node_forget(t, e->id, 1);
		*h = NULL;
		return rc;
	}
	wtree_handle_ready(t, *h);
	return 0;
}

int tree_create(struct tree *t, struct node *parent, const char *name, int flags,
		struct tree_entry *e, struct handle **h, struct open_reply *r)
{
	uint8_t hash[ARTFS_HASH_BYTES_MAX];
	size_t len;

	memset(e, 0, sizeof(*e));
	struct version *v;
	struct object *o;
	if (parent->type == NODE_STALE)
		return -ENOENT; /* gone: as a removed directory (node_ops.h) */
	if (parent->type == NODE_KEYS_DIR) {
		/* Publishing by key: the object has only its key until the same
		 * content is published by path. */
		if (strlen(name) != 64 || key_sha256_decode(name, hash) < 0) {
			log_warn("create .keys/%.200s: not a key (64 lowercase hex digits)", name);
			return -EINVAL;
		}
		len = 32;
		sizing_wait_for_key(t, hash);
		pthread_mutex_lock(&t->lock);
		bool held = index_key_find(&t->idx, hash) != NULL;
		pthread_mutex_unlock(&t->lock);
		if (held && (flags & O_EXCL))
			return -EEXIST;
		for (int attempt = 0;; attempt++) {
			int rc = version_keyonly(t, &v);
			if (rc < 0)
				return rc;
			o = object_new(v, hash, len);
			node_unref(&v->node, 1);
			if (!o)
				return -ENOMEM;
			rc = begin_publish(t, o, &o->keynode, e, h, r);
			/* ENOENT: the key-only version was collected meanwhile. */
			if (rc != -ENOENT || attempt == 2)
				return rc;
		}
	}
	if (parent->type == NODE_CACHE_DIR)
		return create_cache(t, parent, name, flags, e, h, r);
	if (parent->type != NODE_VERSION)
		return -EPERM; /* only R3 objects and .cache/ files can be created */
	v = (struct version *)parent;
	if (key_hash_decode(name, hash, &len) < 0) {
		log_warn("create %s/%.200s: not a block hash name "
			 "(2 to 128 lowercase hex digits, even length)", v->name, name);
		return -EINVAL;
	}
	o = version_object_find(t, v, hash, len);
	if (o) {
		node_unref(&o->node, 1);
		if (flags & O_EXCL)
			return -EEXIST;
	}
	/* Always a fresh node, even when the key is committed (a create that
	 * raced a commit): the writer's inode is never the readers' one, so
	 * its writes cannot change the size the kernel has for readers. */
	o = object_new(v, hash, len);
	if (!o)
		return -ENOMEM;
	return begin_publish(t, o, &o->node, e, h, r);
}

/* ---- opening each kind of file (the table: node_ops.c) ------------------- */

int files_open_info(struct tree *t, struct node *n, int flags, struct handle **h,
		    struct open_reply *r)
{
	if (n->sub == INFO_CONTROL)
		return (flags & O_ACCMODE) == O_WRONLY ? control_open(t, h, r) : -EACCES;
	if ((flags & O_ACCMODE) != O_RDONLY)
		return -EACCES;
	return info_open(t, (enum info_file)n->sub, h, r);
}

int files_open_object(struct tree *t, struct node *n, int flags, struct handle **h,
		      struct open_reply *r)
{
	struct object *o = (struct object *)n;

	if (o->state == OBJECT_REMOVED)
		return -ESTALE; /* unlinked since the lookup: the kernel looks again */
	if (o->state != OBJECT_COMMITTED)
		return -ENOENT;
	if ((flags & O_ACCMODE) != O_RDONLY) {
		/* A committed object's inode is never written: the kernel would
		 * grow the size its readers see while the writes go on (they
		 * read zeros past the .npy). Its mode is 0444; root is refused
		 * too. An idempotent re-publish goes through .put. */
		char name[ARTFS_HASH_HEX_MAX + 1];
		object_name(o, name);
		log_debug("open %s/%s for writing: refused, published objects are read-only",
			  o->ver->name, name);
		return -EACCES;
	}
	return object_open(t, o, h, r);
}

int files_open_materialize(struct tree *t, struct node *n, int flags, struct handle **h,
			   struct open_reply *r)
{
	struct version *v = version_of_materialize(n);

	(void)flags;
	if (v->removed)
		return -ENOENT;
	return materialize_open(t, v, h, r);
}

int files_open_key(struct tree *t, struct node *n, int flags, struct handle **h,
		   struct open_reply *r)
{
	struct object *o = object_of_key(n);

	if (o->state == OBJECT_REMOVED)
		return -ESTALE; /* removed, or moved to its name, since the lookup */
	if (o->state != OBJECT_COMMITTED)
		return -ENOENT;
	if ((flags & O_ACCMODE) != O_RDONLY)
		return -EACCES; /* as for objects: publish again through .keys/.put */
	return keys_open(t, o, h, r);
}

int files_open_put(struct tree *t, struct node *n, int flags, struct handle **h,
		   struct open_reply *r)
{
	struct version *v = n == &t->keys_put ? NULL : version_of_put(n);

	(void)flags;
	if (v && v->removed)
		return -ENOENT;
	return put_open(t, v, h, r);
}

int files_open_get(struct tree *t, struct node *n, int flags, struct handle **h,
		   struct open_reply *r)
{
	(void)n;
	(void)flags;
	return get_open(t, h, r);
}

/* .blocks/.put and .blocks/.get (src/trees/). */
int files_open_blocks_batch(struct tree *t, struct node *n, int flags, struct handle **h,
			    struct open_reply *r)
{
	(void)flags;
	if (!t->blocks)
		return -ENOENT;
	return n == &t->blocks_put ? wblocks_put_open(t, h, r) : wblocks_get_open(t, h, r);
}

/* ---- the tree's calls ------------------------------------------------------- */

int files_open_node(struct tree *t, struct node *n, int flags, struct handle **h,
		    struct open_reply *r)
{
	const struct node_ops *ops = node_ops_of(n->type);

	if (ops->open)
		return ops->open(t, n, flags, h, r);
	return ops->lookup ? -EISDIR : -ENOENT; /* a directory; else no file */
}

int tree_open_file(struct tree *t, struct node *n, int flags, struct handle **h,
		   struct open_reply *r)
{
	int rc = files_open_node(t, n, flags, h, r);

	return rc < 0 ? rc : files_handle_ready(t, *h, n, flags);
}

int files_open_cache(struct tree *t, struct node *n, int flags, struct handle **h,
		     struct open_reply *r)
{
	return wtree_open_file(t, n, flags, h, r);
}

int files_open_stale(struct tree *t, struct node *n, int flags, struct handle **h,
		     struct open_reply *r)
{
	(void)t, (void)n, (void)flags, (void)h, (void)r;
	return -ENOENT;
}
