/* SPDX-License-Identifier: Apache-2.0 */
/* .blocks/.get (DESIGN.md §10): write keys, one a line, then read from
 * offset 0: the blocks' bytes concatenated in the order asked (a key may
 * come again). Everything is checked before the first byte: every key
 * well formed (EINVAL), held here or fetched from the cluster in one
 * pipelined round per node (ENOENT, EIO when it does not answer), every
 * block's SHA-256 (EIO). The result counts against materialize_max=
 * (ENOMEM beyond it). Each open is one transaction (state/transaction.h),
 * taken over by the next daemon as .keys/.get is. */
#include "autoconf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/log.h"
#include "lib/parallel.h"
#include "state/transaction.h"
#include "trees/blocks.h"
#include "trees/names.h"

#define WBLOCKS_GET_REQUEST_MAX (8u << 20) /* bytes of keys one .get may ask */

struct wanted {
	const char *key;          /* into the request text */
	size_t len;
	struct wnode *n;          /* referenced, once found */
	uint64_t size, at;
	int error;                /* of loading it */
};

/* The request's keys, in order: each checked (EINVAL: logged with its
 * line). Blank lines are skipped; the text stays the request's. */
static int parse(const struct transaction *x, struct wanted **out, size_t *count)
{
	const char *text = x->req.text ? x->req.text : "";
	size_t len = x->req.len, n = 0, cap = 0, lineno = 0;
	struct wanted *w = NULL;

	for (size_t pos = 0; pos < len;) {
		const char *nl = memchr(text + pos, '\n', len - pos);
		size_t end = nl ? (size_t)(nl - text) : len, m = end - pos;
		const char *s = text + pos;
		lineno++;
		pos = end + 1;
		if (m && s[m - 1] == '\r')
			m--;
		if (!m)
			continue;
		if (wblocks_key_check(s, m) < 0) {
			free(w);
			return transaction_fail(x, -EINVAL, "line %zu: not a block key (%.*s)",
						lineno, (int)(m < 80 ? m : 80), s);
		}
		if (n == cap) {
			cap = cap ? cap * 2 : 64;
			struct wanted *grown = realloc(w, cap * sizeof(*w));
			if (!grown) {
				free(w);
				return -ENOMEM;
			}
			w = grown;
		}
		w[n++] = (struct wanted){ .key = s, .len = m };
	}
	*out = w;
	*count = n;
	return 0;
}

/* Finds each key not found yet; the index of the first still missing, or n. */
static size_t resolve(struct wtree *bt, struct wanted *w, size_t n)
{
	size_t missing = n;

	for (size_t i = 0; i < n; i++) {
		if (!w[i].n)
			w[i].n = wblocks_find(bt, w[i].key, w[i].len, &w[i].size);
		if (!w[i].n && missing == n)
			missing = i;
	}
	return missing;
}

/* Every miss asked of the cluster at once; what it holds is placed here
 * (checked, kept). 0, or -EIO when the cluster did not answer. */
static int fetch_misses(struct tree *t, struct wtree *bt, struct wanted *w, size_t n)
{
	char **paths = calloc(n, sizeof(*paths));
	struct wvalue *vals = calloc(n, sizeof(*vals));
	int *results = calloc(n, sizeof(*results));
	size_t k = 0;
	int rc = paths && vals && results ? 0 : -ENOMEM;

	for (size_t i = 0; rc == 0 && i < n; i++)
		if (!w[i].n && !(paths[k++] = strndup(w[i].key, w[i].len)))
			rc = -ENOMEM;
	if (rc == 0)
		rc = wcluster_fetch_many(bt, k, (const char *const *)paths, vals, results);
	for (size_t i = 0; i < k && rc != -ENOMEM; i++) {
		if (results[i] == -EIO || results[i] == -ENOMEM)
			rc = results[i];
		else if (results[i] == 0 && wblocks_place(t, bt, paths[i], strlen(paths[i]),
							   &vals[i], true, NULL) < 0)
			rc = -EIO;
	}
	for (size_t i = 0; i < k; i++) {
		free(paths[i]);
		wvalue_free(&vals[i]);
	}
	free(paths);
	free(vals);
	free(results);
	return rc == -ENOENT ? 0 : rc;
}

