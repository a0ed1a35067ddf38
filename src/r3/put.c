#include "autoconf.h"

#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/envelope.h"
#include "format/key.h"
#include "lib/log.h"
#include "lib/parallel.h"
#include "r3/publish.h"
#include "r3/put.h"
#include "remote/remote.h"
#include "state/ids.h"

/* Records are not committed as their bytes arrive but queued, and a full
 * queue is flushed (when the next record begins): each record is staged
 * (its temporary file, writing it, hashing it) and committed as a single
 * publish would be (DESIGN.md §3.7), on a few threads at once. The outcome is that of single
 * publishes in order: records of different keys are independent, and a
 * record whose key an earlier record of the queue has commits after it,
 * in order; the result lines come in order. A large write (most of a
 * batch, as engines send it) is not queued whole first: a flush begins
 * with it, and each record is staged as soon as it is read while the
 * rest is read. The write is answered once its records are read; its
 * flush ends after that, before the batch's next request is served
 * (which waits for it awake where CPUs are to spare), so the client's
 * next request is on its way while the last records commit.
 *
 * Memory: a batch file buffers at most PUT_QUEUE_BYTES of queued records
 * (charged to materialize_max=, like every transaction file's memory) and
 * PUT_PIPELINE queue entries. A record larger than PUT_BUFFER_RECORD_MAX,
 * or one that finds no memory, is not buffered: the queue is flushed and
 * the record's bytes go to its publish as they come.
 *
 * A daemon that dies (kill -9) during a batch: the records it committed
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

enum put_state {
	PUT_LINE,    /* <wv>/.put: reading `<hash>\n` */
	PUT_HEAD,    /* reading an envelope's length prefix and header */
	PUT_BODY,    /* copying the rest of the record into the queue's buffer */
	PUT_STREAM,  /* feeding the rest of a large record to its publish */
	PUT_SKIP,    /* passing over the rest of a refused record */
	PUT_DEAD,    /* a header that gives no length: nothing after it can be read */
	PUT_FULL,    /* PUT_RECORDS_MAX records read: nothing after them is taken */
	PUT_DONE,    /* fsync or close ended the transaction */
};

/* One flush of the queue. Each record commits on the thread that staged
 * it, but for one whose key an earlier record has (after_same_key): that
 * one commits in order, by the chain. The chain (one thread at a time,
 * whichever staged the last record before) writes the result lines in
 * order, as soon as a record and every record before it are done. With
 * remote= records are only staged here and go to the cluster in one round
 * first, then commit in order. While a write is being read (streaming),
 * records join as they are read: avail of them so far. */
struct flush {
	struct tree *t;
	struct put *p;
	bool open;                       /* begun, not ended */
	int rc;                          /* the first line that could not be written */
	/* What the reading thread writes, what the stagers take and what the
	 * committer marks lie a cache line apart at least: each is written
	 * while the others spin on theirs. */
	char gap0[64];
	struct parallel_loop loop;
	char gap1[64];
	_Atomic size_t avail;            /* records of the queue that may be staged */
	_Atomic bool closed;             /* no more records join */
	char gap2[64];
	pthread_mutex_t chain;           /* the thread writing lines */
	_Atomic size_t next;             /* the next record without its line */
	_Atomic bool ready[PUT_PIPELINE];
	char gap3[64];
};

/* One record, from its header on: in progress, then in the queue. */
struct put_rec {
	char key[65];              /* its key hex, or "-" */
	int refused;               /* its outcome, decided as it was read */
	uint8_t hash[ARTFS_HASH_BYTES_MAX];
	size_t hash_len;
	struct envelope env;       /* its header, parsed once */
	size_t off;                /* buffered: its envelope at buf + off */
	const uint8_t *in_write;   /* or, while a flush is open, in the write being read */
	struct handle *pub;        /* its publish, once begun */
	bool streamed;             /* its bytes went to pub as they came */
	int staged;                /* its outcome short of its commit (when its
				    * publish could not begin, its errno) */
	bool to_cluster;           /* with remote=: its bytes still go to the cluster */
	bool after_same_key;       /* an earlier record of the queue has its key */
};

