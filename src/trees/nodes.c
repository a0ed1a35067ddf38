/* SPDX-License-Identifier: Apache-2.0 */
/* The nodes of a write-once tree in memory: each directory's entries by
 * name, every node by its store inode number (what the next daemon finds
 * it by, and the record of it the holder keeps), and the committed files
 * nobody holds open, least recently opened first (what goes when the tree
 * is full). */
#include "autoconf.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "lib/log.h"
#include "state/ids.h"
#include "trees/names.h"
#include "trees/wtree_i.h"

static uint64_t name_hash(const struct wtree *w, const char *name)
{
	uint64_t h = 1469598103934665603ull ^ w->seed;

	for (const unsigned char *p = (const unsigned char *)name; *p; p++)
		h = (h ^ *p) * 1099511628211ull;
	return h ^ (h >> 29);
}

struct wnode *wnode_new(struct wtree *w, struct wnode *parent, const char *name, bool is_dir)
{
	struct wnode *n = calloc(1, sizeof(*n));

	if (!n || !(n->name = strdup(name)))
		goto fail;
	if (is_dir) {
		n->dir = calloc(1, sizeof(*n->dir));
		if (!n->dir || !(n->dir->buckets = calloc(8, sizeof(struct wnode *))))
			goto fail;
		n->dir->nbuckets = 8;
	}
	n->node.type = is_dir ? NODE_CACHE_DIR : NODE_CACHE_FILE;
	atomic_init(&n->node.refs, 1);
	n->tree = w;
	pthread_mutex_lock(&w->all_mu);
	n->node.next = w->all.next;
	n->node.prev = &w->all;
	w->all.next->prev = &n->node;
	w->all.next = &n->node;
	pthread_mutex_unlock(&w->all_mu);
	n->parent = parent;
	if (parent)
		node_ref(&parent->node);
	n->state = is_dir ? WNODE_LIVE : WNODE_PENDING;
	n->used = n->mtime = clock_now();
	return n;
fail:
	if (n) {
		free(n->name);
		if (n->dir)
			free(n->dir->buckets);
		free(n->dir);
	}
	free(n);
	return NULL;
}

struct wnode *wnode_find_locked(struct wtree *w, struct wnode *dir, const char *name)
{
	struct wdir *d = dir->dir;

	if (!d)
		return NULL;
	for (struct wnode *n = d->buckets[name_hash(w, name) & (d->nbuckets - 1)]; n; n = n->chain)
		if (strcmp(n->name, name) == 0)
			return n;
	return NULL;
}

static int grow(struct wtree *w, struct wdir *d)
{
	size_t nb = d->nbuckets * 2;
	struct wnode **b = calloc(nb, sizeof(*b));

	if (!b)
		return -ENOMEM;
	for (size_t i = 0; i < d->nbuckets; i++)
		for (struct wnode *n = d->buckets[i], *next; n; n = next) {
			next = n->chain;
			size_t k = name_hash(w, n->name) & (nb - 1);
			n->chain = b[k];
			b[k] = n;
		}
	free(d->buckets);
	d->buckets = b;
	d->nbuckets = nb;
	return 0;
}

/* The directory takes a reference of n (its entry). */
int wnode_insert_locked(struct wtree *w, struct wnode *dir, struct wnode *n)
{
	struct wdir *d = dir->dir;

	if (d->count + 1 > d->nbuckets && grow(w, d) < 0)
		return -ENOMEM;
	size_t k = name_hash(w, n->name) & (d->nbuckets - 1);
	n->chain = d->buckets[k];
	d->buckets[k] = n;
	d->count++;
	if (n->parent != dir) {
		node_ref(&dir->node);
		struct wnode *old = n->parent;
		n->parent = dir;
		if (old)
			node_unref(&old->node, 1);
	}
	n->state = WNODE_LIVE;
	node_ref(&n->node);
	dir->mtime = clock_now();
	return 0;
}

