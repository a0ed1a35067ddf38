/* SPDX-License-Identifier: Apache-2.0 */
/* Reading a batch's records from its writes (r3/put.c): the `<hash>\n`
 * line of each record of <wv>/.put, then its envelope's length prefix and
 * header, parsed once; the rest buffered for the queue (put_queue.c),
 * staged from the write itself, streamed to its publish when large, or
 * passed over when refused. A large write begins a flush that stages its
 * records as they are read. */
#include "autoconf.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "format/envelope.h"
#include "format/key.h"
#include "lib/log.h"
#include "lib/parallel.h"
#include "r3/publish.h"
#include "r3/put_i.h"

void put_records_next(struct put *p)
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
	return p->nqueued == PUT_PIPELINE && between_records(p) ? put_queue_flush(t, p) : 0;
}

/* A record refused before its publish began: its line comes in its turn. */
static void refuse(struct put *p, int rc)
{
	p->cur.refused = rc;
	put_queue_add(p);
}

/* A large record: the queue is flushed (records commit in order), then its
 * bytes go to its publish as they come. */
static int start_stream(struct tree *t, struct put *p)
{
	struct put_rec *r = &p->cur;
	int flushed = put_queue_flush(t, p);
	int rc = put_queue_publish_begin(t, p->ver, r);

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
		log_warn("put %s: record %u: %s; the rest of the batch is refused", put_where(p),
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
	if (total > PUT_BUFFER_RECORD_MAX || !put_queue_buffer_room(t, p, (size_t)total))
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
		put_queue_add(p);
	put_records_next(p);
}

/* A record begins after the last one a batch may hold: the rest is
 * refused, and the result lines end with one that says so. */
static int overflow(struct tree *t, struct put *p)
{
	log_warn("put %s: more than %u records in one batch; the rest is refused (EFBIG)",
		 put_where(p), PUT_RECORDS_MAX);
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
		log_warn("put %s: record %u: \"%.140s\" is not a block hash", put_where(p), p->seen,
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
				 "the rest of the batch is refused", put_where(p),
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

int put_records_consume(struct tree *t, struct put *p, const uint8_t *buf, size_t len)
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
 * put_queue_flush_threads); without remote=, whose round to the cluster
 * takes the queue whole. */
void put_records_stream_begin(struct tree *t, struct put *p, size_t len)
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
	if ((header_begun && !put_queue_buffer_room(t, p, len)) ||
	    put_queue_flush_threads(t, p->buf_len + len) == 1)
		return;
	put_queue_flush_begin(t, p, PARALLEL_THREADS_MAX, PUT_PIPELINE);
}

/* The write is read: the flush it began ends (it never outlives the
 * write). A record that goes on in the next write keeps its bytes, moved
 * to the front of the emptied buffer. */
void put_records_stream_end(struct tree *t, struct put *p)
{
	if (!p->flush.open)
		return;
	size_t from = p->cur.off, keep = p->state == PUT_BODY ? p->buf_len - p->cur.off : 0;
	put_queue_flush(t, p); /* a line it cannot write is the batch's errno */
	if (keep) {
		memmove(p->buf, p->buf + from, keep);
		p->cur.off = 0;
		p->buf_len = keep;
	}
}
