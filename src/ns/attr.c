/* SPDX-License-Identifier: Apache-2.0 */
/* Attributes: what getattr, setattr and statfs answer for each kind of
 * node, and the extended attributes of committed objects. */
#include "autoconf.h"

#include <errno.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ns/info.h"
#include "ns/node_ops.h"
#include "ns/ns_i.h"
#include "ns/tree.h"
#include "r3/object.h"
#include "state/ids.h"
#include "trees/wtree.h"

#define DIR_ATTR_TIMEOUT 1.0  /* version mtimes move with activity */
/* The writer's own view of a file being published: the kernel tracks its
 * size on write; a lookup after commit brings the committed attributes. */
#define UPLOAD_ATTR_TIMEOUT 1.0

static void stat_common(struct tree *t, struct node *n, struct stat *st, mode_t mode)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = node_id(t, n);
	st->st_mode = (mode & S_IFMT) | (mode & 07777 & ~t->cfg->umask);
	st->st_nlink = S_ISDIR(mode) ? 2 : 1;
	st->st_uid = t->cfg->uid;
	st->st_gid = t->cfg->gid;
	st->st_blksize = 128 * 1024;
	st->st_atim.tv_sec = st->st_mtim.tv_sec = st->st_ctim.tv_sec = t->started;
}

void tree_object_stat(struct tree *t, struct object *o, struct stat *st)
{
	bool committed = o->state != OBJECT_PUBLISHING;
	uint64_t size = committed ? atomic_load(&o->npy_size) : atomic_load(&o->file_size);
	uint64_t ns = atomic_load(&o->ctime_ns);

	stat_common(t, &o->node, st, S_IFREG | (committed ? 0444 : 0644));
	st->st_size = (off_t)size;
	st->st_blocks = (blkcnt_t)((size + 511) / 512);
	if (committed) {
		st->st_mtim.tv_sec = st->st_ctim.tv_sec = st->st_atim.tv_sec = (time_t)(ns / 1000000000u);
		st->st_mtim.tv_nsec = st->st_ctim.tv_nsec = st->st_atim.tv_nsec = (long)(ns % 1000000000u);
	} else {
		st->st_mtim.tv_sec = st->st_ctim.tv_sec = st->st_atim.tv_sec = clock_now();
	}
}

/* A per-open transaction file that reads (.materialize, .get): any user
 * who may enter its directory may use it, whatever umask=. */
static void transaction_stat(struct tree *t, struct node *n, struct stat *st)
{
	stat_common(t, n, st, S_IFREG);
	st->st_mode = S_IFREG | 0666;
}

/* A batch publish (.put): writable by whoever may create objects in its
 * directory (0666 & ~umask=, as the directory's 0777 & ~umask=). */
static void put_stat(struct tree *t, struct node *n, struct stat *st)
{
	stat_common(t, n, st, S_IFREG | 0666);
}

static void version_stat(struct tree *t, struct version *v, struct stat *st)
{
	stat_common(t, &v->node, st, S_IFDIR | 0777);
	st->st_mtim.tv_sec = st->st_atim.tv_sec = atomic_load(&v->last_active);
	st->st_ctim.tv_sec = v->created;
}

/* ---- each kind's attributes (the table: node_ops.c) ---------------------- */

/* A key's file is the envelope as published: its size is the store file's. */
int attr_key(struct tree *t, struct node *n, struct stat *st, double *timeout)
{
	struct object *o = object_of_key(n);
	uint64_t size = atomic_load(&o->file_size);

	if (o->state == OBJECT_COMMITTED) {
		int rc = object_envelope_size(t, o, &size);
		if (rc < 0)
			return rc;
	}
	tree_object_stat(t, o, st);
	st->st_ino = node_id(t, n);
	st->st_size = (off_t)size;
	st->st_blocks = (blkcnt_t)((size + 511) / 512);
	if (o->state == OBJECT_PUBLISHING)
		*timeout = UPLOAD_ATTR_TIMEOUT;
	return 0;
}

int attr_root(struct tree *t, struct node *n, struct stat *st, double *timeout)
{
	stat_common(t, n, st, S_IFDIR | 0777);
	*timeout = DIR_ATTR_TIMEOUT;
	return 0;
}

int attr_info_dir(struct tree *t, struct node *n, struct stat *st, double *timeout)
{
	(void)timeout;
	stat_common(t, n, st, S_IFDIR | 0555);
	return 0;
}

int attr_info_file(struct tree *t, struct node *n, struct stat *st, double *timeout)
{
	stat_common(t, n, st, S_IFREG | (n->sub == INFO_CONTROL ? 0200 : 0444));
	if (n->sub == INFO_CONTROL) { /* the mount's owner's, whatever uid=/gid= show */
		st->st_uid = getuid();
		st->st_gid = getgid();
	}
	*timeout = 0;
	return 0;
}

int attr_socket(struct tree *t, struct node *n, struct stat *st, double *timeout)
{
	/* Any user may connect: what it gives needs a token. */
	stat_common(t, n, st, S_IFSOCK | 0666);
	st->st_mode = S_IFSOCK | 0666; /* whatever umask= says */
	*timeout = DIR_ATTR_TIMEOUT;
	return 0;
}

int attr_version(struct tree *t, struct node *n, struct stat *st, double *timeout)
{
	struct version *v = (struct version *)n;

	if (v->removed)
		return -ENOENT;
	version_stat(t, v, st);
	*timeout = DIR_ATTR_TIMEOUT;
	return 0;
}

int attr_materialize(struct tree *t, struct node *n, struct stat *st, double *timeout)
{
	(void)timeout;
	if (version_of_materialize(n)->removed)
		return -ENOENT;
	transaction_stat(t, n, st);
	return 0;
}

