/* SPDX-License-Identifier: Apache-2.0 */
/* The queue of a batch file (r3/put.c), its buffer, and the flushes that
 * stage and commit its records.
 *
 * Records are not committed as their bytes arrive but queued, and a full
 * queue is flushed (when the next record begins): each record is staged
 * (its temporary file, writing it, hashing it) and committed as a single
 * publish would be (DESIGN.md §3.7), on a few threads at once. The outcome
 * is that of single publishes in order: records of different keys are
 * independent, and a record whose key an earlier record of the queue has
 * commits after it, in order; the result lines come in order. A large
 * write (most of a batch, as engines send it) is not queued whole first: a
 * flush begins with it, and each record is staged as soon as it is read
 * while the rest is read. The write is answered once its records are read;
 * its flush ends after that, before the batch's next request is served
 * (which waits for it awake where CPUs are to spare), so the client's next
 * request is on its way while the last records commit.
 *
 * Memory: a batch file buffers at most PUT_QUEUE_BYTES of queued records
 * (charged to materialize_max=, like every transaction file's memory) and
 * PUT_PIPELINE queue entries. A record larger than PUT_BUFFER_RECORD_MAX,
 * or one that finds no memory, is not buffered: the queue is flushed and
 * the record's bytes go to its publish as they come. */
#include "autoconf.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "format/envelope.h"
#include "lib/parallel.h"
#include "r3/publish.h"
#include "r3/put_i.h"
#include "remote/remote.h"

/* Starts the publish of a record: its version (for .keys/.put the key-only
 * one, made again if collected meanwhile), its object, its handle. */
int put_queue_publish_begin(struct tree *t, struct version *ver, struct put_rec *r)
{
	struct version *v = ver; /* referenced */
	int rc = 0;

	if (v)
		node_ref(&v->node);
	else
		rc = version_keyonly(t, &v);
	for (int attempt = 0; rc == 0; attempt++) {
		struct object *o = object_new(v, r->hash, r->hash_len);
		rc = o ? publish_begin(t, o, &r->pub) : -ENOMEM;
		if (o)
			node_unref(&o->node, 1);
		if (rc != -ENOENT || ver || attempt == 2)
			break;
		/* The key-only version was collected (ttl=) meanwhile: a new one. */
		node_unref(&v->node, 1);
		v = NULL;
		rc = version_keyonly(t, &v);
	}
	if (v)
		node_unref(&v->node, 1);
	return rc;
}

/* A queued record's envelope. */
static const uint8_t *rec_bytes(const struct put *p, const struct put_rec *r)
{
	return r->in_write ? r->in_write : p->buf + r->off;
}

/* Everything of a queued record short of its commit. */
static void stage(struct tree *t, struct put *p, struct put_rec *r)
{
	if (r->refused || r->streamed)
		return; /* nothing to do, or done as its bytes came */
	int rc = put_queue_publish_begin(t, p->ver, r);
	if (rc < 0) {
		/* Not in refused: the reading thread reads that of queued
		 * records (key_queued) while this one stages. */
		r->staged = rc;
		return;
	}
	/* A refusal is sticky in the publish: publish_check says it. */
	publish_write_parsed(t, r->pub, &r->env, rec_bytes(p, r), envelope_total_len(&r->env),
			     p->owner);
	r->staged = publish_check(t, r->pub, &r->to_cluster);
}

struct spent {
	struct tree *t;
	struct put *p;
};

static void release_spent_one(void *ctx, size_t i)
{
	struct spent *s = ctx;

	handle_put(s->t, s->p->spent[i]); /* closes its temporary file */
}

/* Releases the publishes of the flush before. */
void put_queue_release_spent(struct tree *t, struct put *p)
{
	struct spent s = { t, p };

	parallel_for(p->nspent, PUT_PER_THREAD, PARALLEL_THREADS_MAX, release_spent_one, &s);
	p->nspent = 0;
}

/* The lines of records from..to, staged, in order: their publishes'
 * fsyncs, which commit those not committed yet, in order, and answer
 * again what the others came to. The publishes are released later
 * (put_queue_release_spent), out of the in-order lines. */