struct loading {
	struct tree *t;
	struct wanted *w;
	uint8_t *out;
};

static void load_one(void *ctx, size_t i)
{
	struct loading *l = ctx;
	struct wanted *w = &l->w[i];

	w->error = wfile_load(l->t, w->n, l->out + w->at, w->size);
}

/* Every block into the result, checked: ENOENT (removed meanwhile), then EIO. */
static int serve(struct tree *t, struct transaction *x, struct wanted *w, size_t n)
{
	uint64_t total = 0;

	for (size_t i = 0; i < n; i++) {
		w[i].at = total;
		total += w[i].size;
	}
	if (total > SIZE_MAX)
		return -ENOMEM;
	int rc = transaction_result_make(t, x, (size_t)total);
	if (rc < 0)
		return rc;
	struct loading l = { .t = t, .w = w, .out = x->out.bytes };
	parallel_for(n, 16, PARALLEL_THREADS_MAX, load_one, &l);
	int first = 0;
	size_t which = 0;
	for (size_t i = 0; i < n; i++) {
		int e = w[i].error == -ESTALE ? -ENOENT : w[i].error;
		if (e && (!first || (e == -ENOENT && first != -ENOENT)))
			first = e, which = i;
	}
	if (first) {
		transaction_result_free(t, &x->out);
		return transaction_fail(x, first == -ENOENT || first == -ENOMEM ? first : -EIO,
					"key %zu (%.*s) of %zu: not served", which,
					(int)w[which].len, w[which].key, n);
	}
	x->out.len = (size_t)total;
	return 0;
}

static int run(struct tree *t, struct transaction *x)
{
	struct wtree *bt = t->blocks;
	struct wanted *w = NULL;
	size_t n = 0;
	int rc = parse(x, &w, &n);

	if (rc < 0)
		return rc;
	size_t missing = resolve(bt, w, n);
	if (missing < n && t->remote) {
		rc = fetch_misses(t, bt, w, n);
		if (rc == 0)
			missing = resolve(bt, w, n);
		else
			rc = transaction_fail(x, rc, "the cluster did not answer for the keys missing "
						     "here");
	}
	if (rc == 0 && missing < n) {
		for (size_t i = missing; i < n; i++)
			if (!w[i].n)
				counter_inc(bt->c.misses);
		rc = transaction_fail(x, -ENOENT, "key %zu (%.*s) does not exist", missing,
				      (int)w[missing].len, w[missing].key);
	}
	if (rc == 0)
		rc = serve(t, x, w, n);
	for (size_t i = 0; i < n; i++)
		if (w[i].n)
			node_unref(&w[i].n->node, 1);
	free(w);
	return rc;
}

static int get_write(struct tree *t, struct handle *h, uint64_t off, const void *buf, size_t len,
		     uint64_t owner)
{
	int rc = transaction_append(t, (struct transaction *)h, off, buf, len,
				    WBLOCKS_GET_REQUEST_MAX);

	(void)owner;
	if (rc < 0)
		log_warn("get .blocks: write refused (%s)", strerror(-rc));
	return rc;
}

static const struct handle_ops get_ops = {
	.kind = "blocks get",
	.held_kind = HANDLE_BLOCKS_GET,
	.resume = transaction_resume,
	.read = transaction_read,
	.write = get_write,
	.release = transaction_release_free,
	.read_quick = transaction_read_not_quick, /* reads and checks every block asked */
};

int wblocks_get_open(struct tree *t, struct handle **h, struct open_reply *r)
{
	(void)t;
	return transaction_open(&get_ops, run, "get .blocks", h, r);
}
