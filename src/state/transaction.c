/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "lib/log.h"
#include "state/ids.h"
#include "state/transaction.h"

/* A kept buffer of at least map bytes (and not four times more; map is
 * counted already, the rest of it is counted here), taken out of the
 * tree's few, as its last result left it: every caller writes each byte of
 * a result before it serves one, or frees it (transaction.h), so clearing
 * it first (4-22 %, median 6 %, of a .keys/.get of 64 on the GPU host:
 * bench/RESULTS, 2026-12-07) buys nothing.
 * Faulting in fresh pages, and the unmap of the last buffer (a TLB
 * shootdown on every CPU the daemon's threads ran on), are saved. */
static bool result_reuse(struct tree *t, struct transaction_result *r, size_t map)
{
	struct kept_result k = { NULL, 0 };

	pthread_mutex_lock(&t->results_mu);
	for (unsigned i = 0; i < t->nresults_kept; i++) {
		if (t->results_kept[i].map < map || t->results_kept[i].map / 4 > map)
			continue;
		k = t->results_kept[i];
		t->results_kept[i] = t->results_kept[--t->nresults_kept];
		break;
	}
	pthread_mutex_unlock(&t->results_mu);
	if (!k.bytes)
		return false;
	if (k.map > map && !transaction_memory_take(t, k.map - map)) {
		munmap(k.bytes, k.map); /* too big for what is left of materialize_max */
		return false;
	}
	r->bytes = k.bytes;
	r->map = k.map;
	return true;
}

static int result_map(struct tree *t, struct transaction_result *r, size_t size)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	size_t map = (size + page - 1) / page * page;

	r->bytes = NULL;
	r->len = r->map = 0;
	if (!size)
		return 0;
	if (!transaction_memory_take(t, map))
		return -EDQUOT;
	if (result_reuse(t, r, map))
		return 0;
	void *p = mmap(NULL, map, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		transaction_memory_give(t, map);
		return -ENOMEM;
	}
	r->bytes = p;
	r->map = map;
	return 0;
}

void transaction_result_free(struct tree *t, struct transaction_result *r)
{
	if (r->bytes) {
		transaction_memory_give(t, r->map);
		bool kept = false;
		if (r->map <= RESULT_KEPT_MAX) {
			pthread_mutex_lock(&t->results_mu);
			if (t->nresults_kept < RESULTS_KEPT) {
				t->results_kept[t->nresults_kept++] =
					(struct kept_result){ r->bytes, r->map };
				kept = true;
			}
			pthread_mutex_unlock(&t->results_mu);
		}
		if (!kept)
			munmap(r->bytes, r->map);
	}
	r->bytes = NULL;
	r->len = r->map = 0;
}

void transaction_results_drop(struct tree *t)
{
	pthread_mutex_lock(&t->results_mu);
	for (unsigned i = 0; i < t->nresults_kept; i++)
		munmap(t->results_kept[i].bytes, t->results_kept[i].map);
	t->nresults_kept = 0;
	pthread_mutex_unlock(&t->results_mu);
}

int transaction_result_make(struct tree *t, struct transaction *x, size_t size)
{
	int rc = result_map(t, &x->out, size);

	if (rc == -EDQUOT) {
		counter_inc(&t->metrics.materialize_refused);
		return transaction_fail(x, -ENOMEM, "a %zu-byte result would exceed materialize_max=%"
					PRIu64 " (%" PRIu64 " bytes held by open .materialize files)",
					size, t->cfg->materialize_max,
					atomic_load(&t->materialize_held));
	}
	if (rc < 0)
		return transaction_fail(x, -ENOMEM, "no memory for a %zu-byte result", size);
	return 0;
}

/* Room for cap bytes of request text: in the handle's record in the
 * holder's memory when it has one. 0 or -ENOMEM. */
static int request_text_grow(struct tree *t, struct transaction *x, size_t cap)
{
	struct request_text *rt = &x->req;
	struct held_handle *rec = x->h.fh ? ids_handle_record(t, x->h.fh) : NULL;

	if (!transaction_memory_take(t, cap - rt->cap))
		return -ENOMEM;
	if (rec) {
		if (held_text_reserve(&t->held, rec, cap) < 0) {
			transaction_memory_give(t, cap - rt->cap);
			return -ENOMEM;
		}
		rt->text = (char *)held_text(&t->held, rec);
		rt->held = true;
		rt->cap = cap;
		return 0;
	}
	char *grown = realloc(rt->text, cap);
	if (!grown) {
		transaction_memory_give(t, cap - rt->cap);
		return -ENOMEM;
	}
	rt->text = grown;
	rt->cap = cap;
	return 0;
}

