/* SPDX-License-Identifier: Apache-2.0 */
/* An upgrade (DESIGN.md §8) with a .blocks/.put open: the drained daemon
 * hands the batch over in its handle's record (its counters, its result
 * lines, and the bytes of the record in progress: every whole record a
 * write brought is committed before its reply), and the next daemon goes
 * on with it (wblocks_put_restore: the partial record read again). */
#include "autoconf.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "lib/log.h"
#include "restart/held.h"
#include "state/ids.h"
#include "trees/blocks.h"

struct saved {
	uint32_t magic;
	uint32_t state;             /* enum wput_state */
	int32_t first_error;
	uint32_t pad;
	uint64_t records, received, owner;
	uint64_t skipped;           /* PUT_SKIP: body bytes passed over */
	uint64_t lines_len, partial_len;
};
#define SAVED_MAGIC 0x4b4c4248u /* "HBLK" */

/* The record in progress as it came: its key line, its length bytes and
 * (PUT_BODY) the body so far, into at (room: its bound); the count. */
static size_t save_partial(const struct wput *p, uint8_t *at)
{
	size_t n = 0;

	if (p->state != PUT_KEY && p->state != PUT_LEN && p->state != PUT_BODY &&
	    p->state != PUT_SKIP)
		return 0;
	memcpy(at, p->key, p->key_len);
	n = p->key_len;
	if (p->state == PUT_KEY)
		return n;
	at[n++] = '\n';
	memcpy(at + n, p->len_buf, p->len_have);
	n += p->len_have;
	if (p->state == PUT_BODY) {
		memcpy(at + n, p->v.val + 32, (size_t)p->body_have);
		n += (size_t)p->body_have;
	}
	return n;
}

void wblocks_put_hand_over(struct tree *t, struct handle *h)
{
	struct wput *p = (struct wput *)h;
	struct held_handle *rec = h->fh ? ids_handle_record(t, h->fh) : NULL;
	struct saved sv = { .magic = SAVED_MAGIC };

	pthread_mutex_lock(&p->mu);
	if (!rec || p->received == 0) { /* nothing written: opened again afresh */
		pthread_mutex_unlock(&p->mu);
		return;
	}
	size_t bound = WBLOCKS_LINE_MAX + 1 + 8 + (p->state == PUT_BODY ? p->body_have : 0);
	uint8_t *partial = malloc(bound);
	size_t n = partial ? save_partial(p, partial) : 0;
	size_t len = sizeof(sv) + p->lines_len + n;
	if (!partial || held_text_reserve(&t->held, rec, len) < 0) {
		log_warn("put .blocks: cannot hand the batch to the next daemon; its writer's next "
			 "call fails (EIO)");
		pthread_mutex_unlock(&p->mu);
		free(partial);
		return;
	}
	sv.state = p->state;
	sv.first_error = p->first_error;
	sv.records = p->records;
	sv.received = p->received;
	sv.owner = p->owner;
	sv.skipped = p->state == PUT_SKIP ? p->body_have : 0;
	sv.lines_len = p->lines_len;
	sv.partial_len = n;
	uint8_t *text = held_text(&t->held, rec);
	memcpy(text, &sv, sizeof(sv));
	if (p->lines_len)
		memcpy(text + sizeof(sv), p->lines, p->lines_len);
	memcpy(text + sizeof(sv) + p->lines_len, partial, n);
	rec->text_len = len;
	revive_note(t, h, REVIVE_HANDED);
	pthread_mutex_unlock(&p->mu);
	free(partial);
}

int wblocks_put_restore(struct tree *t, struct wput *p, const uint8_t *text, size_t len)
{
	struct saved sv;

	if (len < sizeof(sv))
		return -EIO;
	memcpy(&sv, text, sizeof(sv));
	if (sv.magic != SAVED_MAGIC || sv.state > PUT_DEAD || sv.lines_len > len - sizeof(sv) ||
	    sv.partial_len > len - sizeof(sv) - sv.lines_len || sv.partial_len > sv.received ||
	    sv.lines_len > WBLOCKS_LINES_MAX)
		return -EIO;
	if (sv.lines_len) {
		if (!(p->lines = malloc((size_t)sv.lines_len)))
			return -ENOMEM;
		memcpy(p->lines, text + sizeof(sv), (size_t)sv.lines_len);
	}
	p->lines_len = p->lines_cap = (size_t)sv.lines_len;
	p->first_error = sv.first_error;
	p->owner = sv.owner;
	p->received = sv.received;
	enum wput_state state = (enum wput_state)sv.state;
	if (state == PUT_DONE || state == PUT_DEAD) {
		p->state = state;
		p->records = sv.records;
		return 0;
	}
	/* The record in progress read again: the state it was in follows. */
	int rc = wblocks_put_consume(t, p, text + sizeof(sv) + sv.lines_len,
				     (size_t)sv.partial_len);
	p->records = sv.records;
	if (rc < 0 || p->state != state)
		return -EIO;
	if (state == PUT_SKIP)
		p->body_have = sv.skipped;
	return 0;
}
