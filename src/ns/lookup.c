/* SPDX-License-Identifier: Apache-2.0 */
/* Lookups: the node a name in a directory stands for (asking the cluster
 * for one not here, with remote=), how long the kernel may keep the answer,
 * and the nodes of the kernel's ids. */
#include "autoconf.h"

#include <errno.h>
#include <string.h>

#include "format/key.h"
#include "ns/info.h"
#include "ns/node_ops.h"
#include "ns/ns_i.h"
#include "ns/revive.h"
#include "ns/tree.h"
#include "r3/fetch.h"
#include "trees/wtree.h"
#include "state/ids.h"
#include "weights/weights.h"

static int negative(struct tree_entry *e, double timeout)
{
	e->node = NULL;
	e->entry_timeout = timeout;
	return -ENOENT;
}

int lookup_positive(struct tree *t, struct node *n, struct tree_entry *e)
{
	double timeout;
	uint64_t id = ids_node_ref(t, n);

	if (!id) {
		node_unref(n, 1);
		return -ENOMEM;
	}
	int rc = tree_getattr(t, n, &e->st, &timeout);
	if (rc < 0) {
		ids_node_forget(t, id, 1); /* the reference taken for the kernel goes too */
		return rc;
	}
	e->node = n;
	e->id = id;
	e->attr_timeout = timeout;
	bool publishing = (n->type == NODE_OBJECT &&
			   ((struct object *)n)->state == OBJECT_PUBLISHING) ||
			  (n->type == NODE_KEY && object_of_key(n)->state == OBJECT_PUBLISHING);
	e->entry_timeout = publishing ? 0 : CACHE_FOREVER;
	return 0;
}

#define CACHE_ENTRY_TIMEOUT 1.0

int lookup_cache_positive(struct tree *t, struct node *n, struct tree_entry *e)
{
	int rc = lookup_positive(t, n, e);

	if (rc == 0)
		e->entry_timeout = wtree_pending(n) ? 0 : CACHE_ENTRY_TIMEOUT;
	return rc;
}

static struct object *find_object(struct tree *t, struct version *v, const uint8_t *hash,
				  size_t len)
{
	return version_object_find(t, v, hash, len);
}

/* The object of a key, referenced through its key node. */
static struct object *find_key(struct tree *t, const uint8_t key[32])
{
	pthread_mutex_lock(&t->lock);
	struct object *o = index_key_find(&t->idx, key);
	if (o)
		node_ref(&o->keynode);
	pthread_mutex_unlock(&t->lock);
	return o;
}

/* ---- each kind of directory (the table: node_ops.c) --------------------- */

int lookup_in_root(struct tree *t, struct node *dir, const char *name, struct tree_entry *e)
{
	(void)dir;
	if (strcmp(name, ARTFS_INFO_DIR) == 0) {
		node_ref(&t->info_dir);
		return lookup_positive(t, &t->info_dir, e);
	}
	if (strcmp(name, ARTFS_KEYS_DIR) == 0) {
		node_ref(&t->keys_dir);
		return lookup_positive(t, &t->keys_dir, e);
	}
	if (strcmp(name, WTREE_MOUNT_NAME) == 0 && t->cache)
		return lookup_positive(t, wtree_root(t->cache), e);
	if (strcmp(name, WBLOCKS_MOUNT_NAME) == 0 && t->blocks)
		return lookup_positive(t, wtree_root(t->blocks), e);
	if (!key_version_name_valid(name))
		return negative(e, CACHE_FOREVER); /* can never exist */
	struct version *v = version_find(t, name);
	if (!v && t->remote) {
		/* With a cluster every version exists: a trainer opens
		 * <wv>/<hash> on a node that never saw <wv>. */
		int rc = version_make(t, name, &v);
		if (rc < 0 && rc != -EEXIST)
			return rc;
	}
	return v ? lookup_positive(t, &v->node, e) : negative(e, 0);
}

int lookup_in_info_dir(struct tree *t, struct node *dir, const char *name, struct tree_entry *e)
{
	(void)dir;
	for (int i = 0; i < INFO_COUNT; i++)
		if (strcmp(name, info_file_name((enum info_file)i)) == 0) {
			node_ref(&t->info_files[i]);
			return lookup_positive(t, &t->info_files[i], e);
		}
	if (strcmp(name, ARTFS_ATTACH_SOCKET) == 0) {
		if (!atomic_load(&t->attach_bound))
			return negative(e, 0); /* the daemon binds it once it serves */
		node_ref(&t->attach_node);
		return lookup_positive(t, &t->attach_node, e);
	}
	return negative(e, CACHE_FOREVER);
}

/* <wv>/weights appears and goes through the control file, not through the
 * kernel: its absence is never cached. */
static int lookup_weights_dir(struct tree *t, struct version *v, struct tree_entry *e)
{
	pthread_mutex_lock(&t->lock);
	struct node *wd = v->weights ? weights_dir_node(v->weights) : NULL;
	if (wd)
		node_ref(wd);
	pthread_mutex_unlock(&t->lock);
	return wd ? lookup_positive(t, wd, e) : negative(e, 0);
}