/* A write at off: what lies before the end must be what is there already
 * (a write a daemon that died had taken, sent again by the kernel); the
 * rest is appended. */
static int request_text_append(struct tree *t, struct transaction *x, uint64_t off,
			       const void *buf, size_t len, size_t max)
{
	struct request_text *rt = &x->req;
	size_t again = 0;

	if (off > rt->len)
		return -EINVAL;
	if (off < rt->len) {
		again = rt->len - off < len ? rt->len - (size_t)off : len;
		if (memcmp(rt->text + off, buf, again) != 0)
			return -EINVAL;
	}
	size_t more = len - again;
	if (more > max - rt->len)
		return -EFBIG;
	if (!more)
		return (int)len;
	if (rt->len + more > rt->cap) {
		size_t cap = rt->cap ? rt->cap : 4096;
		while (cap < rt->len + more)
			cap *= 2;
		int rc = request_text_grow(t, x, cap);
		if (rc < 0)
			return rc;
	}
	memcpy(rt->text + rt->len, (const char *)buf + again, more);
	rt->len += more;
	if (rt->held) /* the bytes are in before the record says so */
		ids_handle_record(t, x->h.fh)->text_len = rt->len;
	return (int)len;
}

static void request_text_free(struct tree *t, struct request_text *rt)
{
	transaction_memory_give(t, rt->cap);
	if (!rt->held) /* else its pages go with the handle's record */
		free(rt->text);
	memset(rt, 0, sizeof(*rt));
}

int transaction_resume(struct tree *t, struct handle *h)
{
	struct transaction *x = (struct transaction *)h;
	struct held_handle *rec = ids_handle_record(t, x->h.fh);

	if (!rec || !rec->text_cap)
		return 0;
	if (!transaction_memory_take(t, rec->text_cap))
		return -ENOMEM;
	x->req.text = (char *)held_text(&t->held, rec);
	x->req.len = rec->text_len <= rec->text_cap ? rec->text_len : rec->text_cap;
	x->req.cap = rec->text_cap;
	x->req.held = true;
	return 0;
}

void transaction_init(struct transaction *x, const struct handle_ops *ops,
		      int (*run)(struct tree *t, struct transaction *x))
{
	handle_init(&x->h, ops);
	pthread_mutex_init(&x->mu, NULL);
	x->run = run;
}

int transaction_append(struct tree *t, struct transaction *x, uint64_t off, const void *buf,
		       size_t len, size_t max)
{
	int rc;

	pthread_mutex_lock(&x->mu);
	if (x->done)
		rc = -EINVAL; /* one transaction per open: reopen for another */
	else
		rc = request_text_append(t, x, off, buf, len, max);
	pthread_mutex_unlock(&x->mu);
	return rc;
}

int transaction_read(struct tree *t, struct handle *h, uint64_t off, size_t size,
		     const void **data, size_t *len)
{
	struct transaction *x = (struct transaction *)h;

	pthread_mutex_lock(&x->mu);
	if (!x->done) {
		x->error = x->run(t, x);
		x->done = true;
	}
	pthread_mutex_unlock(&x->mu);
	if (x->error)
		return x->error;
	buffer_slice(x->out.bytes, x->out.len, off, size, data, len);
	return 0;
}

int transaction_fail(const struct transaction *x, int err, const char *fmt, ...)
{
	char msg[384];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	log_warn("%s: %s (%s)", x->who, msg, strerror(-err));
	return err;
}

void transaction_release(struct tree *t, struct transaction *x)
{
	transaction_result_free(t, &x->out);
	request_text_free(t, &x->req);
	pthread_mutex_destroy(&x->mu);
}

int transaction_open(const struct handle_ops *ops, int (*run)(struct tree *t, struct transaction *x),
		     const char *who, struct handle **h, struct open_reply *r)
{
	struct transaction *x = calloc(1, sizeof(*x));

	if (!x)
		return -ENOMEM;
	transaction_init(x, ops, run);
	snprintf(x->who, sizeof(x->who), "%s", who);
	r->direct_io = true;
	*h = &x->h;
	return 0;
}

void transaction_release_free(struct tree *t, struct handle *h)
{
	transaction_release(t, (struct transaction *)h);
	free(h);
}

bool transaction_read_not_quick(struct tree *t, struct handle *h)
{
	(void)t, (void)h;
	return false;
}