struct put {
	struct handle h;
	pthread_mutex_t mu;
	struct version *ver;        /* <wv>/.put: referenced; NULL for .keys/.put */
	enum put_state state;
	uint64_t received;          /* bytes written, for the sequential check */
	uint64_t owner;             /* file table of the writes */
	/* the record in progress */
	char line[ARTFS_HASH_HEX_MAX + 2];
	size_t line_len;
	bool bad_line;              /* its hash line was not a hash: refused, skipped */
	uint8_t head[ENVELOPE_HEADER_BYTES_MAX];
	size_t head_len, head_need;
	uint64_t remaining;         /* bytes of the record after its header */
	uint64_t fed;               /* streamed: bytes given to its publish */
	struct put_rec cur;
	struct envelope_layout layout; /* of the headers before: most need no parse */
	/* records whose bytes are all in, in order, and the bytes of those
	 * buffered (buf_cap bytes charged to materialize_max=) */
	struct put_rec queue[PUT_PIPELINE];
	size_t nqueued;
	struct flush flush;         /* the queue's, while open */
	/* the publishes of the last flush, committed: released (their
	 * temporary files closed) at the next flush or when the file is
	 * closed, after the writes and the fsync that a batch waits for */
	struct handle *spent[PUT_PIPELINE];
	size_t nspent;
	const uint8_t *head_at;     /* where the record in progress began in this write */
	uint32_t seen;              /* records queued so far, in all */
	uint8_t *buf;
	size_t buf_len, buf_cap;
	size_t write_left;          /* bytes of the write in progress not yet taken */
	/* outcomes */
	uint32_t records;
	int first_error;
	bool lines_short;           /* a line could not be written: reads fail */
	char *results;
	size_t results_len, results_cap;
};

/* Bytes of result memory that a record's line may take: 64 hex digits, a
 * space, an errno name, a newline. */
#define PUT_LINE_MAX 80
/* Fewer bytes than any record that yields a line and lets the batch go on:
 * a length prefix and a header with every field of DESIGN.md §3.1, whose
 * key and payload_sha256 alone are 142 characters (279 bytes at least in
 * all, with a one-byte payload). */
#define PUT_RECORD_BYTES_MIN 256

/* Grows the result lines' memory to cap bytes at least, charged to
 * materialize_max= (with what else every batch file holds): by half
 * again when there is room for that, else to cap. -ENOMEM. */
static int lines_grow(struct tree *t, struct put *p, size_t cap)
{
	size_t more = p->results_cap + p->results_cap / 2;

	if (cap <= p->results_cap)
		return 0;
	if (more > cap && transaction_memory_take(t, more - p->results_cap))
		cap = more;
	else if (!transaction_memory_take(t, cap - p->results_cap))
		return -ENOMEM;
	char *grown = realloc(p->results, cap);
	if (!grown) {
		transaction_memory_give(t, cap - p->results_cap);
		return -ENOMEM;
	}
	p->results = grown;
	p->results_cap = cap;
	return 0;
}

/* Room for the lines of every record that a write of len bytes may end:
 * those queued, the one in progress, one that ends the batch, and one for
 * every PUT_RECORD_BYTES_MIN bytes. Taken before any of its bytes is read,
 * so that a write the memory cannot answer for fails (ENOMEM) with nothing
 * of it read, let alone committed. */
static int lines_reserve(struct tree *t, struct put *p, size_t len)
{
	size_t records = p->nqueued + 3 + len / PUT_RECORD_BYTES_MIN;

	return lines_grow(t, p, p->results_len + records * PUT_LINE_MAX);
}

