/* SPDX-License-Identifier: Apache-2.0 */
/* Batch publishing (DESIGN.md §3.7): the open .keys/.put or <wv>/.put
 * file, one transaction. Its requests (write, fsync, flush, read,
 * release) and their locking. Its records are read in put_records.c,
 * queued, staged and committed in put_queue.c, and handed to the next
 * daemon in put_handover.c; the result lines it answers with are kept in
 * put_lines.c. */
#include "autoconf.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "format/envelope.h"
#include "lib/log.h"
#include "lib/parallel.h"
#include "r3/put.h"
#include "r3/put_i.h"
#include "state/ids.h"

/* ---- the requests -------------------------------------------------------- */

static bool lock_taken(void *mu)
{
	return pthread_mutex_trylock(mu) == 0;
}

/* The batch's lock, for the request after a write: the write's reply
 * goes out before its records commit (put_write_end), so the next request
 * mostly finds it held for a little longer. It waits awake, up to
 * PUT_WAIT_AWAKE_NS: a thread put to sleep costs a wake-up, tens of
 * microseconds on a virtual machine, when the lock is given back. */
static void lock_after_write(struct put *p)
{
	if (!parallel_wait_awake() || !parallel_spin(lock_taken, &p->mu, PUT_WAIT_AWAKE_NS))
		pthread_mutex_lock(&p->mu);
}

/* A daemon that dies (kill -9) during a batch: the records it committed
 * stay committed, each whole (a record commits as a single publish does:
 * its file linked at once, or not at all); those queued or being read are
 * not. The batch's handle is then this daemon's alone (REVIVE_BUSY): the
 * next daemon answers its writer's next call EIO, once, without result
 * lines, and the retry of the same batch succeeds (a record already
 * committed is identical: 0). So DESIGN.md §8's "nothing of it committed"
 * holds for a single publish; for a batch it is "none of the records not
 * yet committed", never a part of a record. Taking back records other
 * clients may have read already (.get, .keys/) would be worse than keeping
 * them, and §3.7 promises each record on its own. */

/* The write's records are read (and those it completes begin staging);
 * what they come to is known after put_write_end, which ends the flush
 * the write began: the reply goes out meanwhile, and the batch stays
 * locked until then, so that the client's next request waits for it. */
static int put_write_begin(struct tree *t, struct handle *h, uint64_t off, const void *buf,
			   size_t len, uint64_t owner)
{
	struct put *p = (struct put *)h;
	int rc;

	lock_after_write(p);
	if (owner)
		p->owner = owner;
	if (p->state == PUT_DONE)
		rc = -EINVAL; /* one transaction per open */
	else if (p->state == PUT_FULL)
		rc = -EFBIG; /* at any offset: the one refused did not move the file's */
	else if (off != p->received)
		rc = -EINVAL; /* records are a stream: sequential writes only */
	else if ((rc = put_lines_reserve(t, p, len)) < 0) {
		log_warn("put %s: write of %zu bytes refused (ENOMEM): materialize_max= (%llu "
			 "bytes) has no room for its result lines; nothing of it was read",
			 put_where(p), len, (unsigned long long)t->cfg->materialize_max);
		return rc;
	} else {
		if (p->received == 0) /* a daemon that takes over cannot go on with it */
			revive_note(t, h, REVIVE_BUSY);
		p->head_at = NULL; /* a header begun in an earlier write is not in this one */
		put_records_stream_begin(t, p, len);
		rc = put_records_consume(t, p, buf, len);
		p->received += len;
	}
	if (rc < 0)
		log_warn("put %s: write refused (%s)", put_where(p), strerror(-rc));
	return rc < 0 ? rc : (int)len;
}

/* The flush the write began ends. */
static void put_write_end(struct tree *t, struct handle *h)
{
	struct put *p = (struct put *)h;

	put_records_stream_end(t, p);
	pthread_mutex_unlock(&p->mu);
}

static int put_write(struct tree *t, struct handle *h, uint64_t off, const void *buf, size_t len,
		     uint64_t owner)
{
	int rc = put_write_begin(t, h, off, buf, len, owner);

	put_write_end(t, h);
	return rc;
}

/* Ends the transaction: a record cut short is EBADMSG and commits nothing. */
static int put_end(struct tree *t, struct put *p)
{
	if (p->state == PUT_DONE)
		return p->first_error;
	bool cut = (p->state == PUT_LINE && p->line_len) ||
		   (p->state == PUT_HEAD && (p->head_len || p->line_len || p->bad_line)) ||
		   p->state == PUT_BODY || p->state == PUT_STREAM || p->state == PUT_SKIP;
	if (p->cur.pub) {
		handle_put(t, p->cur.pub); /* its release says "closed early" */
		p->cur.pub = NULL;
	} else if (p->state == PUT_BODY) /* counted as a publish closed early is */
		counter_inc(&t->metrics.rejected[ENVELOPE_TRUNCATED]);
	put_queue_flush(t, p);
	put_queue_buffer_free(t, p);
	if (cut && p->state != PUT_SKIP) {
		log_warn("put %s: record %u cut short; nothing of it committed", put_where(p), p->records);
		put_lines_add(t, p, p->cur.key, -EBADMSG);
	} else if (cut && !p->first_error)
		p->first_error = -EBADMSG;
	if (p->state == PUT_DEAD && !p->first_error)
		p->first_error = -EBADMSG;
	p->state = PUT_DONE;
	return p->first_error;
}

