/* SPDX-License-Identifier: Apache-2.0 */
/* .blocks/'s retention (DESIGN.md §10): nothing is evicted while it may
 * still be asked for; a namespace directory (one that holds blocks) with
 * no put or read of a block in it for ttl= seconds, no block of it open
 * and none being written, is collected: its blocks and, once empty, the
 * directory. The janitor collects on its timer (tree->collect_more), and a
 * put that finds the tree full collects before it answers ENOSPC. */
#include "autoconf.h"

#include <string.h>

#include "lib/log.h"
#include "trees/wtree_i.h"

/* Whether dir holds blocks, none of them open, none being written, and
 * none put or read for the tree's ttl. */
static bool idle_locked(const struct wtree *w, const struct wnode *dir, int64_t now)
{
	const struct wdir *d = dir->dir;
	bool files = false;

	if (d->pending || now - dir->used < w->ttl)
		return false;
	for (size_t i = 0; i < d->nbuckets; i++)
		for (const struct wnode *n = d->buckets[i]; n; n = n->chain) {
			if (!n->dir && n->open)
				return false;
			files |= !n->dir;
		}
	return files;
}

/* The blocks of dir leave the tree and the store; the count. */
static uint64_t collect_dir_locked(struct wtree *w, struct wnode *dir)
{
	struct wdir *d = dir->dir;
	uint64_t count = 0;

	for (size_t i = 0; i < d->nbuckets; i++)
		for (struct wnode *n = d->buckets[i], *next; n; n = next) {
			next = n->chain;
			if (n->dir)
				continue;
			wfile_drop_locked(w, n);
			count++;
		}
	return count;
}

static uint64_t collect_under_locked(struct wtree *w, struct wnode *dir, int64_t now)
{
	struct wdir *d = dir->dir;
	uint64_t count = 0;

	for (size_t i = 0; i < d->nbuckets; i++)
		for (struct wnode *n = d->buckets[i], *next; n; n = next) {
			next = n->chain;
			if (n->dir)
				count += collect_under_locked(w, n, now);
		}
	if (!idle_locked(w, dir, now))
		return count;
	char path[WTREE_PATH_MAX + 2];
	if (wnode_path_locked(dir, path, sizeof(path)) < 0)
		strcpy(path, "?");
	uint64_t here = collect_dir_locked(w, dir);
	log_info("blocks: %s/%.400s idle for %lld s (ttl=%lld): %llu blocks collected",
		 w->p->mount_name, path, (long long)(now - dir->used), (long long)w->ttl,
		 (unsigned long long)here);
	if (dir != w->root && !d->count && !d->pending && wdisk_remove_locked(w, dir) == 0)
		wnode_detach_locked(w, dir);
	return count + here;
}

uint64_t wblocks_collect_locked(struct wtree *w, int64_t now)
{
	if (!w->ttl || w->kind != WTREE_BLOCKS)
		return 0;
	uint64_t count = collect_under_locked(w, w->root, now);
	counter_add(&w->t->metrics.blocks_collected, count);
	return count;
}

uint64_t wblocks_collect(struct tree *t, int64_t now)
{
	struct wtree *w = t->blocks;

	if (!w)
		return 0;
	pthread_mutex_lock(&w->mu);
	uint64_t count = wblocks_collect_locked(w, now);
	pthread_mutex_unlock(&w->mu);
	return count;
}