/* One record's outcome: a result line, and the batch's errno if first. */
static int record_line(struct tree *t, struct put *p, const char *key, int rc)
{
	char line[PUT_LINE_MAX];
	int n = snprintf(line, sizeof(line), "%s %s\n", key, errno_name(-rc));

	/* Reserved by the write (lines_reserve); more only if that fell short. */
	if (p->results_len + (size_t)n > p->results_cap &&
	    lines_grow(t, p, p->results_len + (size_t)n) < 0) {
		if (!p->first_error) /* the lines are incomplete: the batch says so */
			p->first_error = -ENOMEM;
		p->lines_short = true;
		return -ENOMEM;
	}
	memcpy(p->results + p->results_len, line, (size_t)n);
	p->results_len += (size_t)n;
	p->records++;
	if (rc && !p->first_error)
		p->first_error = rc;
	return 0;
}

static const char *where(const struct put *p)
{
	return p->ver ? p->ver->name : ".keys";
}

/* ---- the queue ------------------------------------------------------------ */

/* Starts the publish of a record: its version (for .keys/.put the key-only
 * one, made again if collected meanwhile), its object, its handle. */
static int begin(struct tree *t, struct version *ver, struct put_rec *r)
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
	int rc = begin(t, p->ver, r);
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
static void release_spent(struct tree *t, struct put *p)
{
	struct spent s = { t, p };

	parallel_for(p->nspent, PUT_PER_THREAD, PARALLEL_THREADS_MAX, release_spent_one, &s);
	p->nspent = 0;
}

/* The lines of records from..to, staged, in order: their publishes'
 * fsyncs, which commit those not committed yet, in order, and answer
 * again what the others came to. The publishes are released later
 * (release_spent), out of the in-order lines. */
