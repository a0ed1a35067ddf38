/* SPDX-License-Identifier: Apache-2.0 */
/* The result lines of a batch file (r3/put.c): one `<key hex> <errno
 * name>` line per record, in memory charged to materialize_max=, and the
 * batch's errno (its first failure); and the name a batch goes by in the
 * log. */
#include "autoconf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "r3/put_i.h"

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
int put_lines_grow(struct tree *t, struct put *p, size_t cap)
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
int put_lines_reserve(struct tree *t, struct put *p, size_t len)
{
	size_t records = p->nqueued + 3 + len / PUT_RECORD_BYTES_MIN;

	return put_lines_grow(t, p, p->results_len + records * PUT_LINE_MAX);
}

/* One record's outcome: a result line, and the batch's errno if first. */
int put_lines_add(struct tree *t, struct put *p, const char *key, int rc)
{
	char line[PUT_LINE_MAX];
	int n = snprintf(line, sizeof(line), "%s %s\n", key, errno_name(-rc));

	/* Reserved by the write (put_lines_reserve); more only if that fell short. */
	if (p->results_len + (size_t)n > p->results_cap &&
	    put_lines_grow(t, p, p->results_len + (size_t)n) < 0) {
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

const char *put_where(const struct put *p)
{
	return p->ver ? p->ver->name : ".keys";
}
