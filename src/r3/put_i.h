/* SPDX-License-Identifier: Apache-2.0 */
/* What the files of the batch publish (.put, DESIGN.md §3.7) share: the
 * batch's limits, the open batch file (struct put), its records and the
 * flush of its queue, and the functions each of put_lines.c, put_queue.c,
 * put_records.c and put_handover.c gives the others. Other files see only
 * r3/put.h. */
#ifndef ARTFS_PUT_I_H
#define ARTFS_PUT_I_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "artfs/artfs.h"
#include "format/envelope.h"
#include "lib/parallel.h"
#include "state/base.h"

/* Records one batch may hold (its result lines are kept until close). */
#define PUT_RECORDS_MAX (1u << 20)
/* Records queued before they are staged side by side and committed; with
 * remote=, also those sent to the cluster in one pipelined round. */
#define PUT_PIPELINE 64
/* Bytes of queued records one batch file buffers (charged to
 * materialize_max=), and the largest record buffered: a larger one goes
 * to its publish as it comes. */
#define PUT_QUEUE_BYTES (16u << 20)
#define PUT_BUFFER_RECORD_MAX (1u << 20)
/* Records per thread when a flush stages them side by side. */
#define PUT_PER_THREAD 4
/* A write at least this large begins a flush that stages its records as
 * they are read (most records are a few KiB). */
#define PUT_STREAM_MIN (32u << 10)
/* How long after the open of a batch file the flush threads stay awake
 * for its first write (parallel_warm). */
#define PUT_WARM_NS 1000000
/* How long the request after a write waits awake for its commits. */
#define PUT_WAIT_AWAKE_NS 1000000

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

/* put_lines.c: the result lines, and the batch's name in the log. */
/* The batch's place, for the log: its version's name, or .keys. */
const char *put_where(const struct put *p);
/* The result lines' memory, charged to materialize_max=: -ENOMEM. */
int put_lines_grow(struct tree *t, struct put *p, size_t cap);
int put_lines_reserve(struct tree *t, struct put *p, size_t len);
/* One record's outcome: its line, and the batch's errno if first. */
int put_lines_add(struct tree *t, struct put *p, const char *key, int rc);

/* put_queue.c: the queue, its buffer, and the flushes that stage and
 * commit its records. */
int put_queue_publish_begin(struct tree *t, struct version *ver, struct put_rec *r);
void put_queue_release_spent(struct tree *t, struct put *p);
void put_queue_flush_begin(struct tree *t, struct put *p, size_t threads, size_t items);
size_t put_queue_flush_threads(struct tree *t, uint64_t bytes);
int put_queue_flush(struct tree *t, struct put *p);
void put_queue_add(struct put *p);
bool put_queue_buffer_room(struct tree *t, struct put *p, size_t n);
void put_queue_buffer_free(struct tree *t, struct put *p);

/* put_records.c: reading the records of the writes. */
/* The next byte begins a record. */
void put_records_next(struct put *p);
/* Reads len bytes of the batch: 0, or -errno (the write is refused). */
int put_records_consume(struct tree *t, struct put *p, const uint8_t *buf, size_t len);
/* A large write begins a flush that stages its records as they are read;
 * it ends when the write is read. */
void put_records_stream_begin(struct tree *t, struct put *p, size_t len);
void put_records_stream_end(struct tree *t, struct put *p);

/* put_handover.c: an upgrade hands the batch to the next daemon. */
void put_hand_over(struct tree *t, struct handle *h);

#endif