int attr_put(struct tree *t, struct node *n, struct stat *st, double *timeout)
{
	(void)timeout;
	if (n != &t->keys_put && version_of_put(n)->removed)
		return -ENOENT;
	put_stat(t, n, st);
	return 0;
}

int attr_get(struct tree *t, struct node *n, struct stat *st, double *timeout)
{
	(void)timeout;
	transaction_stat(t, n, st);
	return 0;
}

/* .blocks/.put publishes (who may create files, as .keys/.put); .blocks/.get
 * only reads (every user, as .keys/.get). */
int attr_blocks_batch(struct tree *t, struct node *n, struct stat *st, double *timeout)
{
	(void)timeout;
	if (n == &t->blocks_put)
		put_stat(t, n, st);
	else
		transaction_stat(t, n, st);
	return 0;
}

int attr_keys_dir(struct tree *t, struct node *n, struct stat *st, double *timeout)
{
	stat_common(t, n, st, S_IFDIR | 0777);
	*timeout = DIR_ATTR_TIMEOUT;
	return 0;
}

int attr_object(struct tree *t, struct node *n, struct stat *st, double *timeout)
{
	struct object *o = (struct object *)n;

	if (o->state == OBJECT_COMMITTED) {
		int rc = object_know_size(t, o);
		if (rc < 0)
			return rc;
	}
	tree_object_stat(t, o, st);
	if (o->state == OBJECT_PUBLISHING)
		*timeout = UPLOAD_ATTR_TIMEOUT;
	return 0;
}

/* ---- the tree's calls ------------------------------------------------------- */

int tree_getattr(struct tree *t, struct node *n, struct stat *st, double *timeout)
{
	const struct node_ops *ops = node_ops_of(n->type);

	*timeout = CACHE_FOREVER;
	return ops->getattr ? ops->getattr(t, n, st, timeout) : -ENOENT;
}

int tree_setattr(struct tree *t, struct node *n, unsigned to_set, const struct stat *in,
		 struct stat *out, double *timeout)
{
	bool command_file = n->type == NODE_MATERIALIZE || n->type == NODE_PUT ||
			    n->type == NODE_GET || n->type == NODE_BLOCKS_PUT ||
			    n->type == NODE_BLOCKS_GET ||
			    (n->type == NODE_INFO_FILE && n->sub == INFO_CONTROL);
	if (command_file && to_set == TREE_SET_SIZE && in->st_size == 0)
		return tree_getattr(t, n, out, timeout); /* open(O_TRUNC): nothing to cut */
	if (n->type == NODE_CACHE_DIR || n->type == NODE_CACHE_FILE) {
		uint64_t size = (uint64_t)in->st_size;
		int rc = wtree_setattr(t, n, to_set & (TREE_SET_MODE | TREE_SET_UID | TREE_SET_GID),
				       to_set & TREE_SET_SIZE ? &size : NULL);
		return rc < 0 ? rc : tree_getattr(t, n, out, timeout);
	}
	if (n->type != NODE_OBJECT && n->type != NODE_KEY)
		return -EPERM;
	struct object *o = n->type == NODE_KEY ? object_of_key(n) : (struct object *)n;
	if (to_set & (TREE_SET_MODE | TREE_SET_UID | TREE_SET_GID))
		return -EPERM;
	if (to_set & TREE_SET_SIZE) {
		/* Objects are immutable. open(O_TRUNC) of a committed object (a
		 * re-publish) arrives here as a truncation to 0: accepted and
		 * ignored, so readers never see it shrink. */
		uint64_t now = o->state == OBJECT_PUBLISHING ? atomic_load(&o->file_size) : 0;
		if ((uint64_t)in->st_size != now)
			return -EPERM;
	}
	if ((to_set & (TREE_SET_ATIME | TREE_SET_MTIME)) && o->state != OBJECT_PUBLISHING)
		return -EPERM;
	return tree_getattr(t, n, out, timeout);
}

int tree_statfs(struct tree *t, struct statvfs *sv)
{
	const unsigned long bsize = 4096;

	memset(sv, 0, sizeof(*sv));
	pthread_mutex_lock(&t->lock);
	uint64_t used = t->bytes_used + t->bytes_reserved, objects = t->objects;
	pthread_mutex_unlock(&t->lock);
	uint64_t cap = t->cfg->capacity;
	sv->f_bsize = sv->f_frsize = bsize;
	sv->f_blocks = cap / bsize;
	sv->f_bfree = sv->f_bavail = used >= cap ? 0 : (cap - used) / bsize;
	sv->f_files = objects + sv->f_bfree;
	sv->f_ffree = sv->f_favail = sv->f_bfree;
	sv->f_namemax = ARTFS_HASH_HEX_MAX;
	return 0;
}

/* ---- extended attributes ------------------------------------------------- */

int tree_getxattr(struct tree *t, struct node *n, const char *name, char *buf, size_t cap,
		  size_t *len)
{
	if (n->type == NODE_KEY)
		n = &object_of_key(n)->node;
	if (n->type != NODE_OBJECT || ((struct object *)n)->state != OBJECT_COMMITTED)
		return -ENODATA;
	return object_getxattr(t, (struct object *)n, name, buf, cap, len);
}

int tree_listxattr(struct tree *t, struct node *n, char *buf, size_t cap, size_t *len)
{
	(void)t;
	if (n->type == NODE_KEY)
		n = &object_of_key(n)->node;
	if (n->type != NODE_OBJECT || ((struct object *)n)->state != OBJECT_COMMITTED) {
		*len = 0;
		return 0;
	}
	return object_listxattr(buf, cap, len);
}

int attr_cache(struct tree *t, struct node *n, struct stat *st, double *timeout)
{
	return wtree_getattr(t, n, st, timeout);
}
