/* Batch publishing (DESIGN.md §3.7): .keys/.put takes envelopes back to
 * back, <wv>/.put takes `<block hash hex>\n` + envelope records. Each record
 * is validated and committed on its own, in order, exactly as a single
 * publish; fsync (or close) returns 0 when every record committed or was
 * identical, else the errno of the first that failed; then a read from
 * offset 0 returns one `<key hex> <0|EEXIST|EBADMSG|ENOSPC|EFBIG|...>` line
 * per record. Each open is one transaction. */
#ifndef ARTFS_PUT_H
#define ARTFS_PUT_H

#include "base.h"

/* Records one batch may hold (its result lines are kept until close). */
#define PUT_RECORDS_MAX (1u << 20)
/* With remote=: records sent to the cluster in one pipelined round. */
#define PUT_PIPELINE 64

/* v: the version of <wv>/.put, or NULL for .keys/.put. */
int put_open(struct tree *t, struct version *v, struct handle **h, struct open_reply *r);

#endif
