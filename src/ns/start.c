/* SPDX-License-Identifier: Apache-2.0 */
/* The tree's life: opening it (alone, or in a daemon a holder started),
 * closing it, and the hand-over between two daemons (DESIGN.md §8): the
 * one before leaves what the kernel holds, this one takes it over. */
#include "autoconf.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "lib/log.h"
#include "ns/revive.h"
#include "ns/tree.h"
#include "r3/scan.h"
#include "remote/remote.h"
#include "state/ids.h"
#include "state/transaction.h"
#include "trees/wtree.h"
#include "weights/weights.h"

int tree_open(struct tree *t, struct artfs_config *cfg, char *err, size_t errlen)
{
	struct tree_start alone = { .held_fd = -1, .lock_fd = -1, .keeper_fd = -1 };

	return tree_open_start(t, cfg, &alone, err, errlen);
}

/* The memory the ids live in: the holder's, or this process's own. */
static int open_held(struct tree *t, const struct tree_start *start, char *err, size_t errlen)
{
	int rc = start->held_fd >= 0 ? held_map(start->held_fd, &t->held)
				     : held_map_private(&t->held);

	if (rc < 0)
		snprintf(err, errlen, "cannot map %s: %s",
			 start->held_fd >= 0 ? "the memory its holder keeps" : "its id tables",
			 strerror(-rc));
	else if (!start->takeover)
		t->held.fresh = true;
	return rc;
}

/* The write-once trees, .cache/ and .blocks/: a store that holds no
 * usable one costs that tree, not R3 objects and weights (the mount then
 * has no .cache or .blocks). */
static void trees_open(struct tree *t)
{
	char err[PATH_MAX + 128];

	if (wtree_open(t, WTREE_CACHE, err, sizeof(err)) < 0)
		log_err("cache: %s; the mount serves no .cache/ tree", err);
	if (wtree_open(t, WTREE_BLOCKS, err, sizeof(err)) < 0)
		log_err("blocks: %s; the mount serves no .blocks/ tree", err);
	t->collect_more = wblocks_collect;
}

int tree_open_start(struct tree *t, struct artfs_config *cfg, const struct tree_start *start,
		    char *err, size_t errlen)
{
	memset(t, 0, sizeof(*t));
	t->held.fd = -1;
	t->cfg = cfg;
	t->started = clock_now();
	mutex_init_adaptive(&t->lock);
	for (int i = 0; i < COMMIT_STRIPES; i++)
		mutex_init_adaptive(&t->commit_locks[i]);
	pthread_mutex_init(&t->weights_mu, NULL);
	pthread_mutex_init(&t->results_mu, NULL);
	pthread_cond_init(&t->weights_cv, NULL);
	pthread_cond_init(&t->sized_cv, NULL);
	index_init(&t->idx);
	t->root.type = NODE_ROOT;
	t->info_dir.type = NODE_INFO_DIR;
	for (int i = 0; i < INFO_COUNT; i++) {
		t->info_files[i].type = NODE_INFO_FILE;
		t->info_files[i].sub = (uint8_t)i;
	}
	t->keys_dir.type = NODE_KEYS_DIR;
	t->keys_put.type = NODE_PUT;
	t->keys_get.type = NODE_GET;
	t->blocks_put.type = NODE_BLOCKS_PUT;
	t->blocks_get.type = NODE_BLOCKS_GET;
	t->attach_node.type = NODE_SOCKET;
	grants_init(&t->grants);
	keeper_link_init(&t->keeper, start->keeper_fd);
	ids_init(t);
	ids_set_weights_describe(weights_describe_node);
	ids_set_trees_describe(wtree_describe);
	int rc = open_held(t, start, err, errlen);
	if (rc < 0)
		goto fail;
	rc = store_open(&t->store, cfg->store, start->lock_fd, err, errlen);
	if (rc < 0)
		goto fail;
	if (cfg->remote && *cfg->remote) {
		struct remote_config rc_cfg = {
			.seeds = cfg->remote, .prefix = cfg->remote_prefix, .ttl_s = cfg->remote_ttl,
			.timeout_ms = cfg->remote_timeout * 1000, .auth_file = cfg->remote_auth,
		};
		rc = remote_open(&rc_cfg, &t->remote);
		if (rc < 0) {
			snprintf(err, errlen, "remote=%s: %s (see the log)", cfg->remote,
				 rc == -ENOTSUP ? "this artfs was built without Redis support"
						: strerror(-rc));
			goto fail;
		}
	}
	if (!start->defer_scan) {
		rc = scan_store(t, start->takeover, err, errlen);
		if (rc < 0)
			goto fail;
		trees_open(t);
	}
	t->scan_deferred = start->defer_scan;
	t->took_over = start->takeover;
	return 0;
fail:
	tree_close(t);
	return rc;
}

void tree_close(struct tree *t)
{
	t->closing = true;
	scan_size_stop(t);
	handles_release_all(t);
	weights_shutdown(t);
	wtree_close(t, WTREE_CACHE);
	wtree_close(t, WTREE_BLOCKS);
	index_destroy(&t->idx);
	remote_close(t->remote);
	t->remote = NULL;
	if (t->store.path)
		store_close(&t->store);
	pthread_mutex_destroy(&t->lock);
	for (int i = 0; i < COMMIT_STRIPES; i++)
		pthread_mutex_destroy(&t->commit_locks[i]);
	pthread_mutex_destroy(&t->weights_mu);
	transaction_results_drop(t);
	pthread_mutex_destroy(&t->results_mu);
	pthread_cond_destroy(&t->weights_cv);
	pthread_cond_destroy(&t->sized_cv);
	if (t->node_scan_started)
		pthread_join(t->node_scan, NULL);
	ids_close(t);
	held_unmap(&t->held);
	grants_destroy(&t->grants);
	keeper_link_destroy(&t->keeper);
}

static void *scan_nodes(void *arg)
{
	held_scan_nodes(&((struct tree *)arg)->held);
	return NULL;
}

int tree_take_over(struct tree *t)
{
	char err[256];

	if (t->scan_deferred) { /* what the daemon before committed is all in now */
		t->scan_deferred = false;
		int rc = scan_store(t, true, err, sizeof(err));
		if (rc == 0)
			trees_open(t);
		if (rc < 0) {
			log_err("takeover: %s", err);
			return rc;
		}
	}
	held_take_over(&t->held);
	wtrees_take_over(t);
	weights_take_over(t);
	revive_directories(t);
	t->node_scan_started = pthread_create(&t->node_scan, NULL, scan_nodes, t) == 0;
	if (!t->node_scan_started) /* without it, new ids come from above the mark only */
		log_warn("takeover: cannot scan the node ids in the background");
	return 0;
}

void tree_hand_over(struct tree *t)
{
	handles_hand_over(t);
	t->handing_over = true;
}