static int put_fsync(struct tree *t, struct handle *h)
{
	struct put *p = (struct put *)h;

	lock_after_write(p);
	int rc = put_end(t, p);
	pthread_mutex_unlock(&p->mu);
	return rc;
}

static int put_flush(struct tree *t, struct handle *h, uint64_t owner)
{
	struct put *p = (struct put *)h;

	lock_after_write(p);
	bool foreign = p->state != PUT_DONE && owner && p->owner && owner != p->owner;
	int rc = foreign ? 0 : put_end(t, p);
	pthread_mutex_unlock(&p->mu);
	return rc;
}

/* A read from offset 0 ends the transaction as fsync does (a client
 * needs no fsync round trip to learn the lines); other reads come after
 * the end. Lines that could not all be written fail every read. */
static int put_read(struct tree *t, struct handle *h, uint64_t off, size_t size,
		    const void **data, size_t *len)
{
	struct put *p = (struct put *)h;

	lock_after_write(p);
	if (p->state != PUT_DONE && off == 0)
		put_end(t, p);
	bool done = p->state == PUT_DONE, short_ = p->lines_short;
	pthread_mutex_unlock(&p->mu);
	if (!done)
		return -EINVAL; /* the results come at the end of the transaction */
	if (short_)
		return -ENOMEM;
	buffer_slice(p->results, p->results_len, off, size, data, len);
	return 0;
}

static void put_release(struct tree *t, struct handle *h)
{
	struct put *p = (struct put *)h;

	put_queue_release_spent(t, p);
	if (p->cur.pub)
		handle_put(t, p->cur.pub);
	for (size_t i = 0; i < p->nqueued; i++)
		if (p->queue[i].pub) /* never ended: nothing committed */
			handle_put(t, p->queue[i].pub);
	put_queue_buffer_free(t, p);
	if (p->ver) {
		pthread_mutex_lock(&t->lock);
		p->ver->open_files--;
		pthread_mutex_unlock(&t->lock);
		version_touch(p->ver);
		node_unref(&p->ver->node, 1);
	}
	pthread_mutex_destroy(&p->mu);
	transaction_memory_give(t, sizeof(*p) + p->results_cap);
	free(p->results);
	free(p);
}

/* Bytes a flush may stage: those queued and those this write brings. The
 * reading thread takes no more than it would of a single publish. */
static bool queue_quick(struct put *p, size_t len)
{
	if (pthread_mutex_trylock(&p->mu) != 0)
		return false; /* busy: a write or a flush in progress */
	bool quick = p->buf_len + len <= HANDLE_QUICK_BYTES;
	pthread_mutex_unlock(&p->mu);
	return quick;
}

/* Not while the store's bytes are counted; with remote=, a flush waits
 * for the cluster. */
static bool put_write_quick(struct tree *t, struct handle *h, size_t len)
{
	return len <= HANDLE_QUICK_BYTES && !t->sizing && !t->remote &&
	       queue_quick((struct put *)h, len);
}

static bool put_flush_quick(struct tree *t, struct handle *h)
{
	return !t->sizing && !t->remote && queue_quick((struct put *)h, 0);
}

/* A read that ends the transaction is as slow as a flush. */
static bool put_read_quick(struct tree *t, struct handle *h)
{
	struct put *p = (struct put *)h;

	if (pthread_mutex_trylock(&p->mu) != 0)
		return false;
	bool done = p->state == PUT_DONE;
	pthread_mutex_unlock(&p->mu);
	return done || put_flush_quick(t, h);
}

static const struct handle_ops put_ops = {
	.kind = "put",
	.held_kind = HANDLE_PUT,
	.hand_over = put_hand_over,
	.read = put_read,
	.write = put_write,
	.write_begin = put_write_begin,
	.write_end = put_write_end,
	.flush = put_flush,
	.fsync = put_fsync,
	.release = put_release,
	.read_quick = put_read_quick,
	.write_quick = put_write_quick,
	.flush_quick = put_flush_quick,
	.release_slow = true, /* it closes the last flush's temporary files */
};

int put_open(struct tree *t, struct version *v, struct handle **h, struct open_reply *r)
{
	/* What every open batch file holds, itself included, is charged. */
	if (!transaction_memory_take(t, sizeof(struct put))) {
		log_warn("open %s/%s: refused (ENOMEM): materialize_max= (%llu bytes) is held by "
			 "open transaction files", v ? v->name : ARTFS_KEYS_DIR, ARTFS_PUT_NAME,
			 (unsigned long long)t->cfg->materialize_max);
		return -ENOMEM;
	}
	struct put *p = calloc(1, sizeof(*p));

	if (!p) {
		transaction_memory_give(t, sizeof(struct put));
		return -ENOMEM;
	}
	handle_init(&p->h, &put_ops);
	pthread_mutex_init(&p->mu, NULL);
	p->ver = v;
	if (v) {
		node_ref(&v->node);
		pthread_mutex_lock(&t->lock);
		v->open_files++;
		pthread_mutex_unlock(&t->lock);
		version_touch(v);
	}
	put_records_next(p);
	r->direct_io = true; /* what is read is not what was written */
	*h = &p->h;
	parallel_warm(PUT_WARM_NS); /* its records come next */
	return 0;
}
