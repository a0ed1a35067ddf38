#include "autoconf.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "fetch.h"
#include "log.h"
#include "publish.h"
#include "remote.h"

/* Commits a fetched value through the publish path (every check of a
 * publish), marked so that it is not written back. */
static int cache(struct tree *t, struct fetch_item *it, const uint8_t *val, size_t len,
		 const char *key)
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
	if (rc == -EEXIST)
		rc = 0; /* published here meanwhile: the local object answers */
	else if (rc == -EBADMSG || rc == -EFBIG) {
		log_err("fetch %s: the cluster's value fails validation; not cached, not served", key);
		rc = -EIO;
	}
	return rc;
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
	char (*keys)[ARTFS_KEY_LEN + 1] = calloc(n, sizeof(*keys));
	const char **hex = calloc(n, sizeof(*hex));
	uint8_t **vals = calloc(n, sizeof(*vals));
	size_t *lens = calloc(n, sizeof(*lens));
	int *results = calloc(n, sizeof(*results));
	int first = 0;

	if (!keys || !hex || !vals || !lens || !results) {
		first = -ENOMEM;
		for (size_t i = 0; i < n; i++)
			items[i].result = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		version_object_key(items[i].ver, items[i].hash, items[i].hash_len, keys[i]);
		hex[i] = keys[i] + sizeof(ARTFS_KEY_PREFIX) - 1;
	}
	remote_get_many(t->remote, n, hex, vals, lens, results);
	for (size_t i = 0; i < n; i++) {
		int rc = results[i];
		if (rc == 0)
			rc = cache(t, &items[i], vals[i], lens[i], keys[i]);
		else if (rc != -ENOENT)
			rc = -EIO;
		items[i].result = rc;
		if (rc && !first)
			first = rc;
		free(vals[i]);
	}
out:
	free(keys);
	free(hex);
	free(vals);
	free(lens);
	free(results);
	return first;
}
