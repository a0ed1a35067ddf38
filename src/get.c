#include "autoconf.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fetch.h"
#include "parallel.h"
#include "get.h"
#include "key.h"
#include "log.h"
#include "object.h"

struct get {
	struct handle h;
	pthread_mutex_t mu;
	struct request_text req;  /* the keys as written */
	bool done;
	int error;
	struct transaction_result out; /* the envelopes, back to back */
};

struct wanted {
	struct object *o;         /* referenced */
	uint64_t size, at;
	uint8_t *fetched;         /* its envelope as just fetched from the cluster
				   * and committed here, or NULL */
	size_t fetched_len;
	int error;                /* of loading it */
};

static int fail(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int fail(int err, const char *fmt, ...)
{
	char msg[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	log_warn("get .keys: %s (%s)", msg, strerror(-err));
	return err;
}

/* Parses the keys: 64 hex digits, optionally after vllm-artifact/; blank
 * lines and surrounding spaces ignored. */
static int parse(const char *text, size_t len, uint8_t (**keys)[32], size_t *count)
{
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
			return fail(-EINVAL, "line %zu: not a key (64 hex digits)", lineno);
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
			return fail(-EINVAL, "line %zu: not a key (64 lowercase hex digits)", lineno);
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

	if (t->sizing)
		sizing_wait(t); /* the keys of a restarted store are indexed by then */
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

static int run(struct tree *t, struct get *g)
{
	uint8_t (*keys)[32] = NULL;
	size_t n = 0;
	int rc = parse(g->req.text ? g->req.text : "", g->req.len, &keys, &n);

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
		if (rc < 0)
			goto out;
		missing = resolve(t, keys, w, n);
	}
	char hex[65];
	uint64_t total = 0;
	if (missing < n) {
		key_hex(keys[missing], 32, hex);
		rc = fail(-ENOENT, "key %zu (%s) does not exist", missing, hex);
		goto out;
	}
	for (size_t i = 0; i < n && rc == 0; i++) {
		if (w[i].fetched)
			w[i].size = w[i].fetched_len;
		else
			rc = object_envelope_size(t, w[i].o, &w[i].size);
		w[i].at = total;
		total += w[i].size;
	}
	if (rc < 0)
		goto out;
	rc = transaction_result_map(t, &g->out, (size_t)total);
	if (rc == -EDQUOT) {
		counter_inc(&t->metrics.materialize_refused);
		rc = fail(-ENOMEM, "a %" PRIu64 "-byte result would exceed materialize_max=%" PRIu64,
			  total, t->cfg->materialize_max);
	}
	if (rc < 0)
		goto out;
	/* Every object verified before the first byte: ENOENT, then EIO. */
	struct loading l = { .t = t, .w = w, .out = g->out.bytes };
	parallel_for(n, 8, PARALLEL_THREADS_MAX, load_one, &l);
	int first = 0;
	for (size_t i = 0; i < n; i++) {
		int e = w[i].error;
		if (e && (!first || (e == -ENOENT && first != -ENOENT)))
			first = e;
	}
	if (first) {
		transaction_result_free(t, &g->out);
		rc = first == -ENOENT || first == -ENOMEM || first == -EMFILE || first == -ENFILE
			     ? first : -EIO;
		fail(rc, "%zu keys asked: not served", n);
		goto out;
	}
	g->out.len = (size_t)total;
	for (size_t i = 0; i < n; i++)
		version_touch(w[i].o->ver);
out:
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
	struct get *g = (struct get *)h;
	int rc = (int)len;

	(void)owner;
	pthread_mutex_lock(&g->mu);
	if (g->done)
		rc = -EINVAL; /* one transaction per open */
	else
		rc = request_text_append(t, &g->req, off, buf, len, GET_REQUEST_MAX);
	pthread_mutex_unlock(&g->mu);
	if (rc < 0)
		log_warn("get .keys: write refused (%s)", strerror(-rc));
	return rc;
}

static int get_read(struct tree *t, struct handle *h, uint64_t off, size_t size,
		    const void **data, size_t *len)
{
	struct get *g = (struct get *)h;

	pthread_mutex_lock(&g->mu);
	if (!g->done) {
		g->error = run(t, g);
		g->done = true;
	}
	pthread_mutex_unlock(&g->mu);
	if (g->error)
		return g->error;
	transaction_result_slice(&g->out, off, size, data, len);
	return 0;
}

static void get_release(struct tree *t, struct handle *h)
{
	struct get *g = (struct get *)h;

	transaction_result_free(t, &g->out);
	request_text_free(t, &g->req);
	pthread_mutex_destroy(&g->mu);
	free(g);
}

static bool get_read_quick(struct tree *t, struct handle *h)
{
	(void)t, (void)h;
	return false; /* reads and verifies every object asked */
}

static const struct handle_ops get_ops = {
	.kind = "get",
	.read = get_read,
	.write = get_write,
	.release = get_release,
	.read_quick = get_read_quick,
};

int get_open(struct tree *t, struct handle **h, struct open_reply *r)
{
	struct get *g = calloc(1, sizeof(*g));

	(void)t;
	if (!g)
		return -ENOMEM;
	handle_init(&g->h, &get_ops);
	pthread_mutex_init(&g->mu, NULL);
	r->direct_io = true;
	*h = &g->h;
	return 0;
}