static void commit_recs(struct flush *f, size_t from, size_t to)
{
	for (size_t i = from; i < to; i++) {
		struct put_rec *r = &f->p->queue[i];
		int rc = r->refused ? r->refused : r->staged;
		if (r->pub)
			rc = r->pub->ops->fsync(f->t, r->pub);
		rc = put_lines_add(f->t, f->p, r->key, rc);
		if (rc < 0 && !f->rc)
			f->rc = rc;
	}
}

/* Writes, in order, the lines of the records that every record before is
 * done for; by one thread at a time. A thread that finds another at it
 * leaves: that one looks again after it stops. */
static void commit_ready(struct flush *f)
{
	while (pthread_mutex_trylock(&f->chain) == 0) {
		size_t i = atomic_load(&f->next), n = atomic_load(&f->avail), k = i;
		while (k < n && atomic_load(&f->ready[k]))
			k++;
		if (k > i)
			commit_recs(f, i, k);
		atomic_store(&f->next, k);
		pthread_mutex_unlock(&f->chain);
		if (!(k < atomic_load(&f->avail) && atomic_load(&f->ready[k])))
			return; /* else one became ready while this thread held the chain */
	}
}

/* Waits until record i is in the queue, or no more records join: false
 * then. The wait lasts while the thread reading the write parses. */
static bool record_ready(struct flush *f, size_t i)
{
	for (unsigned spins = 0; i >= atomic_load(&f->avail); spins++) {
		if (atomic_load(&f->closed))
			return i < atomic_load(&f->avail);
		if (spins < 256) {
#if defined(__x86_64__) || defined(__i386__)
			__builtin_ia32_pause();
#endif
		} else
			sched_yield();
	}
	return true;
}

static void stage_one(void *ctx, size_t i)
{
	struct flush *f = ctx;

	if (!record_ready(f, i))
		return;
	struct put_rec *r = &f->p->queue[i];
	stage(f->t, f->p, r);
	if (f->t->remote)
		return; /* the cluster round comes first (commit_round) */
	if (r->pub && !r->after_same_key)
		r->pub->ops->fsync(f->t, r->pub); /* the chain reads its outcome again */
	atomic_store(&f->ready[i], true);
	commit_ready(f);
}

/* Begins a flush of the records queued, to which more may join up to
 * items in all (streaming); side by side only when threads > 1. */
void put_queue_flush_begin(struct tree *t, struct put *p, size_t threads, size_t items)
{
	struct flush *f = &p->flush;

	f->t = t;
	f->p = p;
	f->open = true;
	f->rc = 0;
	atomic_init(&f->avail, p->nqueued);
	atomic_init(&f->closed, false);
	atomic_init(&f->next, 0);
	for (size_t i = 0; i < PUT_PIPELINE; i++)
		atomic_init(&f->ready[i], false);
	pthread_mutex_init(&f->chain, NULL);
	parallel_begin(&f->loop, items, PUT_PER_THREAD, threads, stage_one, f);
}

/* With remote=: the staged records go to the cluster, in one pipelined
 * round per node, then commit here in order. */
static void commit_round(struct flush *f)
{
	struct tree *t = f->t;
	struct put *p = f->p;
	size_t n = p->nqueued, k = 0;
	const char *keys[PUT_PIPELINE];
	const void *vals[PUT_PIPELINE];
	size_t lens[PUT_PIPELINE], which[PUT_PIPELINE];
	uint8_t *bufs[PUT_PIPELINE] = { 0 };
	int results[PUT_PIPELINE];

	for (size_t i = 0; i < n; i++) {
		struct put_rec *r = &p->queue[i];
		if (!r->pub)
			continue;
		if (r->streamed) { /* its bytes are in its temporary file only */
			if (publish_prepare(t, r->pub, &bufs[i], &lens[k]) < 0 || !bufs[i])
				continue;
			vals[k] = bufs[i];
		} else if (r->staged == 0 && r->to_cluster) {
			vals[k] = rec_bytes(p, r);
			lens[k] = envelope_total_len(&r->env);
		} else
			continue;
		keys[k] = r->key;
		which[k++] = i;
	}
	if (k)
		remote_put_many(t->remote, k, keys, vals, lens, results);
	for (size_t j = 0; j < k; j++)
		publish_remote_result(t, p->queue[which[j]].pub, results[j]);
	commit_recs(f, 0, n);
	for (size_t i = 0; i < n; i++)
		free(bufs[i]);
}

