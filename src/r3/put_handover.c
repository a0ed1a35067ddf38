/* SPDX-License-Identifier: Apache-2.0 */
/* An upgrade (DESIGN.md §8): a drained daemon hands each open batch over
 * in its handle's record (its counters, its result lines and the bytes
 * of the record in progress), and the next daemon goes on with it
 * (put_resume). */
#include "autoconf.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "format/envelope.h"
#include "lib/log.h"
#include "r3/publish.h"
#include "r3/put.h"
#include "r3/put_i.h"
#include "restart/held.h"
#include "state/ids.h"

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

void put_hand_over(struct tree *t, struct handle *h)
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
	if (p->state != PUT_DONE && put_queue_flush(t, p) < 0 && !p->first_error)
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
		 "(EIO)", put_where(p));
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
	if (put_lines_grow(t, p, (size_t)sv.results_len) < 0)
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
	if (put_lines_reserve(t, p, n) < 0)
		return -ENOMEM;
	int rc = put_records_consume(t, p, partial, n);
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
			 put_where(p), strerror(-rc));
		handle_put(t, *h);
		*h = NULL;
	}
	return rc;
}
