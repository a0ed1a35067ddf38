/* SPDX-License-Identifier: Apache-2.0 */
/* The records of a .blocks/.put (DESIGN.md §10) as its bytes come:
 * <key>\n<u64 little-endian length><payload>, each committed on its own
 * (blocks_keys.c) once whole, those one write completes side by side on
 * the daemon's thread pool, and each one's result line. */
#include "autoconf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/log.h"
#include "lib/parallel.h"
#include "lib/sha256.h"
#include "trees/blocks.h"
#include "trees/names.h"

/* A record's outcome: its result line, and the batch's errno if first. */
void wblocks_put_line(struct wput *p, const char *key, size_t key_len, int rc)
{
	size_t need = p->lines_len + key_len + 16;

	if (rc && !p->first_error)
		p->first_error = rc;
	p->records++;
	if (need > p->lines_cap) {
		size_t cap = p->lines_cap ? p->lines_cap * 2 : 4096;
		while (cap < need)
			cap *= 2;
		char *grown = cap <= WBLOCKS_LINES_MAX ? realloc(p->lines, cap) : NULL;
		if (!grown) {
			if (!p->first_error)
				p->first_error = -ENOMEM; /* the lines are incomplete: the batch says so */
			return;
		}
		p->lines = grown;
		p->lines_cap = cap;
	}
	char *at = p->lines + p->lines_len;
	for (size_t i = 0; i < key_len; i++) /* a bad key may hold anything */
		at[i] = key[i] > ' ' && key[i] < 0x7f ? key[i] : '?';
	if (!key_len)
		at[0] = '-';
	size_t klen = key_len ? key_len : 1;
	p->lines_len += klen + (size_t)snprintf(at + klen, 16, " %s\n", errno_name(-rc));
}

void wblocks_put_reset(struct wput *p)
{
	wvalue_free(&p->v);
	p->key_len = p->len_have = 0;
	p->body_len = p->body_have = 0;
	p->record_error = 0;
	p->state = PUT_KEY;
}

static int record_commit(struct tree *t, const char *key, size_t key_len, struct wvalue *v)
{
	sha256_once(v->val + 32, v->size, v->val);
	int rc = wblocks_place(t, t->blocks, key, key_len, v, false, NULL);
	if (rc == -ENAMETOOLONG)
		rc = -EINVAL;
	else if (rc < 0 && rc != -EEXIST && rc != -ENOSPC && rc != -ENOMEM)
		rc = -EIO;
	if (rc < 0 && rc != -ENOSPC)
		log_warn("put .blocks: %.*s: %s", (int)key_len, key, strerror(-rc));
	return rc;
}

static void commit_one(void *ctx, size_t i)
{
	struct wput *p = ctx;
	struct precord *r = &p->queue[i];

	if (!r->error)
		r->error = record_commit(p->t, r->key, r->key_len, &r->v);
}

/* Whether two queued records name one key: then they commit one after
 * the other, in order (the first stays), not side by side. */
static bool queue_repeats(const struct wput *p)
{
	for (size_t i = 1; i < p->nqueued; i++)
		for (size_t j = 0; j < i; j++)
			if (p->queue[i].key_len == p->queue[j].key_len &&
			    memcmp(p->queue[i].key, p->queue[j].key, p->queue[i].key_len) == 0)
				return true;
	return false;
}

/* The queued records committed (or refused), their lines in order. */
static void queue_flush(struct wput *p)
{
	if (!p->nqueued)
		return;
	if (p->nqueued > 1 && !queue_repeats(p))
		parallel_for(p->nqueued, WBLOCKS_PUT_PER_THREAD, PARALLEL_THREADS_MAX, commit_one, p);
	else
		for (size_t i = 0; i < p->nqueued; i++)
			commit_one(p, i);
	for (size_t i = 0; i < p->nqueued; i++) {
		struct precord *r = &p->queue[i];
		wblocks_put_line(p, r->key, r->key_len, r->error);
		free(r->key);
		wvalue_free(&r->v);
	}
	p->nqueued = 0;
}

