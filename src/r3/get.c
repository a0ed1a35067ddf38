/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/key.h"
#include "lib/log.h"
#include "lib/parallel.h"
#include "r3/fetch.h"
#include "r3/get.h"
#include "r3/object.h"
#include "state/transaction.h"

/* A .keys/.get file: its request is the keys, its result their envelopes
 * back to back (struct transaction). */

struct wanted {
	struct object *o;         /* referenced */
	uint64_t size, at;
	uint8_t *fetched;         /* its envelope as just fetched from the cluster
				   * and committed here, or NULL */
	size_t fetched_len;
	int error;                /* of loading it */
};

/* Parses the keys: 64 hex digits, optionally after vllm-artifact/; blank
 * lines and surrounding spaces ignored. */
static int parse(const struct transaction *x, uint8_t (**keys)[32], size_t *count)
{
	const char *text = x->req.text ? x->req.text : "";
	size_t len = x->req.len;
	size_t cap = 0, n = 0, lineno = 0;
	uint8_t (*k)[32] = NULL;

	for (size_t pos = 0; pos < len;) {
		const char *nl = memchr(text + pos, '\n', len - pos);
		size_t end = nl ? (size_t)(nl - text) : len, m = end - pos;
		const char *s = text + pos;
		lineno++;
		pos = end + 1;
		while (m && isspace((unsigned char)*s))
			s++, m--;
		while (m && isspace((unsigned char)s[m - 1]))
			m--;
		if (!m)
			continue;
		const size_t plen = sizeof(ARTFS_KEY_PREFIX) - 1;
		if (m == plen + 64 && memcmp(s, ARTFS_KEY_PREFIX, plen) == 0)
			s += plen, m -= plen;
		char hex[65];
		if (m != 64) {
			free(k);
			return transaction_fail(x, -EINVAL, "line %zu: not a key (64 hex digits)",
						lineno);
		}
		memcpy(hex, s, 64);
		hex[64] = '\0';
		if (n == cap) {
			cap = cap ? cap * 2 : 64;
			void *grown = realloc(k, cap * sizeof(*k));
			if (!grown) {
				free(k);
				return -ENOMEM;
			}
			k = grown;
		}
		if (key_sha256_decode(hex, k[n]) < 0) {
			free(k);
			return transaction_fail(x, -EINVAL,
						"line %zu: not a key (64 lowercase hex digits)", lineno);
		}
		n++;
	}
	*keys = k;
	*count = n;
	return 0;
}

/* Finds (and references) the object of each key not found yet; returns
 * the first still missing, or n. */
static size_t resolve(struct tree *t, uint8_t (*keys)[32], struct wanted *w, size_t n)
{
	size_t missing = n;

	for (size_t i = 0; i < n && t->sizing; i++)
		if (!w[i].o) /* the keys of a restarted store are indexed once counted */
			sizing_wait_for_key(t, keys[i]);
	pthread_mutex_lock(&t->lock);
	for (size_t i = 0; i < n; i++) {
		if (!w[i].o && (w[i].o = index_key_find(&t->idx, keys[i])))
			node_ref(&w[i].o->node);
		if (!w[i].o && missing == n)
			missing = i;
	}
	pthread_mutex_unlock(&t->lock);
	return missing;
}

static int fetch_misses(struct tree *t, uint8_t (*keys)[32], struct wanted *w, size_t n)
{
	struct version *kv;
	int rc = version_keyonly(t, &kv);
	if (rc < 0)
		return rc;
	struct fetch_item *items = calloc(n, sizeof(*items));
	size_t k = 0;
	if (!items) {
		node_unref(&kv->node, 1);
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++)
		if (!w[i].o)
			items[k++] = (struct fetch_item){ .ver = kv, .hash = keys[i], .hash_len = 32,
							  .keep = true };
	rc = fetch_objects(t, items, k);
	k = 0;
	for (size_t i = 0; i < n; i++)
		if (!w[i].o) {
			w[i].fetched = items[k].value;
			w[i].fetched_len = items[k++].value_len;
		}
	free(items);
	node_unref(&kv->node, 1);
	return rc == -ENOENT ? 0 : rc;
}

