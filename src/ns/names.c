/* SPDX-License-Identifier: Apache-2.0 */
/* Names made and removed: mkdir of a version (or of its empty weights/),
 * the daemon's own mknod and unlink of .artfs/attach, rmdir of an empty
 * version, unlink of an object under both its names, and what the .cache/
 * tree does with names (src/trees/: there alone renames are allowed). */
#include "autoconf.h"

#include <errno.h>
#include <string.h>

#include "format/key.h"
#include "lib/log.h"
#include "ns/ns_i.h"
#include "ns/tree.h"
#include "trees/wtree.h"
#include "weights/weights.h"

int tree_mknod(struct tree *t, struct node *parent, const char *name, mode_t mode, bool by_self,
	       struct tree_entry *e)
{
	memset(e, 0, sizeof(*e));
	if (parent->type != NODE_INFO_DIR || strcmp(name, ARTFS_ATTACH_SOCKET) != 0 ||
	    !S_ISSOCK(mode) || !by_self)
		return -EPERM;
	atomic_store(&t->attach_bound, true);
	node_ref(&t->attach_node);
	return lookup_positive(t, &t->attach_node, e);
}

int tree_mkdir(struct tree *t, struct node *parent, const char *name, struct tree_entry *e)
{
	struct version *v;

	if (parent->type == NODE_STALE)
		return -ENOENT; /* gone: as a removed directory (node_ops.h) */
	if (parent->type == NODE_CACHE_DIR) {
		struct node *n;
		int rc = wtree_mkdir(t, parent, name, &n);
		return rc < 0 ? rc : lookup_cache_positive(t, n, e);
	}

	if (parent->type == NODE_VERSION && strcmp(name, "weights") == 0) {
		/* An empty weights/ for a GPU-direct publish (weights.c). */
		struct node *wd;
		int rc = ((struct version *)parent)->removed ? -ENOENT
			 : weights_mkdir(t, (struct version *)parent, &wd);
		return rc < 0 ? rc : lookup_positive(t, wd, e);
	}
	if (parent->type != NODE_ROOT)
		return -EPERM;
	int rc = version_make(t, name, &v);
	if (rc == -EEXIST)
		node_unref(&v->node, 1);
	if (rc < 0)
		return rc;
	return lookup_positive(t, &v->node, e); /* our creation reference becomes the kernel's */
}

int tree_rmdir(struct tree *t, struct node *parent, const char *name)
{
	if (parent->type == NODE_STALE)
		return -ENOENT;
	if (parent->type == NODE_CACHE_DIR)
		return wtree_rmdir(t, parent, name);
	if (parent->type != NODE_ROOT)
		return parent->type == NODE_VERSION ? -ENOENT : -EPERM;
	if (strcmp(name, ARTFS_INFO_DIR) == 0 || strcmp(name, ARTFS_KEYS_DIR) == 0 ||
	    strcmp(name, WTREE_MOUNT_NAME) == 0)
		return -EPERM;
	int rc = 0;
	bool stray = false;
	struct version *listed = version_find(t, name);
	if (listed) { /* its objects counted first (a daemon that took over) */
		version_listed_wait(t, listed);
		node_unref(&listed->node, 1);
	}
	pthread_mutex_lock(&t->lock);
	struct version *v = index_version_find(&t->idx, name);
	if (!v)
		rc = -ENOENT;
	else if (v->objects.count || v->publishing)
		rc = -ENOTEMPTY;
	else if (v->weights)
		rc = -EBUSY; /* unload its weights first */
	else {
		rc = store_version_remove(&t->store, name);
		if (rc == 0)
			index_version_remove(&t->idx, v);
		stray = rc == -ENOTEMPTY;
	}
	pthread_mutex_unlock(&t->lock);
	if (stray)
		log_err("rmdir %s: its store directory holds files artfs did not index", name);
	if (rc == 0) {
		counter_inc(&t->metrics.versions_removed);
		log_info("rmdir %s: version removed", name);
	}
	return rc;
}

/* Removes a committed object under both its names (the administrator's
 * clean-up): found by its name in v, or (v NULL) by its key. */