/* Takes n out of its directory (its entry's reference goes). */
void wnode_detach_locked(struct wtree *w, struct wnode *n)
{
	struct wdir *d = n->parent ? n->parent->dir : NULL;

	if (!d || n->state != WNODE_LIVE)
		return;
	struct wnode **p = &d->buckets[name_hash(w, n->name) & (d->nbuckets - 1)];
	while (*p && *p != n)
		p = &(*p)->chain;
	if (*p) {
		*p = n->chain;
		d->count--;
	}
	n->chain = NULL;
	n->state = WNODE_GONE;
	n->parent->mtime = clock_now();
	wnode_lru_remove_locked(w, n);
	wnode_ino_unset_locked(w, n); /* no next daemon finds it; its inode may be reused */
	node_unref(&n->node, 1);
}

static size_t ino_slot(const struct wtree *w, uint64_t ino)
{
	return (size_t)((ino * 0x9e3779b97f4a7c15ull) >> 17) & (w->ninos - 1);
}

void wnode_ino_unset_locked(struct wtree *w, struct wnode *n)
{
	if (!n->ino || !w->ninos)
		return;
	struct wnode **p = &w->inos[ino_slot(w, n->ino)];
	while (*p && *p != n)
		p = &(*p)->ino_next;
	if (*p) {
		*p = n->ino_next;
		w->ino_count--;
	}
	n->ino_next = NULL;
	n->ino = 0;
}

void wnode_ino_set_locked(struct wtree *w, struct wnode *n, uint64_t ino)
{
	wnode_ino_unset_locked(w, n);
	if (w->ino_count + 1 > w->ninos) {
		size_t nb = w->ninos ? w->ninos * 2 : 1024;
		struct wnode **b = calloc(nb, sizeof(*b));
		if (!b)
			return; /* not findable by a next daemon: its ids go stale */
		struct wnode **old = w->inos;
		size_t nold = w->ninos;
		w->inos = b;
		w->ninos = nb;
		for (size_t i = 0; i < nold; i++)
			for (struct wnode *m = old[i], *next; m; m = next) {
				next = m->ino_next;
				size_t k = ino_slot(w, m->ino);
				m->ino_next = b[k];
				b[k] = m;
			}
		free(old);
	}
	n->ino = ino;
	size_t k = ino_slot(w, ino);
	n->ino_next = w->inos[k];
	w->inos[k] = n;
	w->ino_count++;
}

struct wnode *wnode_by_ino_locked(struct wtree *w, uint64_t ino)
{
	if (!w->ninos || !ino)
		return NULL;
	for (struct wnode *n = w->inos[ino_slot(w, ino)]; n; n = n->ino_next)
		if (n->ino == ino)
			return n;
	return NULL;
}

void wnode_lru_remove_locked(struct wtree *w, struct wnode *n)
{
	(void)w;
	if (!n->lru_prev)
		return;
	n->lru_prev->lru_next = n->lru_next;
	n->lru_next->lru_prev = n->lru_prev;
	n->lru_prev = n->lru_next = NULL;
}

/* n becomes the most recently used (the list's tail). */
void wnode_lru_touch_locked(struct wtree *w, struct wnode *n)
{
	wnode_lru_remove_locked(w, n);
	n->lru_prev = w->lru.lru_prev;
	n->lru_next = &w->lru;
	w->lru.lru_prev->lru_next = n;
	w->lru.lru_prev = n;
}

unsigned wnode_depth_locked(const struct wnode *n)
{
	unsigned d = 0;

	for (; n && n->parent; n = n->parent)
		d++;
	return d;
}

int wnode_path_locked(const struct wnode *n, char *buf, size_t len)
{
	size_t at = len;

	if (len < 2)
		return -ENAMETOOLONG;
	buf[--at] = '\0';
	if (!n->parent) {
		strcpy(buf, ".");
		return 0;
	}
	for (const struct wnode *m = n; m->parent; m = m->parent) {
		size_t l = strlen(m->name);
		if (l + (m != n) > at || len - at + l > WTREE_PATH_MAX)
			return -ENAMETOOLONG;
		if (m != n)
			buf[--at] = '/';
		at -= l;
		memcpy(buf + at, m->name, l);
	}
	memmove(buf, buf + at, len - at);
	return 0;
}

