/* SPDX-License-Identifier: Apache-2.0 */
/* Publishing one R3 object (DESIGN.md §3.2): the bytes of open/write/close
 * stream into an unnamed file in the store while the envelope is checked;
 * close (or fsync) commits by linking it into place, or reports why not. */
#ifndef ARTFS_PUBLISH_H
#define ARTFS_PUBLISH_H

#include "format/envelope.h"
#include "state/base.h"

/* Starts a publish onto obj, a fresh node from create (never a committed
 * one: close reports 0 for content identical to a committed key, EEXIST
 * for different). write/close/fsync then go through the handle's
 * operations: close (or fsync) commits and returns the publish's errno; a
 * close by another file table (a forked child dropping its inherited
 * copy) decides nothing. An uncommitted publish leaves nothing behind.
 * Takes a reference on obj. Returns 0, or -ENOENT when the version was
 * removed meanwhile. */
int publish_begin(struct tree *t, struct object *obj, struct handle **h);

/* Batches: a write at offset 0 of len bytes that hold at least the whole
 * header, which the caller has parsed already (env, from these bytes, by
 * envelope_parse_header or _like): as the handle's write, without a second
 * parse. */
int publish_write_parsed(struct tree *t, struct handle *h, const struct envelope *env,
			 const void *buf, size_t len, uint64_t owner);

/* Batches: checks a publish whose bytes are all in (the payload against
 * its checksum) without committing it: 0 when its fsync goes on to commit,
 * else the errno that fsync will return. *to_cluster: 0 and with remote=,
 * its bytes must go to the cluster first (not a key held here already). */
int publish_check(struct tree *t, struct handle *h, bool *to_cluster);

/* Whether n more bytes fit under capacity= now, beside the committed ones
 * and those of the publishes in flight (no collection). */
bool publish_room_for(struct tree *t, uint64_t n);

/* Batches with remote=: checks a publish whose bytes are all in without
 * committing it. 0 with *buf (malloc'd, *len bytes) when it
 * must go to the cluster; 0 with *buf NULL when it needs no cluster write
 * (a key held here already); else the publish's errno. */
int publish_prepare(struct tree *t, struct handle *h, uint8_t **buf, size_t *len);
/* What the cluster said of a prepared publish: 0 lets its fsync commit it
 * here only; an errno makes that its outcome (nothing committed). */
void publish_remote_result(struct tree *t, struct handle *h, int rc);

/* Marks a publish whose bytes come from the cluster (a local miss being
 * cached): checked and committed like any, not written back. */
void publish_mark_fetched(struct handle *h);

/* Marks a publish that never reached its writer (its create failed) so
 * that its release counts nothing. */
void publish_discard(struct handle *h);

/* The bytes written to the publish h so far (the first len of them) into
 * dst: 0, or -EIO. */
int publish_bytes(struct handle *h, uint8_t *dst, size_t len);
/* How many bytes the publish h has taken. */
uint64_t publish_received(struct handle *h);

/* A daemon that takes over goes on with a publish a drained daemon handed
 * over: a fresh one on obj (referenced; taken), fed what was written
 * (len bytes). 0, or -errno (obj released). */
int publish_resume(struct tree *t, struct object *obj, const uint8_t *bytes, size_t len,
		   struct handle **h);
#endif