static int remove_object(struct tree *t, struct version *v, const uint8_t *hash, size_t len,
			 const uint8_t *key)
{
	char name[ARTFS_HASH_HEX_MAX + 1];
	int rc = 0;
	uint64_t bytes = 0;
	uint8_t derived[32];

	if (v) { /* the key this name must carry chooses the commit lock */
		version_object_key_bin(v, hash, len, derived);
		key = derived;
		version_probe(t, v, hash, len);
	}
	pthread_mutex_t *commit_lock = commit_lock_of(t, key);
	pthread_mutex_lock(commit_lock);
	pthread_mutex_lock(&t->lock);
	struct object *o = v ? index_object_find(&t->idx, v, hash, len) : index_key_find(&t->idx, key);
	if (!o)
		rc = -ENOENT;
	else {
		struct stat st;
		v = o->ver;
		object_name(o, name);
		bytes = atomic_load(&o->file_size);
		if (bytes == OBJECT_SIZE_UNKNOWN) { /* found at start, not sized yet */
			bytes = store_object_stat(v->dirfd, v->keyonly, name, &st) == 0
					? (uint64_t)st.st_size : 0;
			sizing_counted_locked(t, v, bytes);
		}
		rc = store_object_remove(v->dirfd, v->keyonly, name);
		if (!atomic_load(&v->listed))
			v->unlisted_removals++;
		if (rc == 0 || rc == -ENOENT) {
			t->bytes_used -= bytes;
			t->objects--;
			v->bytes -= bytes;
			index_object_remove(&t->idx, v, o);
			rc = 0;
		}
	}
	pthread_mutex_unlock(&t->lock);
	pthread_mutex_unlock(commit_lock);
	if (rc == 0) {
		counter_inc(&t->metrics.unlinks);
		log_debug("unlink %s/%s: object removed (%llu bytes)", v->name, name,
			  (unsigned long long)bytes);
	} else if (rc != -ENOENT) {
		log_err("unlink %s/%s: %s", v->name, name, strerror(-rc));
		rc = -EIO;
	}
	return rc;
}

int tree_unlink(struct tree *t, struct node *parent, const char *name, bool by_self)
{
	uint8_t hash[ARTFS_HASH_BYTES_MAX];
	size_t len;

	if (parent->type == NODE_STALE)
		return -ENOENT;
	if (parent->type == NODE_CACHE_DIR)
		return wtree_unlink(t, parent, name);
	if (parent->type == NODE_INFO_DIR) {
		if (strcmp(name, ARTFS_ATTACH_SOCKET) != 0 || !by_self)
			return -EPERM;
		atomic_store(&t->attach_bound, false); /* to be bound again */
		return 0;
	}

	if (parent->type == NODE_KEYS_DIR) {
		if (strlen(name) != 64 || key_sha256_decode(name, hash) < 0)
			return strcmp(name, ARTFS_PUT_NAME) && strcmp(name, ARTFS_GET_NAME) ? -ENOENT
											     : -EPERM;
		sizing_wait_for_key(t, hash);
		return remove_object(t, NULL, NULL, 0, hash);
	}
	if (parent->type != NODE_VERSION)
		return parent->type == NODE_ROOT ? -EISDIR : -EPERM;
	struct version *v = (struct version *)parent;
	if (strcmp(name, ARTFS_MATERIALIZE_NAME) == 0 || strcmp(name, ARTFS_PUT_NAME) == 0)
		return -EPERM;
	if (key_hash_decode(name, hash, &len) < 0)
		return -ENOENT;
	return remove_object(t, v, hash, len, NULL);
}

int tree_rename(struct tree *t, struct node *from_dir, const char *from, struct node *to_dir,
		const char *to, unsigned flags)
{
	if (from_dir->type == NODE_STALE || to_dir->type == NODE_STALE)
		return -ENOENT;
	if (from_dir->type == NODE_CACHE_DIR && to_dir->type == NODE_CACHE_DIR)
		return wtree_rename(t, from_dir, from, to_dir, to, flags);
	/* R3 objects and weights keep their names; a tree's entries stay in it. */
	return from_dir->type == NODE_CACHE_DIR || to_dir->type == NODE_CACHE_DIR ? -EXDEV : -EPERM;
}