/* The record just read whole (its body, or its refusal) joins the queue. */
static void record_end(struct wput *p, int error)
{
	if (p->nqueued == p->queue_cap) {
		size_t cap = p->queue_cap ? p->queue_cap * 2 : 16;
		struct precord *grown = realloc(p->queue, cap * sizeof(*grown));
		if (!grown) {
			error = error ? error : -ENOMEM;
			wblocks_put_line(p, p->key, p->key_len, error);
			wblocks_put_reset(p);
			return;
		}
		p->queue = grown;
		p->queue_cap = cap;
	}
	struct precord *r = &p->queue[p->nqueued];
	r->key = malloc(p->key_len + 1);
	r->key_len = p->key_len;
	r->error = r->key ? error : -ENOMEM;
	r->v = p->v;
	p->v = (struct wvalue){ 0 };
	if (r->key)
		memcpy(r->key, p->key, p->key_len);
	p->nqueued++;
	wblocks_put_reset(p);
	if (p->nqueued == WBLOCKS_PUT_GROUP)
		queue_flush(p);
}

/* The key line's bytes up to its '\n'; the bytes taken. */
static size_t take_key(struct wput *p, const uint8_t *buf, size_t len)
{
	const uint8_t *nl = memchr(buf, '\n', len);
	size_t n = nl ? (size_t)(nl - buf) : len;

	if (p->key_len + n > WBLOCKS_LINE_MAX) {
		log_warn("put .blocks: record %llu: a key line of more than %u bytes; the batch "
			 "ends (EBADMSG)", (unsigned long long)p->records, WBLOCKS_LINE_MAX);
		p->state = PUT_DEAD;
		if (!p->first_error)
			p->first_error = -EBADMSG;
		return len;
	}
	memcpy(p->key + p->key_len, buf, n);
	p->key_len += n;
	if (!nl)
		return n;
	p->state = PUT_LEN;
	if (wblocks_key_check(p->key, p->key_len) < 0)
		p->record_error = -EINVAL;
	return n + 1;
}

static void take_len(struct tree *t, struct wput *p, const uint8_t *buf, size_t n)
{
	memcpy(p->len_buf + p->len_have, buf, n);
	if ((p->len_have += n) < 8)
		return;
	uint64_t len = 0;
	for (int i = 7; i >= 0; i--)
		len = len << 8 | p->len_buf[i];
	p->body_len = len;
	if (!p->record_error && len > t->blocks->max_file)
		p->record_error = -EFBIG;
	if (!p->record_error && !(p->v.val = malloc(32 + len)))
		p->record_error = -ENOMEM;
	p->v.size = len;
	p->state = p->record_error ? PUT_SKIP : PUT_BODY;
}

int wblocks_put_consume(struct tree *t, struct wput *p, const uint8_t *buf, size_t len)
{
	while (len && p->state != PUT_DEAD) {
		size_t n = len;
		switch (p->state) {
		case PUT_KEY:
			n = take_key(p, buf, len);
			break;
		case PUT_LEN:
			n = 8 - p->len_have < len ? 8 - p->len_have : len;
			take_len(t, p, buf, n);
			break;
		case PUT_BODY:
		case PUT_SKIP:
			n = p->body_len - p->body_have < len ? (size_t)(p->body_len - p->body_have)
							      : len;
			if (p->state == PUT_BODY)
				memcpy(p->v.val + 32 + p->body_have, buf, n);
			p->body_have += n;
			break;
		default:
			return -EINVAL;
		}
		buf += n;
		len -= n;
		/* A body complete (also one of no bytes) ends its record. */
		if ((p->state == PUT_BODY || p->state == PUT_SKIP) && p->body_have == p->body_len)
			record_end(p, p->state == PUT_SKIP ? p->record_error : 0);
	}
	queue_flush(p);
	return p->state == PUT_DEAD ? -EBADMSG : 0;
}
