/* SPDX-License-Identifier: Apache-2.0 */
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

/* v: the version of <wv>/.put, or NULL for .keys/.put. */
int put_open(struct tree *t, struct version *v, struct handle **h, struct open_reply *r);
/* A batch a drained daemon handed over (its record's text, len bytes),
 * going on here: 0, or -errno (logged). */
int put_resume(struct tree *t, struct version *v, const uint8_t *text, size_t len,
	       struct handle **h);

#endif