/* The absence of an object is never cached: a batch (.put) names objects
 * behind the kernel's back, and an absence cached before it would hide the
 * object after the batch returned. */
static int lookup_object(struct tree *t, struct version *v, const char *name,
			 struct tree_entry *e)
{
	uint8_t hash[ARTFS_HASH_BYTES_MAX];
	size_t len;

	if (key_hash_decode(name, hash, &len) < 0)
		return negative(e, CACHE_FOREVER);
	struct object *o = find_object(t, v, hash, len);
	if (o)
		return lookup_positive(t, &o->node, e);
	if (!t->remote)
		return negative(e, 0);
	/* Not here: asked of the cluster, and never cached as absent. */
	struct fetch_item it = { .ver = v, .hash = hash, .hash_len = len };
	int rc = fetch_objects(t, &it, 1);
	if (rc == -ENOENT)
		return negative(e, 0);
	if (rc < 0)
		return rc;
	o = find_object(t, v, hash, len);
	return o ? lookup_positive(t, &o->node, e) : negative(e, 0);
}

int lookup_in_version(struct tree *t, struct node *dir, const char *name, struct tree_entry *e)
{
	struct version *v = (struct version *)dir;

	if (v->removed)
		return negative(e, 0);
	if (strcmp(name, ARTFS_MATERIALIZE_NAME) == 0) {
		node_ref(&v->materialize);
		return lookup_positive(t, &v->materialize, e);
	}
	if (strcmp(name, ARTFS_PUT_NAME) == 0) {
		node_ref(&v->put);
		return lookup_positive(t, &v->put, e);
	}
	if (strcmp(name, "weights") == 0)
		return lookup_weights_dir(t, v, e);
	return lookup_object(t, v, name, e);
}

/* A key's object may come from a publish under any name: its absence is
 * never cached. Keys of a restarted store are known once its objects are
 * counted. */
static int lookup_key(struct tree *t, const char *name, struct tree_entry *e)
{
	uint8_t key[32];
	if (strlen(name) != 64 || key_sha256_decode(name, key) < 0)
		return negative(e, CACHE_FOREVER);
	sizing_wait_for_key(t, key);
	struct object *o = find_key(t, key);
	if (!o && t->remote) {
		struct version *kv;
		int rc = version_keyonly(t, &kv);
		if (rc < 0)
			return rc;
		struct fetch_item it = { .ver = kv, .hash = key, .hash_len = 32 };
		rc = fetch_objects(t, &it, 1);
		node_unref(&kv->node, 1);
		if (rc < 0 && rc != -ENOENT)
			return rc;
		o = find_key(t, key);
	}
	return o ? lookup_positive(t, &o->keynode, e) : negative(e, 0);
}

int lookup_in_keys_dir(struct tree *t, struct node *dir, const char *name, struct tree_entry *e)
{
	(void)dir;
	if (strcmp(name, ARTFS_PUT_NAME) == 0) {
		node_ref(&t->keys_put);
		return lookup_positive(t, &t->keys_put, e);
	}
	if (strcmp(name, ARTFS_GET_NAME) == 0) {
		node_ref(&t->keys_get);
		return lookup_positive(t, &t->keys_get, e);
	}
	return lookup_key(t, name, e);
}

int lookup_in_weights_dir(struct tree *t, struct node *dir, const char *name,
			  struct tree_entry *e)
{
	struct node *n;
	int rc = weights_lookup(t, dir, name, &n);
	if (rc < 0)
		return negative(e, 0);
	rc = lookup_positive(t, n, e);
	e->entry_timeout = 1.0; /* manifest.json appears when ready */
	return rc;
}

/* ---- the tree's calls ------------------------------------------------------- */

int tree_lookup(struct tree *t, struct node *parent, const char *name, struct tree_entry *e)
{
	const struct node_ops *ops = node_ops_of(parent->type);

	memset(e, 0, sizeof(*e));
	return ops->lookup ? ops->lookup(t, parent, name, e) : -ENOTDIR;
}

void tree_forget(struct tree *t, uint64_t id, uint64_t nlookup)
{
	ids_node_forget(t, id, nlookup);
}

struct node *tree_node(struct tree *t, uint64_t id)
{
	struct node *n = ids_node(t, id);

	return n ? n : revive_node(t, id);
}

/* A name a process may create any moment: the kernel keeps no negative entry. */
int lookup_in_cache_dir(struct tree *t, struct node *dir, const char *name, struct tree_entry *e)
{
	struct node *n;

	if (wtree_is_blocks_root(dir) && (strcmp(name, ".put") == 0 || strcmp(name, ".get") == 0)) {
		n = name[1] == 'p' ? &t->blocks_put : &t->blocks_get;
		node_ref(n);
		return lookup_positive(t, n, e);
	}
	int rc = wtree_lookup(t, dir, name, &n);

	if (rc == -ENOENT)
		return negative(e, 0);
	return rc < 0 ? rc : lookup_cache_positive(t, n, e);
}

int lookup_in_stale(struct tree *t, struct node *dir, const char *name, struct tree_entry *e)
{
	(void)t, (void)dir, (void)name, (void)e;
	return -ENOENT;
}
