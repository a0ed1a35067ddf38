/* Publishing one R3 object (DESIGN.md §3.2): the bytes of open/write/close
 * stream into an unnamed file in the store while the envelope is checked;
 * close (or fsync) commits by linking it into place, or reports why not. */
#ifndef ARTFS_PUBLISH_H
#define ARTFS_PUBLISH_H

#include "base.h"

/* Starts a publish onto obj, a fresh node from create (never a committed
 * one: close reports 0 for content identical to a committed key, EEXIST
 * for different). write/close/fsync then go through the handle's
 * operations: close (or fsync) commits and returns the publish's errno; a
 * close by another file table (a forked child dropping its inherited
 * copy) decides nothing. An uncommitted publish leaves nothing behind.
 * Takes a reference on obj. Returns 0, or -ENOENT when the version was
 * removed meanwhile. */
int publish_begin(struct tree *t, struct object *obj, struct handle **h);

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
#endif
