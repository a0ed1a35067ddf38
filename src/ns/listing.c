/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "format/key.h"
#include "ns/info.h"
#include "ns/listing.h"
#include "ns/node_ops.h"
#include "state/ids.h"
#include "trees/wtree.h"
#include "weights/weights.h"

struct slot {
	uint64_t ino;
	size_t name_off;
	unsigned char type;
};

struct listing {
	struct handle h;
	struct tree *t;
	struct slot *slots;
	size_t count, cap;
	char *names;
	size_t names_len, names_cap;
	int error;
};

static void add(struct listing *l, const char *name, uint64_t ino, unsigned char type)
{
	size_t n = strlen(name) + 1;

	if (l->error)
		return;
	if (l->count == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 64;
		struct slot *s = realloc(l->slots, cap * sizeof(*s));
		if (!s) {
			l->error = -ENOMEM;
			return;
		}
		l->slots = s;
		l->cap = cap;
	}
	if (l->names_len + n > l->names_cap) {
		size_t cap = l->names_cap ? l->names_cap * 2 : 4096;
		while (cap < l->names_len + n)
			cap *= 2;
		char *s = realloc(l->names, cap);
		if (!s) {
			l->error = -ENOMEM;
			return;
		}
		l->names = s;
		l->names_cap = cap;
	}
	memcpy(l->names + l->names_len, name, n);
	l->slots[l->count++] = (struct slot){ ino, l->names_len, type };
	l->names_len += n;
}

static void add_named(void *ctx, const char *name, uint64_t ino, unsigned char type)
{
	add(ctx, name, ino, type);
}

static void add_version(void *ctx, struct version *v)
{
	struct listing *l = ctx;

	if (!v->keyonly) /* its objects are listed under .keys */
		add(l, v->name, node_id(l->t, &v->node), DT_DIR);
}

static void add_key(void *ctx, struct object *o)
{
	struct listing *l = ctx;
	char name[65];

	key_hex(o->key, 32, name);
	add(l, name, node_id(l->t, &o->keynode), DT_REG);
}

static void add_object(void *ctx, struct object *o)
{
	struct listing *l = ctx;
	char name[ARTFS_HASH_HEX_MAX + 1];

	object_name(o, name);
	add(l, name, node_id(l->t, &o->node), DT_REG);
}

static int by_name(const void *a, const void *b, void *names)
{
	return strcmp((const char *)names + ((const struct slot *)a)->name_off,
		      (const char *)names + ((const struct slot *)b)->name_off);
}

/* ---- the names in each kind of directory (the table: node_ops.c) -------- */

void listing_root(struct tree *t, struct node *dir, struct listing *l)
{
	(void)dir;
	add(l, ARTFS_INFO_DIR, node_id(t, &t->info_dir), DT_DIR);
	add(l, ARTFS_KEYS_DIR, node_id(t, &t->keys_dir), DT_DIR);
	if (t->cache) {
		struct node *cache = wtree_root(t->cache);
		add(l, WTREE_MOUNT_NAME, node_id(t, cache), DT_DIR);
		node_unref(cache, 1);
	}
	if (t->blocks) {
		struct node *blocks = wtree_root(t->blocks);
		add(l, WBLOCKS_MOUNT_NAME, node_id(t, blocks), DT_DIR);
		node_unref(blocks, 1);
	}
	pthread_mutex_lock(&t->lock);
	index_each_version(&t->idx, add_version, l);
	pthread_mutex_unlock(&t->lock);
}

void listing_info_dir(struct tree *t, struct node *dir, struct listing *l)
{
	(void)dir;
	for (int i = 0; i < INFO_COUNT; i++)
		add(l, info_file_name((enum info_file)i), node_id(t, &t->info_files[i]), DT_REG);
	if (atomic_load(&t->attach_bound))
		add(l, ARTFS_ATTACH_SOCKET, node_id(t, &t->attach_node), DT_SOCK);
}

void listing_version(struct tree *t, struct node *dir, struct listing *l)
{
	struct version *v = (struct version *)dir;

	version_listed_wait(t, v);
	pthread_mutex_lock(&t->lock);
	if (!v->removed)
		index_each_object(v, add_object, l);
	if (v->weights) {
		struct node *wd = weights_dir_node(v->weights);
		add(l, "weights", node_id(t, wd), DT_DIR);
	}
	pthread_mutex_unlock(&t->lock);
}

void listing_weights_dir(struct tree *t, struct node *dir, struct listing *l)
{
	weights_list(t, dir, add_named, l);
}

/* Every key (.put and .get are not listed, like .materialize). */
void listing_keys_dir(struct tree *t, struct node *dir, struct listing *l)
{
	(void)dir;
	if (t->sizing)
		sizing_wait(t);
	pthread_mutex_lock(&t->lock);
	index_each_key(&t->idx, add_key, l);
	pthread_mutex_unlock(&t->lock);
}

/* ---- the listing handle ----------------------------------------------------- */

/* The entries after "." and ".." in the order of their names: the same
 * listing in the same order in any daemon, so that a daemon that takes
 * over goes on from the offset the kernel reached (hash tables are seeded
 * per daemon). */
static void sort_names(struct listing *l)
{
	if (l->count > 3)
		qsort_r(l->slots + 2, l->count - 2, sizeof(*l->slots), by_name, l->names);
}

static const struct handle_ops listing_ops;
static void listing_release(struct tree *t, struct handle *h);

int listing_open(struct tree *t, struct node *dir, struct handle **h)
{
	struct listing *l = calloc(1, sizeof(*l));

	if (!l)
		return -ENOMEM;
	handle_init(&l->h, &listing_ops);
	l->t = t;
	add(l, ".", node_id(t, dir), DT_DIR);
	add(l, "..", 1, DT_DIR);
	const struct node_ops *ops = node_ops_of(dir->type);
	if (ops->list)
		ops->list(t, dir, l);
	else
		l->error = -ENOTDIR;
	if (l->error) {
		int rc = l->error;
		listing_release(t, &l->h);
		return rc;
	}
	sort_names(l);
	*h = &l->h;
	return 0;
}

static int listing_entry(struct tree *t, struct handle *h, size_t i, struct dir_entry *de)
{
	struct listing *l = (struct listing *)h;

	(void)t;
	if (i >= l->count)
		return -ENOENT;
	de->name = l->names + l->slots[i].name_off;
	de->ino = l->slots[i].ino;
	de->type = l->slots[i].type;
	return 0;
}

static void listing_release(struct tree *t, struct handle *h)
{
	struct listing *l = (struct listing *)h;

	(void)t;
	free(l->slots);
	free(l->names);
	free(l);
}

static const struct handle_ops listing_ops = {
	.kind = "listing",
	.held_kind = HANDLE_LISTING,
	.readdir = listing_entry,
	.release = listing_release,
};

void listing_cache_dir(struct tree *t, struct node *dir, struct listing *l)
{
	if (wtree_is_blocks_root(dir)) {
		add(l, ".put", node_id(t, &t->blocks_put), DT_REG);
		add(l, ".get", node_id(t, &t->blocks_get), DT_REG);
	}
	wtree_list(t, dir, add_named, l);
}

void listing_stale(struct tree *t, struct node *dir, struct listing *l)
{
	(void)t, (void)dir;
	l->error = -ENOENT;
}