static void wnode_free(struct wnode *n)
{
	if (n->dir)
		free(n->dir->buckets);
	free(n->dir);
	free(n->name);
	free(n);
}

/* The last reference went: a node out of the tree (its directory held
 * one while it was in it). Its parent's reference goes with it. */
void wnode_free_hook(struct node *node)
{
	struct wnode *n = wnode_of(node), *parent = n->parent;
	struct wtree *w = n->tree;

	pthread_mutex_lock(&w->all_mu);
	node->prev->next = node->next;
	node->next->prev = node->prev;
	pthread_mutex_unlock(&w->all_mu);
	wnode_free(n);
	if (parent)
		node_unref(&parent->node, 1);
}

/* At shutdown, with no request in flight: every node goes, whoever still
 * references it (the kernel does not forget every inode before a session
 * ends). */
void wnodes_destroy(struct wtree *w)
{
	pthread_mutex_lock(&w->all_mu);
	while (w->all.next != &w->all) {
		struct node *node = w->all.next;
		node->prev->next = node->next;
		node->next->prev = node->prev;
		wnode_free(wnode_of(node));
	}
	pthread_mutex_unlock(&w->all_mu);
	w->root = NULL;
	free(w->inos);
	w->inos = NULL;
}

/* ---- the next daemon -------------------------------------------------------------- */

/* Its store inode, and what tells a reused inode apart: a file's digest,
 * a directory's name. */
void wtree_describe(const struct node *node, struct held_node *d)
{
	struct wtree *w = ((const struct wnode *)node)->tree;

	pthread_mutex_lock(&w->mu);
	wtree_describe_locked(node, d);
	pthread_mutex_unlock(&w->mu);
}

/* Not under the tree's lock: the ids' lock comes first (a lookup's
 * describe takes the tree's lock under it). */
void wtree_redescribe(struct wtree *w, struct wnode *n)
{
	struct held_node d;

	memset(&d, 0, sizeof(d));
	pthread_mutex_lock(&w->mu);
	wtree_describe_locked(&n->node, &d);
	pthread_mutex_unlock(&w->mu);
	ids_node_redescribe(w->t, &n->node, &d);
}

void wtree_describe_locked(const struct node *node, struct held_node *d)
{
	const struct wnode *n = (const struct wnode *)node;

	wtree_describe_as_locked(n, n->parent, n->name, d);
}

void wtree_describe_as_locked(const struct wnode *n, const struct wnode *parent,
			      const char *name, struct held_node *d)
{
	size_t len = strlen(name);

	memcpy(d->key, &n->ino, sizeof(n->ino));
	d->sub = n->state == WNODE_PENDING;
	/* Its directory: where a file being written is made again, and what
	 * tells a directory renamed in it (nodes.c: is_described_locked). */
	if ((d->sub || n->dir) && parent)
		memcpy(d->hash, &parent->ino, sizeof(parent->ino));
	else if (!n->dir) {
		memcpy(d->hash, n->sha, 32);
		d->hash_len = 32;
	}
	if (n->dir) /* after its directory's inode: which directory of the store */
		memcpy(d->hash + sizeof(uint64_t), &n->gen, sizeof(n->gen));
	d->name_len = (uint8_t)(len > HELD_NAME_MAX ? HELD_NAME_MAX : len);
	memcpy(d->name, name, d->name_len);
	d->name[d->name_len] = '\0';
}

/* A file still being written when its daemon ended: made again, pending,
 * in its directory (found by its inode), for its writer's handle to be
 * opened again (file.c: wfile_reopen). */
static struct wnode *revive_pending_locked(struct wtree *w, const struct held_node *r)
{
	char name[WTREE_NAME_MAX + 1];
	uint64_t dir_ino, ino;

