/* SPDX-License-Identifier: Apache-2.0 */
/* .blocks/.put (DESIGN.md §10): records <key>\n<u64 little-endian
 * length><payload>, back to back, any write sizes (records may span
 * writes; writes are sequential). Each record is committed on its own as
 * soon as its last byte arrives (blocks_keys.c: a key held already keeps
 * its first bytes, 0). fsync, close, or a read from offset 0 end the
 * transaction: 0 when every record committed, else the errno of the first
 * that did not; a record cut short is EBADMSG and commits nothing. A read
 * from offset 0 then gives one line per record, "<key> <0|EEXIST|EINVAL|
 * EBADMSG|ENOSPC|EFBIG|EIO>". A key line of more than 4096 bytes ends
 * the batch (EBADMSG: the stream cannot be followed after it).
 *
 * A daemon that dies during a batch: the records it committed stay, each
 * whole; the next daemon answers the writer's next call EIO, once (as
 * .keys/.put, §8), and the retry of the batch succeeds (committed records
 * are identical: 0). */
#include "autoconf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/log.h"
#include "lib/parallel.h"
#include "lib/sha256.h"
#include "state/ids.h"
#include "trees/blocks.h"
#include "trees/names.h"

#define WBLOCKS_LINES_MAX (16u << 20) /* bytes of result lines one batch keeps */
/* A key line longer than a key is that record's EINVAL up to this many
 * bytes; past them the stream is not one of records (the batch ends). */
#define WBLOCKS_LINE_MAX 4096

/* Records a write completes are committed together, spread over a few
 * threads (each costs a few system calls), at most this many at once. */
#define WBLOCKS_PUT_GROUP 256
#define WBLOCKS_PUT_PER_THREAD 8

enum put_state { PUT_KEY, PUT_LEN, PUT_BODY, PUT_SKIP, PUT_DONE, PUT_DEAD };

/* A record read whole, waiting for its commit (or its refusal: error). */
struct precord {
	char *key;               /* malloc'd, key_len bytes (printable or not) */
	size_t key_len;
	struct wvalue v;
	int error;
};

struct wput {
	struct handle h;
	pthread_mutex_t mu;
	enum put_state state;
	uint64_t received;       /* bytes of the stream */
	uint64_t owner;          /* the file table that writes */
	char key[WBLOCKS_LINE_MAX];
	size_t key_len;
	uint8_t len_buf[8];
	size_t len_have;
	uint64_t body_len, body_have;
	struct wvalue v;         /* SHA-256, then the body */
	int record_error;        /* decided before its body: EINVAL, EFBIG */
	char *lines;
	size_t lines_len, lines_cap;
	int first_error;
	uint64_t records;
	struct precord *queue;   /* records read whole, not committed yet */
	size_t nqueued, queue_cap;
	struct tree *t;          /* for the commit threads */
};

/* A record's outcome: its result line, and the batch's errno if first. */
static void line_add(struct wput *p, const char *key, size_t key_len, int rc)
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

static void record_reset(struct wput *p)
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
		line_add(p, r->key, r->key_len, r->error);
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
			line_add(p, p->key, p->key_len, error);
			record_reset(p);
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
	record_reset(p);
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

static int consume(struct tree *t, struct wput *p, const uint8_t *buf, size_t len)
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

static int put_write(struct tree *t, struct handle *h, uint64_t off, const void *buf, size_t len,
		     uint64_t owner)
{
	struct wput *p = (struct wput *)h;
	int rc;

	pthread_mutex_lock(&p->mu);
	if (p->state == PUT_DONE)
		rc = -EINVAL; /* one transaction per open */
	else if (p->state == PUT_DEAD)
		rc = -EBADMSG;
	else if (off != p->received)
		rc = -EINVAL; /* records are a stream: sequential writes only */
	else {
		if (p->received == 0) { /* a daemon that takes over cannot go on with it */
			revive_note(t, h, REVIVE_BUSY);
			p->owner = owner;
		}
		rc = consume(t, p, buf, len);
		p->received += len;
	}
	pthread_mutex_unlock(&p->mu);
	if (rc < 0 && rc != -EBADMSG)
		log_warn("put .blocks: write refused (%s)", strerror(-rc));
	return rc < 0 ? rc : (int)len;
}

