/* SPDX-License-Identifier: Apache-2.0 */
/* Local misses asked of the Redis Cluster tier (DESIGN.md §7): a value is
 * validated exactly as a publish (key, size, SHA-256) and cached in the
 * local store (capacity and expiry as usual) before it is served. */
#ifndef ARTFS_FETCH_H
#define ARTFS_FETCH_H

#include "state/base.h"

/* One object to fetch: its version (the key-only one for a bare key) and
 * its name there; result is filled. */
struct fetch_item {
	struct version *ver;
	const uint8_t *hash;
	size_t hash_len;
	bool keep;    /* hand the value back (below) when it is what is now
		       * committed here, so the caller serves it without reading
		       * the store again */
	int result;   /* 0: now committed here; -ENOENT: absent everywhere;
		       * -EIO: unreachable, or a value that fails validation
		       * (never cached); -ENOSPC: no room here to cache it */
	uint8_t *value;    /* keep: the envelope, validated and committed (the
			    * caller frees it), or NULL */
	size_t value_len;
};

/* Fetches n items in one pipelined round per cluster node. Returns the
 * first result other than 0 and -ENOENT, else -ENOENT when one is absent,
 * else 0. -ENOENT for all when there is no cluster. */
int fetch_objects(struct tree *t, struct fetch_item *items, size_t n);

#endif
