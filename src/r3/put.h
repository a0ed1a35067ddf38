/* Batch publishing (DESIGN.md §3.7): .keys/.put takes envelopes back to
 * back, <wv>/.put takes `<block hash hex>\n` + envelope records. Each record
 * is validated and committed on its own, in order, exactly as a single
 * publish; fsync (or close) returns 0 when every record committed or was
 * identical, else the errno of the first that failed; then a read from
 * offset 0 returns one `<key hex> <0|EEXIST|EBADMSG|ENOSPC|EFBIG|...>` line
 * per record. A read from offset 0 before fsync ends the transaction as
 * fsync would, one round trip fewer. Each open is one transaction. */
#ifndef ARTFS_PUT_H
#define ARTFS_PUT_H

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

/* v: the version of <wv>/.put, or NULL for .keys/.put. */
int put_open(struct tree *t, struct version *v, struct handle **h, struct open_reply *r);
/* A batch a drained daemon handed over (its record's text, len bytes),
 * going on here: 0, or -errno (logged). */
int put_resume(struct tree *t, struct version *v, const uint8_t *text, size_t len,
	       struct handle **h);

#endif