/* Ends the transaction (under mu): a record cut short is EBADMSG. */
static int put_end(struct wput *p)
{
	if (p->state == PUT_DONE)
		return p->first_error;
	bool cut = p->state == PUT_LEN || p->state == PUT_BODY || p->state == PUT_SKIP ||
		   (p->state == PUT_KEY && p->key_len);
	if (cut) {
		log_warn("put .blocks: record %llu (%.*s) cut short; nothing of it committed",
			 (unsigned long long)p->records, (int)p->key_len, p->key);
		line_add(p, p->key, p->key_len, -EBADMSG);
	}
	record_reset(p);
	p->state = PUT_DONE;
	return p->first_error;
}

static int put_fsync(struct tree *t, struct handle *h)
{
	struct wput *p = (struct wput *)h;

	(void)t;
	pthread_mutex_lock(&p->mu);
	int rc = put_end(p);
	pthread_mutex_unlock(&p->mu);
	return rc;
}

/* The writer's close ends the batch; a close before any write (a shell's
 * dup2 of the descriptor it redirects) or by another file table does not. */
static int put_flush(struct tree *t, struct handle *h, uint64_t owner)
{
	struct wput *p = (struct wput *)h;

	(void)t;
	pthread_mutex_lock(&p->mu);
	bool foreign = p->state != PUT_DONE &&
		       (!p->received || (owner && p->owner && owner != p->owner &&
					 owner != TREE_OWNER_KILLED));
	int rc = foreign ? 0 : put_end(p);
	pthread_mutex_unlock(&p->mu);
	return rc;
}

/* A read from offset 0 ends the transaction as fsync does; the lines. */
static int put_read(struct tree *t, struct handle *h, uint64_t off, size_t size,
		    const void **data, size_t *len)
{
	struct wput *p = (struct wput *)h;

	(void)t;
	pthread_mutex_lock(&p->mu);
	if (off == 0)
		put_end(p);
	bool done = p->state == PUT_DONE;
	pthread_mutex_unlock(&p->mu);
	if (!done)
		return -EINVAL;
	buffer_slice(p->lines, p->lines_len, off, size, data, len);
	return 0;
}

static void put_release(struct tree *t, struct handle *h)
{
	struct wput *p = (struct wput *)h;

	(void)t;
	wvalue_free(&p->v);
	free(p->queue); /* empty: every write flushes it */
	free(p->lines);
	pthread_mutex_destroy(&p->mu);
	free(p);
}

static bool never_quick(struct tree *t, struct handle *h)
{
	(void)t, (void)h;
	return false;
}

static bool write_never_quick(struct tree *t, struct handle *h, size_t len)
{
	(void)t, (void)h, (void)len;
	return false; /* commits blocks, with remote= through the cluster */
}

static const struct handle_ops put_ops = {
	.kind = "blocks put",
	.held_kind = HANDLE_BLOCKS_PUT,
	.read = put_read,
	.write = put_write,
	.flush = put_flush,
	.fsync = put_fsync,
	.release = put_release,
	.read_quick = never_quick,
	.write_quick = write_never_quick,
	.flush_quick = never_quick,
};

int wblocks_put_open(struct tree *t, struct handle **h, struct open_reply *r)
{
	struct wput *p = calloc(1, sizeof(*p));

	if (!p)
		return -ENOMEM;
	handle_init(&p->h, &put_ops);
	pthread_mutex_init(&p->mu, NULL);
	p->t = t;
	p->state = PUT_KEY;
	r->direct_io = true; /* what is read is not what was written */
	*h = &p->h;
	return 0;
}
