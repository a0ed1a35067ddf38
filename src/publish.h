/* Publishing one R3 object (DESIGN.md §3.2): the bytes of open/write/close
 * stream into an unnamed file in the store while the envelope is checked;
 * close (or fsync) commits by linking it into place, or reports why not. */
#ifndef ARTFS_PUBLISH_H
#define ARTFS_PUBLISH_H

#include "tree.h"

/* Starts a publish of <ver>/<name> onto obj: a fresh object from create, or
 * the committed one when an existing name is opened for writing (then close
 * reports 0 for identical content, EEXIST otherwise). Takes a reference on
 * obj. Returns 0 or a negative errno. */
int publish_begin(struct tree *t, struct object *obj, struct handle **h);

int publish_write(struct tree *t, struct handle *h, uint64_t off, const void *buf, size_t len,
		  uint64_t owner);
/* Commits once all bytes are in; returns the publish's errno (0 when
 * committed or identical). An incomplete object returns -EBADMSG and stays
 * open for the rest (another descriptor of the same file may still write). */
int publish_finish(struct tree *t, struct handle *h);
/* close(): the writer's own close finishes the publish; a close by another
 * file table (a forked child dropping its inherited copy) decides nothing
 * and returns 0, unless the publish already has its result. */
int publish_close(struct tree *t, struct handle *h, uint64_t owner);
/* True while another thread works on this publish (a write in progress). */
bool publish_busy(struct handle *h);
/* Marks a publish that never reached its writer (its create failed) so
 * that its release counts nothing. */
void publish_discard(struct handle *h);
/* Last close: an uncommitted publish is dropped, leaving nothing behind. */
void publish_release(struct tree *t, struct handle *h);

#endif
