/* SPDX-License-Identifier: Apache-2.0 */
/* .blocks/.put (DESIGN.md §10): records <key>\n<u64 little-endian
 * length><payload>, back to back, any write sizes (records may span
 * writes; writes are sequential). Each record is committed on its own as
 * soon as its last byte arrives (blocks_keys.c: a key held already keeps
 * its first bytes, 0). fsync, close, or a read from offset 0 end the
 * transaction: 0 when every record committed, else the errno of the first
 * that did not; a record cut short is EBADMSG and commits nothing. A read
 * from offset 0 then gives one line per record, "<key> <0|EEXIST|EINVAL|
 * EBADMSG|ENOSPC|EFBIG|EIO>". A key line of more than 4096 bytes ends
 * the batch (EBADMSG: the stream cannot be followed after it).
 *
 * A daemon that dies during a batch: the records it committed stay, each
 * whole; the next daemon answers the writer's next call EIO, once (as
 * .keys/.put, §8), and the retry of the batch succeeds (committed records
 * are identical: 0). An upgrade hands the batch over
 * (blocks_put_handover.c): no error. The records themselves:
 * blocks_put_records.c. */
#include "autoconf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/log.h"
#include "state/ids.h"
#include "trees/blocks.h"

static int put_write(struct tree *t, struct handle *h, uint64_t off, const void *buf, size_t len,
		     uint64_t owner)
{
	struct wput *p = (struct wput *)h;
	int rc;

	pthread_mutex_lock(&p->mu);
	if (p->state == PUT_DONE)
		rc = -EINVAL; /* one transaction per open */
	else if (p->state == PUT_DEAD)
		rc = -EBADMSG;
	else if (off != p->received)
		rc = -EINVAL; /* records are a stream: sequential writes only */
	else {
		if (p->received == 0) { /* a daemon that takes over cannot go on with it */
			revive_note(t, h, REVIVE_BUSY);
			p->owner = owner;
		}
		rc = wblocks_put_consume(t, p, buf, len);
		p->received += len;
	}
	pthread_mutex_unlock(&p->mu);
	if (rc < 0 && rc != -EBADMSG)
		log_warn("put .blocks: write refused (%s)", strerror(-rc));
	return rc < 0 ? rc : (int)len;
}

/* Ends the transaction (under mu): a record cut short is EBADMSG. */
static int put_end(struct wput *p)
{
	if (p->state == PUT_DONE)
		return p->first_error;
	bool cut = p->state == PUT_LEN || p->state == PUT_BODY || p->state == PUT_SKIP ||
		   (p->state == PUT_KEY && p->key_len);
	if (cut) {
		log_warn("put .blocks: record %llu (%.*s) cut short; nothing of it committed",
			 (unsigned long long)p->records, (int)p->key_len, p->key);
		wblocks_put_line(p, p->key, p->key_len, -EBADMSG);
	}
	wblocks_put_reset(p);
	p->state = PUT_DONE;
	return p->first_error;
}

static int put_fsync(struct tree *t, struct handle *h)
{
	struct wput *p = (struct wput *)h;

	(void)t;
	pthread_mutex_lock(&p->mu);
	int rc = put_end(p);
	pthread_mutex_unlock(&p->mu);
	return rc;
}

/* The writer's close ends the batch; a close before any write (a shell's
 * dup2 of the descriptor it redirects) or by another file table does not. */
static int put_flush(struct tree *t, struct handle *h, uint64_t owner)
{
	struct wput *p = (struct wput *)h;

	(void)t;
	pthread_mutex_lock(&p->mu);
	bool foreign = p->state != PUT_DONE &&
		       (!p->received || (owner && p->owner && owner != p->owner &&
					 owner != TREE_OWNER_KILLED));
	int rc = foreign ? 0 : put_end(p);
	pthread_mutex_unlock(&p->mu);
	return rc;
}

/* A read from offset 0 ends the transaction as fsync does; the lines. */
static int put_read(struct tree *t, struct handle *h, uint64_t off, size_t size,
		    const void **data, size_t *len)
{
	struct wput *p = (struct wput *)h;

	(void)t;
	pthread_mutex_lock(&p->mu);
	if (off == 0)
		put_end(p);
	bool done = p->state == PUT_DONE;
	pthread_mutex_unlock(&p->mu);
	if (!done)
		return -EINVAL;
	buffer_slice(p->lines, p->lines_len, off, size, data, len);
	return 0;
}

static void put_release(struct tree *t, struct handle *h)
{
	struct wput *p = (struct wput *)h;

	(void)t;
	wvalue_free(&p->v);
	free(p->queue); /* empty: every write flushes it */
	free(p->lines);
	pthread_mutex_destroy(&p->mu);
	free(p);
}

static bool never_quick(struct tree *t, struct handle *h)
{
	(void)t, (void)h;
	return false;
}

static bool write_never_quick(struct tree *t, struct handle *h, size_t len)
{
	(void)t, (void)h, (void)len;
	return false; /* commits blocks, with remote= through the cluster */
}

static const struct handle_ops put_ops = {
	.hand_over = wblocks_put_hand_over,
	.kind = "blocks put",
	.held_kind = HANDLE_BLOCKS_PUT,
	.read = put_read,
	.write = put_write,
	.flush = put_flush,
	.fsync = put_fsync,
	.release = put_release,
	.read_quick = never_quick,
	.write_quick = write_never_quick,
	.flush_quick = never_quick,
};

int wblocks_put_resume(struct tree *t, const uint8_t *text, size_t len, struct handle **h)
{
	struct open_reply r = { 0 };
	int rc = wblocks_put_open(t, h, &r);

	if (rc < 0)
		return rc;
	struct wput *p = (struct wput *)*h;
	pthread_mutex_lock(&p->mu);
	rc = wblocks_put_restore(t, p, text, len);
	pthread_mutex_unlock(&p->mu);
	if (rc < 0) {
		log_warn("put .blocks: the batch a drained daemon handed over cannot go on (%s)",
			 strerror(-rc));
		put_release(t, *h);
		*h = NULL;
	}
	return rc;
}

int wblocks_put_open(struct tree *t, struct handle **h, struct open_reply *r)
{
	struct wput *p = calloc(1, sizeof(*p));

	if (!p)
		return -ENOMEM;
	handle_init(&p->h, &put_ops);
	pthread_mutex_init(&p->mu, NULL);
	p->t = t;
	p->state = PUT_KEY;
	r->direct_io = true; /* what is read is not what was written */
	*h = &p->h;
	return 0;
}
