/* SPDX-License-Identifier: Apache-2.0 */
/* The two write-once trees: one mechanism (this folder), two policies.
 * .cache/ (DESIGN.md §9) holds what a tool can build again: full, it
 * evicts what was opened least recently; a damaged file is a miss.
 * .blocks/ (§10) holds R3 data that nothing can build again: full, it
 * refuses (ENOSPC); a damaged block is EIO; the cluster must take a block
 * before it is committed, as an R3 publish (§7). */
#include "autoconf.h"

#include "trees/names.h"
#include "trees/wtree_i.h"

static const struct wpolicy policies[] = {
	[WTREE_CACHE] = {
		.label = "cache",
		.mount_name = WTREE_MOUNT_NAME,
		.store_dir = "cache",
		.tmp_dir = "cache-tmp",
		.remote_kind = "cache",
		.depth_max = 32,
		.path_max = WTREE_PATH_MAX,
		.name_check = wtree_name_check,
		.evict = true,
		.damaged_is_miss = true,
		.renames = true,
		.cluster_sets = true,
	},
	[WTREE_BLOCKS] = {
		.label = "blocks",
		.mount_name = WBLOCKS_MOUNT_NAME,
		.store_dir = "blocks",
		.tmp_dir = "blocks-tmp",
		.remote_kind = "blk",
		.depth_max = WBLOCKS_KEY_MAX / 2,
		.path_max = WBLOCKS_KEY_MAX,
		.name_check = wblocks_segment_check,
		.check_every_open = true,
		.cluster_required = true,
		.collect_locked = wblocks_collect_locked,
	},
};

const struct wpolicy *wpolicy_of(enum wtree_kind kind)
{
	return &policies[kind];
}

void wpolicy_counters(struct tree *t, enum wtree_kind kind, struct wcounters *c)
{
	struct metrics *m = &t->metrics;

	if (kind == WTREE_CACHE)
		*c = (struct wcounters){ &m->cache_hits, &m->cache_misses, &m->cache_remote_hits,
					 &m->cache_commits, &m->cache_collisions,
					 &m->cache_evictions, &m->cache_damaged };
	else
		*c = (struct wcounters){ &m->blocks_hits, &m->blocks_misses,
					 &m->blocks_remote_hits, &m->blocks_commits,
					 &m->blocks_collisions, &m->blocks_refused,
					 &m->blocks_damaged };
}