	memcpy(&dir_ino, r->hash, sizeof(dir_ino));
	memcpy(&ino, r->key, sizeof(ino));
	struct wnode *dir = wnode_by_ino_locked(w, dir_ino);
	if (!dir || !dir->dir || dir->state != WNODE_LIVE)
		return NULL; /* its directory is gone */
	memcpy(name, r->name, r->name_len);
	name[r->name_len] = '\0';
	/* A longer name than the record keeps: kept beside its temporary file
	 * (file.c: wfile_create), its first bytes the record's. */
	if (r->name_len >= HELD_NAME_MAX) {
		char prefix[HELD_NAME_MAX + 1];
		memcpy(prefix, name, sizeof(prefix));
		int rc = wlong_name_read(w, ino, prefix, name, sizeof(name));
		if (rc < 0) {
			log_err("%s: a file being written named %.128s...: its whole name: %s",
				w->p->label, prefix, strerror(-rc));
			return NULL;
		}
	}
	struct wnode *n = wnode_new(w, dir, name, false);
	if (n)
		wnode_ino_set_locked(w, n, ino);
	return n;
}

/* Whether n, found by r's inode number, is the node r describes, and not
 * another that was given the number since. A committed file is told by
 * its digest whatever its name: a daemon that took over may have renamed
 * it before the kernel named its id to it (the tools' temporary file
 * renamed into place right after a crash), and the record kept the name
 * it had when its id was given. A directory, the same way by its
 * generation, where the store keeps one (disk.c): a store gives a removed
 * directory's inode number to the next one made (a tool's next temporary
 * directory, and the one made in it), whose entries a dropped directory's
 * id must not be lent. Without, by its name and its directory both (a
 * rename writes the record first: ops.c, rename_announce). A file being
 * written then, by its name or its directory. An id that describes none
 * is stale (node_ops.h). */
static bool is_described_locked(const struct wnode *n, const struct held_node *r)
{
	uint64_t parent, gen;

	if (n->state != WNODE_LIVE || (n->dir != NULL) != (r->type == NODE_CACHE_DIR))
		return false;
	if (!n->dir && !r->sub)
		return memcmp(n->sha, r->hash, 32) == 0;
	memcpy(&parent, r->hash, sizeof(parent));
	memcpy(&gen, r->hash + sizeof(parent), sizeof(gen));
	if (n->dir && gen && n->gen)
		return gen == n->gen;
	size_t len = strlen(n->name);
	/* a longer name than the record keeps: its first bytes */
	bool named = strncmp(n->name, r->name, r->name_len) == 0 &&
		     (len == r->name_len || (r->name_len == HELD_NAME_MAX && len > HELD_NAME_MAX));
	bool placed = parent && n->parent && n->parent->ino == parent;
	if (n->dir) /* no generation: a store without, or an older daemon's record */
		return named && (placed || !parent);
	return named || placed;
}

/* The node of w that r describes, referenced, or NULL. */
static struct node *revive_in(struct wtree *w, const struct held_node *r)
{
	uint64_t ino;

	if (!w)
		return NULL;
	/* A file described while being written (sub) has the inode its
	 * commit linked in, and no digest yet: found if it was committed. */
	memcpy(&ino, r->key, sizeof(ino));
	pthread_mutex_lock(&w->mu);
	struct wnode *n = wnode_by_ino_locked(w, ino);
	if (n && !is_described_locked(n, r))
		n = NULL; /* its inode number was given to another since */
	if (!n && r->sub)
		n = revive_pending_locked(w, r);
	else if (n)
		node_ref(&n->node);
	pthread_mutex_unlock(&w->mu);
	return n ? &n->node : NULL;
}

/* Both trees live in the one store file system: a store inode number
 * names a node of one of them only. */
struct node *wtree_revive(struct tree *t, const struct held_node *r)
{
	struct node *n = revive_in(t->cache, r);

	return n ? n : revive_in(t->blocks, r);
}