static void commit_recs(struct flush *f, size_t from, size_t to)
{
	for (size_t i = from; i < to; i++) {
		struct put_rec *r = &f->p->queue[i];
		int rc = r->refused ? r->refused : r->staged;
		if (r->pub)
			rc = r->pub->ops->fsync(f->t, r->pub);
		rc = record_line(f->t, f->p, r->key, rc);
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
static void flush_begin(struct tree *t, struct put *p, size_t threads, size_t items)
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
static size_t flush_threads(struct tree *t, uint64_t bytes)
{
	return publish_room_for(t, bytes) ? PARALLEL_THREADS_MAX : 1;
}

/* Stages and commits every queued record (ending the flush that a write
 * began, if any); then the queue is empty. */
static int flush_queue(struct tree *t, struct put *p)
{
	struct flush *f = &p->flush;
	size_t n = p->nqueued;

	if (!f->open) {
		if (!n)
			return 0;
		flush_begin(t, p, flush_threads(t, p->buf_len), n);
	}
	atomic_store(&f->closed, true);
	parallel_end(&f->loop);
	f->open = false;
	if (t->remote)
		commit_round(f);
	else
		commit_ready(f); /* nothing is left: every record is staged */
	pthread_mutex_destroy(&f->chain);
	release_spent(t, p);
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
static void enqueue(struct put *p)
{
	p->cur.after_same_key = key_queued(p, &p->cur);
	p->queue[p->nqueued++] = p->cur;
	p->cur.pub = NULL;
	p->seen++;
	if (p->flush.open)
		atomic_store(&p->flush.avail, p->nqueued);
}

/* Whether the next byte begins a record (none of it is read yet). */
static bool between_records(const struct put *p)
{
	return p->state == (p->ver ? PUT_LINE : PUT_HEAD) && !p->line_len && !p->bad_line &&
	       !p->head_len;
}

/* A full queue is flushed before the next record begins to be read (none
 * of its bytes is in the buffer yet): 0, or the flush's errno. */
static int flush_if_full(struct tree *t, struct put *p)
{
	return p->nqueued == PUT_PIPELINE && between_records(p) ? flush_queue(t, p) : 0;
}

/* A record refused before its publish began: its line comes in its turn. */
static void refuse(struct put *p, int rc)
{
	p->cur.refused = rc;
	enqueue(p);
}

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
static bool buffer_room(struct tree *t, struct put *p, size_t n)
{
	if (p->buf_len + n > PUT_QUEUE_BYTES)
		flush_queue(t, p); /* a line it could not write makes fsync ENOMEM */
	if (p->buf_len + n <= p->buf_cap)
		return true;
	if (p->flush.open) /* its stagers read the buffer: it stays in place */
		flush_queue(t, p);
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

static void buffer_free(struct tree *t, struct put *p)
{
	transaction_memory_give(t, p->buf_cap);
	free(p->buf);
	p->buf = NULL;
	p->buf_len = p->buf_cap = 0;
}

/* ---- the stream of records ------------------------------------------------ */

static void next_record(struct put *p)
{
	p->state = p->ver ? PUT_LINE : PUT_HEAD;
	p->line_len = 0;
	p->bad_line = false;
	p->head_len = 0;
	p->head_need = ENVELOPE_PREFIX_LEN;
	p->remaining = p->fed = 0;
	p->cur.refused = p->cur.staged = 0;
	p->cur.pub = NULL;
	p->cur.in_write = NULL;
	p->cur.streamed = p->cur.to_cluster = false;
	p->cur.after_same_key = false;
	snprintf(p->cur.key, sizeof(p->cur.key), "-");
}

/* A large record: the queue is flushed (records commit in order), then its
 * bytes go to its publish as they come. */
static int start_stream(struct tree *t, struct put *p)
{
	struct put_rec *r = &p->cur;
	int flushed = flush_queue(t, p);
	int rc = begin(t, p->ver, r);

	if (rc < 0) {
		p->state = PUT_SKIP;
		refuse(p, rc);
		return flushed;
	}
	r->streamed = true;
	publish_write_parsed(t, r->pub, &r->env, p->head, p->head_len, p->owner);
	p->fed = p->head_len;
	p->state = PUT_STREAM; /* a refusal is sticky in the publish: said at its end */
	return flushed;
}

/* The header is in: parse it (the only parse of it; none when it is laid
 * out as the one before), name the record and buffer it, or stream it. */
static int start_record(struct tree *t, struct put *p, size_t left)
{
	struct put_rec *r = &p->cur;
	char detail[256];
	uint32_t hlen = (uint32_t)(p->head_len - ENVELOPE_PREFIX_LEN);

	if (envelope_parse_header_like(&p->layout, p->head + ENVELOPE_PREFIX_LEN, hlen, &r->env,
				       detail, sizeof(detail))) {
		/* Without a header there is no length: the rest cannot be read. */
		log_warn("put %s: record %u: %s; the rest of the batch is refused", where(p),
			 p->seen, detail);
		p->state = PUT_DEAD;
		refuse(p, -EBADMSG);
		return 0;
	}
	uint64_t total = envelope_total_len(&r->env);
	if (total == UINT64_MAX) {
		p->state = PUT_DEAD;
		refuse(p, -EBADMSG);
		return 0;
	}
	p->remaining = total - p->head_len;
	const char *hex = r->env.key + sizeof(ARTFS_KEY_PREFIX) - 1;
	int rc = 0;
	if (!p->ver) {
		/* .keys/.put: the record's key names it. */
		memcpy(r->key, hex, 64);
		r->key[64] = '\0';
		r->hash_len = 32;
		if (key_sha256_decode(hex, r->hash) < 0)
			rc = -EBADMSG;
	} else if (p->bad_line)
		rc = -EBADMSG;
	else {
		char key[ARTFS_KEY_LEN + 1];
		version_object_key(p->ver, r->hash, r->hash_len, key);
		memcpy(r->key, key + sizeof(ARTFS_KEY_PREFIX) - 1, 64);
		r->key[64] = '\0';
	}
	if (rc < 0) {
		/* Refused before its publish began: pass over its bytes. */
		p->state = PUT_SKIP;
		refuse(p, rc);
		return 0;
	}
	p->state = PUT_BODY;
	if (p->flush.open && p->head_at && p->remaining <= left) {
		/* Whole in the write, which outlives the flush: staged from there. */
		r->in_write = p->head_at;
		return 0;
	}
	if (total > PUT_BUFFER_RECORD_MAX || !buffer_room(t, p, (size_t)total))
		return start_stream(t, p);
	r->off = p->buf_len;
	memcpy(p->buf + p->buf_len, p->head, p->head_len);
	p->buf_len += p->head_len;
	return 0;
}

/* The last byte of the record in progress is in. */
static void end_record(struct put *p)
{
	if (p->state != PUT_SKIP)
		enqueue(p);
	next_record(p);
}

/* A record begins after the last one a batch may hold: the rest is
 * refused, and the result lines end with one that says so. */
static int overflow(struct tree *t, struct put *p)
{
	log_warn("put %s: more than %u records in one batch; the rest is refused (EFBIG)",
		 where(p), PUT_RECORDS_MAX);
	p->state = PUT_FULL;
	refuse(p, -EFBIG);
	return -EFBIG;
}

/* <wv>/.put: the bytes of the record's `<hash>\n` line, up to and with
 * its newline; the hash is decoded once the line is whole. */
static size_t read_hash_line(struct put *p, const uint8_t *buf, size_t len)
{
	const uint8_t *nl = memchr(buf, '\n', len);
	size_t take = nl ? (size_t)(nl - buf) : len;

	if (p->line_len + take > ARTFS_HASH_HEX_MAX) {
		p->bad_line = true; /* too long: not a hash; keep counting */
		p->line_len = 0;
	} else {
		memcpy(p->line + p->line_len, buf, take);
		p->line_len += take;
	}
	if (!nl)
		return take;
	p->line[p->line_len] = '\0';
	if (p->bad_line || key_hash_decode(p->line, p->cur.hash, &p->cur.hash_len) < 0) {
		log_warn("put %s: record %u: \"%.140s\" is not a block hash", where(p), p->seen,
			 p->line);
		p->bad_line = true;
	}
	p->state = PUT_HEAD;
	return take + 1;
}

/* The bytes of the header still missing (head_need), as many as len has. */
static size_t read_header(struct put *p, const uint8_t *buf, size_t len)
{
	if (!p->head_len)
		p->head_at = buf;
	size_t take = p->head_need - p->head_len < len ? p->head_need - p->head_len : len;
	memcpy(p->head + p->head_len, buf, take);
	p->head_len += take;
	return take;
}

/* What head_need asked for is in: the length prefix, which says how much
 * header follows, or the whole header, which begins the record (left: the
 * bytes of the write after it). */
static int header_complete(struct tree *t, struct put *p, size_t left)
{
	if (p->head_need == ENVELOPE_PREFIX_LEN) {
		uint32_t hlen;
		if (envelope_header_len(p->head, &hlen)) {
			log_warn("put %s: record %u: header length %u outside 1..%u; "
				 "the rest of the batch is refused", where(p),
				 p->seen, hlen,
				 ARTFS_ENVELOPE_HEADER_MAX);
			p->state = PUT_DEAD;
			refuse(p, -EBADMSG);
			return 0;
		}
		p->head_need = ENVELOPE_PREFIX_LEN + hlen;
		return 0;
	}
	int rc = start_record(t, p, left);
	if (rc == 0 && p->remaining == 0 && p->state != PUT_DEAD)
		end_record(p);
	return rc;
}

/* The record's bytes after its header: into the buffer (PUT_BODY, unless
 * staged from the write itself), to its publish (PUT_STREAM), or passed
 * over (PUT_SKIP). */
static size_t read_record_rest(struct tree *t, struct put *p, const uint8_t *buf, size_t len)
{
	size_t take = p->remaining < len ? (size_t)p->remaining : len;

	if (p->state == PUT_BODY && !p->cur.in_write) {
		memcpy(p->buf + p->buf_len, buf, take);
		p->buf_len += take;
	} else if (p->state == PUT_STREAM) {
		struct handle *pub = p->cur.pub;
		/* a refusal is sticky: the record's fsync says it */
		pub->ops->write(t, pub, p->fed, buf, take, p->owner);
		p->fed += take;
	}
	p->remaining -= take;
	if (p->remaining == 0)
		end_record(p);
	return take;
}

static int consume(struct tree *t, struct put *p, const uint8_t *buf, size_t len)
{
	int rc = 0;

	while (len && rc == 0) {
		p->write_left = len;
		if ((rc = flush_if_full(t, p)) < 0)
			break;
		if (p->seen >= PUT_RECORDS_MAX && between_records(p))
			return overflow(t, p);
		size_t took = 0;
		switch (p->state) {
		case PUT_LINE:
			took = read_hash_line(p, buf, len);
			break;
		case PUT_HEAD:
			took = read_header(p, buf, len);
			if (p->head_len == p->head_need)
				rc = header_complete(t, p, len - took);
			break;
		case PUT_BODY:
		case PUT_STREAM:
		case PUT_SKIP:
			took = read_record_rest(t, p, buf, len);
			break;
		case PUT_DEAD:
			took = len;
			break;
		case PUT_FULL:
			return -EFBIG;
		case PUT_DONE:
			return -EINVAL;
		}
		buf += took;
		len -= took;
	}
	return rc;
}

/* A write that brings several records begins a flush: each record is
 * staged as soon as it is read, from the write itself when the record lies
 * whole in it (start_record), else from the buffer. The buffer must not
 * move while stagers may read it: a header begun in an earlier write gets
 * room for the whole write now, and only the record cut at the write's
 * end may need more (the flush ends first, as at the write's end). Only
 * when the store has room for all of it (else records go one at a time,
 * flush_threads); without remote=, whose round to the cluster takes the
 * queue whole. */
static void stream_begin(struct tree *t, struct put *p, size_t len)
{
	/* Full from the writes before, it would end the new flush at once; a
	 * line it could not write is the batch's errno (lines_short). */
	flush_if_full(t, p);
	if (len < PUT_STREAM_MIN || t->remote || p->state == PUT_DEAD || p->state == PUT_FULL ||
	    p->state == PUT_STREAM || p->state == PUT_SKIP)
		return;
	if (p->buf_len + len > PUT_QUEUE_BYTES)
		return; /* room would mean a flush now, with a record in progress in the buffer */
	p->write_left = len;
	bool header_begun = (p->state == PUT_HEAD && p->head_len) ||
			    (p->state == PUT_LINE && (p->line_len || p->bad_line));
	if ((header_begun && !buffer_room(t, p, len)) || flush_threads(t, p->buf_len + len) == 1)
		return;
	flush_begin(t, p, PARALLEL_THREADS_MAX, PUT_PIPELINE);
}

/* The write is read: the flush it began ends (it never outlives the
 * write). A record that goes on in the next write keeps its bytes, moved
 * to the front of the emptied buffer. */
static void stream_end(struct tree *t, struct put *p)
{
	if (!p->flush.open)
		return;
	size_t from = p->cur.off, keep = p->state == PUT_BODY ? p->buf_len - p->cur.off : 0;
	flush_queue(t, p); /* a line it cannot write is the batch's errno */
	if (keep) {
		memmove(p->buf, p->buf + from, keep);
		p->cur.off = 0;
		p->buf_len = keep;
	}
}

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
	else if ((rc = lines_reserve(t, p, len)) < 0) {
		log_warn("put %s: write of %zu bytes refused (ENOMEM): materialize_max= (%llu "
			 "bytes) has no room for its result lines; nothing of it was read",
			 where(p), len, (unsigned long long)t->cfg->materialize_max);
		return rc;
	} else {
		if (p->received == 0) /* a daemon that takes over cannot go on with it */
			revive_note(t, h, REVIVE_BUSY);
		p->head_at = NULL; /* a header begun in an earlier write is not in this one */
		stream_begin(t, p, len);
		rc = consume(t, p, buf, len);
		p->received += len;
	}
	if (rc < 0)
		log_warn("put %s: write refused (%s)", where(p), strerror(-rc));
	return rc < 0 ? rc : (int)len;
}

/* The flush the write began ends. */
static void put_write_end(struct tree *t, struct handle *h)
{
	struct put *p = (struct put *)h;

	stream_end(t, p);
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
	flush_queue(t, p);
	buffer_free(t, p);
	if (cut && p->state != PUT_SKIP) {
		log_warn("put %s: record %u cut short; nothing of it committed", where(p), p->records);
		record_line(t, p, p->cur.key, -EBADMSG);
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

	release_spent(t, p);
	if (p->cur.pub)
		handle_put(t, p->cur.pub);
	for (size_t i = 0; i < p->nqueued; i++)
		if (p->queue[i].pub) /* never ended: nothing committed */
			handle_put(t, p->queue[i].pub);
	buffer_free(t, p);
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

/* ---- an upgrade: the batch goes on in the next daemon ------------------------------- */

/* What a drained daemon hands over of a batch, in its record's text:
 * this, the result lines so far, then the bytes of the record in
 * progress, which the next daemon reads again (put_resume). */
struct put_saved {
	uint32_t magic;
	uint32_t state;             /* enum put_state */
	uint32_t records, seen;
	int32_t first_error;
	uint8_t lines_short;
	uint8_t pad[3];
	uint64_t received, owner;
	uint64_t remaining;         /* PUT_SKIP: bytes still to pass over */
	uint64_t results_len, partial_len;
};
#define PUT_SAVED_MAGIC 0x48545550u /* "PUTH" */

/* The bytes of the record in progress, from its first (line and header
 * included), into the text at at; how many, or -EIO. */
static int64_t save_partial(struct put *p, uint8_t *at, size_t room)
{
	size_t n = 0;

	if (p->ver && (p->state == PUT_LINE || p->state == PUT_HEAD || p->state == PUT_BODY ||
		       p->state == PUT_STREAM)) {
		/* A line too long to keep is saved as one as long: refused again. */
		size_t len = p->bad_line && !p->line_len ? ARTFS_HASH_HEX_MAX + 1 : p->line_len;
		if (len + 1 > room)
			return -EIO;
		if (p->bad_line && !p->line_len)
			memset(at, 'x', len);
		else
			memcpy(at, p->line, len);
		n = len;
		if (p->state != PUT_LINE)
			at[n++] = '\n';
	}
	if (p->state == PUT_HEAD) {
		if (n + p->head_len > room)
			return -EIO;
		memcpy(at + n, p->head, p->head_len);
		n += p->head_len;
	} else if (p->state == PUT_BODY) {
		size_t len = p->buf_len - p->cur.off;
		if (n + len > room)
			return -EIO;
		memcpy(at + n, p->buf + p->cur.off, len);
		n += len;
	} else if (p->state == PUT_STREAM) {
		if (n + p->fed > room || publish_bytes(p->cur.pub, at + n, (size_t)p->fed) < 0)
			return -EIO;
		n += (size_t)p->fed;
	}
	return (int64_t)n;
}

/* How many bytes the record in progress has taken (an upper bound). */
static size_t partial_bound(const struct put *p)
{
	return ARTFS_HASH_HEX_MAX + 2 + ENVELOPE_HEADER_BYTES_MAX + p->buf_len + (size_t)p->fed;
}

static void put_hand_over(struct tree *t, struct handle *h)
{
	struct put *p = (struct put *)h;
	struct held_handle *rec = h->fh ? ids_handle_record(t, h->fh) : NULL;
	struct put_saved sv = { .magic = PUT_SAVED_MAGIC };
	uint8_t *partial = NULL;
	int64_t n = 0;

	pthread_mutex_lock(&p->mu);
	if (!rec || p->received == 0) {
		pthread_mutex_unlock(&p->mu);
		return;
	}
	if (!(partial = malloc(partial_bound(p))) ||
	    (n = save_partial(p, partial, partial_bound(p))) < 0)
		goto fail;
	/* The whole records queued commit now: their lines go with the rest. */
	if (p->state != PUT_DONE && flush_queue(t, p) < 0 && !p->first_error)
		p->first_error = -ENOMEM;
	size_t len = sizeof(sv) + p->results_len + (size_t)n;
	if (held_text_reserve(&t->held, rec, len) < 0)
		goto fail;
	sv.state = p->state;
	sv.records = p->records;
	sv.seen = p->seen;
	sv.first_error = p->first_error;
	sv.lines_short = p->lines_short;
	sv.received = p->received;
	sv.owner = p->owner;
	sv.remaining = p->remaining;
	sv.results_len = p->results_len;
	sv.partial_len = (uint64_t)n;
	uint8_t *text = held_text(&t->held, rec);
	memcpy(text, &sv, sizeof(sv));
	memcpy(text + sizeof(sv), p->results, p->results_len);
	memcpy(text + sizeof(sv) + p->results_len, partial, (size_t)n);
	rec->text_len = len;
	revive_note(t, h, REVIVE_HANDED);
	pthread_mutex_unlock(&p->mu);
	free(partial);
	return;
fail:
	log_warn("put %s: cannot hand the batch to the next daemon; its writer's next call fails "
		 "(EIO)", where(p));
	pthread_mutex_unlock(&p->mu);
	free(partial);
}

/* The counters and lines of a handed-over batch, and the record it was in
 * (read again). 0, or -EIO (not a batch this daemon can go on with). */
static int restore(struct tree *t, struct put *p, const uint8_t *text, size_t len)
{
	struct put_saved sv;

	if (len < sizeof(sv))
		return -EIO;
	memcpy(&sv, text, sizeof(sv));
	if (sv.magic != PUT_SAVED_MAGIC || sv.state > PUT_DONE || sv.results_len > len ||
	    sv.partial_len > len - sizeof(sv) - sv.results_len || sv.partial_len > sv.received)
		return -EIO;
	if (lines_grow(t, p, (size_t)sv.results_len) < 0)
		return -ENOMEM;
	memcpy(p->results, text + sizeof(sv), (size_t)sv.results_len);
	p->results_len = (size_t)sv.results_len;
	p->records = sv.records;
	p->seen = sv.seen;
	p->first_error = sv.first_error;
	p->lines_short = sv.lines_short;
	p->owner = sv.owner;
	p->received = sv.received;
	enum put_state state = (enum put_state)sv.state;
	if (state == PUT_DEAD || state == PUT_FULL || state == PUT_DONE || state == PUT_SKIP) {
		p->state = state;
		p->remaining = sv.remaining;
		return 0;
	}
	size_t n = (size_t)sv.partial_len;
	const uint8_t *partial = text + sizeof(sv) + sv.results_len;
	p->received = sv.received - n;
	if (lines_reserve(t, p, n) < 0)
		return -ENOMEM;
	int rc = consume(t, p, partial, n);
	p->received = sv.received;
	return rc < 0 ? -EIO : 0;
}

int put_resume(struct tree *t, struct version *v, const uint8_t *text, size_t len,
	       struct handle **h)
{
	struct open_reply r = { 0 };
	int rc = put_open(t, v, h, &r);

	if (rc < 0)
		return rc;
	struct put *p = (struct put *)*h;
	pthread_mutex_lock(&p->mu);
	rc = restore(t, p, text, len);
	pthread_mutex_unlock(&p->mu);
	if (rc < 0) {
		log_warn("put %s: the batch a drained daemon handed over cannot go on (%s)",
			 where(p), strerror(-rc));
		handle_put(t, *h);
		*h = NULL;
	}
	return rc;
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
	next_record(p);
	r->direct_io = true; /* what is read is not what was written */
	*h = &p->h;
	parallel_warm(PUT_WARM_NS); /* its records come next */
	return 0;
}