struct loading {
	struct tree *t;
	struct wanted *w;
	uint8_t *out;
};

/* One envelope into its place in the result, checked on the way. */
static void load_one(void *ctx, size_t i)
{
	struct loading *l = ctx;
	struct wanted *w = &l->w[i];

	if (w->fetched) {
		/* validated and committed as it arrived: served from those
		 * bytes, not read back from the file just written */
		memcpy(l->out + w->at, w->fetched, w->fetched_len);
		w->error = 0;
		return;
	}
	w->error = object_load_envelope(l->t, w->o, l->out + w->at, (size_t)w->size);
}

/* Every envelope asked into the result, back to back; every object is
 * verified before the first byte is served: ENOENT, then EIO. */
static int serve(struct tree *t, struct transaction *x, struct wanted *w, size_t n)
{
	uint64_t total = 0;
	int rc = 0;

	for (size_t i = 0; i < n && rc == 0; i++) {
		if (w[i].fetched)
			w[i].size = w[i].fetched_len;
		else
			rc = object_envelope_size(t, w[i].o, &w[i].size);
		w[i].at = total;
		total += w[i].size;
	}
	if (rc < 0)
		return rc;
	rc = transaction_result_make(t, x, (size_t)total);
	if (rc < 0)
		return rc;
	struct loading l = { .t = t, .w = w, .out = x->out.bytes };
	parallel_for(n, 8, PARALLEL_THREADS_MAX, load_one, &l);
	int first = 0;
	for (size_t i = 0; i < n; i++) {
		int e = w[i].error;
		if (e && (!first || (e == -ENOENT && first != -ENOENT)))
			first = e;
	}
	if (first) {
		transaction_result_free(t, &x->out);
		rc = first == -ENOENT || first == -ENOMEM || first == -EMFILE || first == -ENFILE
			     ? first : -EIO;
		return transaction_fail(x, rc, "%zu keys asked: not served", n);
	}
	x->out.len = (size_t)total;
	for (size_t i = 0; i < n; i++)
		version_touch(w[i].o->ver);
	return 0;
}

static int run(struct tree *t, struct transaction *x)
{
	uint8_t (*keys)[32] = NULL;
	size_t n = 0;
	int rc = parse(x, &keys, &n);

	if (rc < 0)
		return rc;
	struct wanted *w = calloc(n ? n : 1, sizeof(*w));
	if (!w) {
		free(keys);
		return -ENOMEM;
	}
	size_t missing = resolve(t, keys, w, n);
	if (missing < n && t->remote) {
		/* Every local miss from the cluster, one pipelined round per node. */
		rc = fetch_misses(t, keys, w, n);
		if (rc == 0)
			missing = resolve(t, keys, w, n);
	}
	if (rc == 0 && missing < n) {
		char hex[65];
		key_hex(keys[missing], 32, hex);
		rc = transaction_fail(x, -ENOENT, "key %zu (%s) does not exist", missing, hex);
	}
	if (rc == 0)
		rc = serve(t, x, w, n);
	for (size_t i = 0; i < n; i++) {
		if (w[i].o)
			node_unref(&w[i].o->node, 1);
		free(w[i].fetched);
	}
	free(w);
	free(keys);
	return rc;
}

static int get_write(struct tree *t, struct handle *h, uint64_t off, const void *buf, size_t len,
		     uint64_t owner)
{
	int rc = transaction_append(t, (struct transaction *)h, off, buf, len, GET_REQUEST_MAX);

	(void)owner;
	if (rc < 0)
		log_warn("get .keys: write refused (%s)", strerror(-rc));
	return rc;
}

static const struct handle_ops get_ops = {
	.kind = "get",
	.held_kind = HANDLE_GET,
	.resume = transaction_resume,
	.read = transaction_read,
	.write = get_write,
	.release = transaction_release_free,
	.read_quick = transaction_read_not_quick, /* reads and verifies every object asked */
};

int get_open(struct tree *t, struct handle **h, struct open_reply *r)
{
	(void)t;
	return transaction_open(&get_ops, run, "get .keys", h, r);
}
