/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lib/cleanup.h"
#include "lib/log.h"
#include "lib/parallel.h"
#include "r3/fetch.h"
#include "r3/publish.h"
#include "remote/remote.h"

/* Commits a fetched value through the publish path (every check of a
 * publish), marked so that it is not written back. *same: the object here
 * now holds exactly these bytes (not a different one published meanwhile). */
static int cache(struct tree *t, struct fetch_item *it, const uint8_t *val, size_t len,
		 const char *key, bool *same)
{
	struct handle *h;
	struct object *o = object_new(it->ver, it->hash, it->hash_len);

	if (!o)
		return -ENOMEM;
	int rc = publish_begin(t, o, &h);
	node_unref(&o->node, 1);
	if (rc < 0)
		return rc;
	publish_mark_fetched(h);
	int w = h->ops->write(t, h, 0, val, len, 0);
	rc = h->ops->fsync(t, h);
	if (w < 0 && rc == 0)
		rc = w;
	handle_put(t, h);
	*same = rc == 0;
	if (rc == -EEXIST)
		rc = 0; /* published here meanwhile: the local object answers */
	else if (rc == -EBADMSG || rc == -EFBIG) {
		log_err("fetch %s: the cluster's value fails validation; not cached, not served", key);
		rc = -EIO;
	}
	return rc;
}

struct caching {
	struct tree *t;
	struct fetch_item *items;
	uint8_t **vals;
	size_t *lens;
	int *results;
	char (*keys)[ARTFS_KEY_LEN + 1];
};

static void cache_one(void *ctx, size_t i)
{
	struct caching *c = ctx;
	struct fetch_item *it = &c->items[i];
	int rc = c->results[i];
	bool same = false;

	if (rc == 0)
		rc = cache(c->t, it, c->vals[i], c->lens[i], c->keys[i], &same);
	else if (rc != -ENOENT)
		rc = -EIO;
	it->result = rc;
	if (same && it->keep) {
		it->value = c->vals[i];
		it->value_len = c->lens[i];
		c->vals[i] = NULL;
	}
}

int fetch_objects(struct tree *t, struct fetch_item *items, size_t n)
{
	if (!n)
		return 0;
	if (!t->remote) {
		for (size_t i = 0; i < n; i++)
			items[i].result = -ENOENT;
		return -ENOENT;
	}
	_cleanup_free_ char (*keys)[ARTFS_KEY_LEN + 1] = calloc(n, sizeof(*keys));
	_cleanup_free_ const char **hex = calloc(n, sizeof(*hex));
	_cleanup_free_ uint8_t **vals = calloc(n, sizeof(*vals));
	_cleanup_free_ size_t *lens = calloc(n, sizeof(*lens));
	_cleanup_free_ int *results = calloc(n, sizeof(*results));
	int first = 0;

	if (!keys || !hex || !vals || !lens || !results) {
		for (size_t i = 0; i < n; i++)
			items[i].result = -ENOMEM;
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++) {
		version_object_key(items[i].ver, items[i].hash, items[i].hash_len, keys[i]);
		hex[i] = keys[i] + sizeof(ARTFS_KEY_PREFIX) - 1;
	}
	remote_get_many(t->remote, n, hex, vals, lens, results);
	/* Each value is checked and committed here as a publish: on several
	 * threads for a batch, since each costs a few file operations. */
	struct caching c = { .t = t, .items = items, .vals = vals, .lens = lens, .results = results,
			     .keys = keys };
	parallel_for(n, 32, PARALLEL_THREADS_MAX, cache_one, &c);
	for (size_t i = 0; i < n; i++) {
		int r = items[i].result;
		if (r && (!first || (first == -ENOENT && r != -ENOENT)))
			first = r;
		free(vals[i]);
	}
	return first;
}