/* Side by side only when all of the bytes fit in the store at once: else a
 * record could be refused (ENOSPC) for room that records after it hold.
 * Then one at a time, each committed before the next begins. */
size_t put_queue_flush_threads(struct tree *t, uint64_t bytes)
{
	return publish_room_for(t, bytes) ? PARALLEL_THREADS_MAX : 1;
}

/* Stages and commits every queued record (ending the flush that a write
 * began, if any); then the queue is empty. */
int put_queue_flush(struct tree *t, struct put *p)
{
	struct flush *f = &p->flush;
	size_t n = p->nqueued;

	if (!f->open) {
		if (!n)
			return 0;
		put_queue_flush_begin(t, p, put_queue_flush_threads(t, p->buf_len), n);
	}
	atomic_store(&f->closed, true);
	parallel_end(&f->loop);
	f->open = false;
	if (t->remote)
		commit_round(f);
	else
		commit_ready(f); /* nothing is left: every record is staged */
	pthread_mutex_destroy(&f->chain);
	put_queue_release_spent(t, p);
	for (size_t i = 0; i < n; i++)
		if (p->queue[i].pub) {
			p->spent[p->nspent++] = p->queue[i].pub;
			p->queue[i].pub = NULL;
		}
	p->nqueued = 0;
	p->buf_len = 0;
	return f->rc;
}

/* Whether a record queued before r, not refused, has r's key. */
static bool key_queued(const struct put *p, const struct put_rec *r)
{
	uint64_t a, b;

	if (r->refused)
		return false;
	memcpy(&a, r->key, sizeof(a));
	for (size_t i = 0; i < p->nqueued; i++) {
		const struct put_rec *q = &p->queue[i];
		memcpy(&b, q->key, sizeof(b));
		if (a == b && !q->refused && memcmp(q->key, r->key, 64) == 0)
			return true;
	}
	return false;
}

/* The record in progress joins the queue (and an open flush). A full
 * queue is flushed when the next record begins (flush_if_full),
 * not now: a write whose last record fills it is answered before its
 * flush ends (put_write_end), as a batch of PUT_PIPELINE records is. */
void put_queue_add(struct put *p)
{
	p->cur.after_same_key = key_queued(p, &p->cur);
	p->queue[p->nqueued++] = p->cur;
	p->cur.pub = NULL;
	p->seen++;
	if (p->flush.open)
		atomic_store(&p->flush.avail, p->nqueued);
}

/* ---- its buffer ---------------------------------------------------------- */

/* Capacity for want bytes: doubling from 64 KiB, at most PUT_QUEUE_BYTES. */
static size_t buffer_cap_for(const struct put *p, size_t want)
{
	size_t cap = p->buf_cap ? p->buf_cap : 64u << 10;

	while (cap < want)
		cap *= 2;
	return cap < PUT_QUEUE_BYTES ? cap : PUT_QUEUE_BYTES;
}

/* Room in the buffer for n more bytes (within PUT_QUEUE_BYTES, the queue
 * flushed first when needed); false when no memory can be had. It grows
 * at once for the rest of the write in progress, which mostly holds more
 * records like this one: one allocation, not a copy at every doubling. */
bool put_queue_buffer_room(struct tree *t, struct put *p, size_t n)
{
	if (p->buf_len + n > PUT_QUEUE_BYTES)
		put_queue_flush(t, p); /* a line it could not write makes fsync ENOMEM */
	if (p->buf_len + n <= p->buf_cap)
		return true;
	if (p->flush.open) /* its stagers read the buffer: it stays in place */
		put_queue_flush(t, p);
	size_t cap = buffer_cap_for(p, p->buf_len + (p->write_left > n ? p->write_left : n));
	if (!transaction_memory_take(t, cap - p->buf_cap)) {
		cap = buffer_cap_for(p, p->buf_len + n);
		if (!transaction_memory_take(t, cap - p->buf_cap))
			return false;
	}
	uint8_t *grown = realloc(p->buf, cap);
	if (!grown) {
		transaction_memory_give(t, cap - p->buf_cap);
		return false;
	}
	p->buf = grown;
	p->buf_cap = cap;
	return true;
}

void put_queue_buffer_free(struct tree *t, struct put *p)
{
	transaction_memory_give(t, p->buf_cap);
	free(p->buf);
	p->buf = NULL;
	p->buf_len = p->buf_cap = 0;
}
