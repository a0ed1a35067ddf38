/* SPDX-License-Identifier: Apache-2.0 */
/* Reading committed R3 objects (DESIGN.md §3.3): the served .npy bytes,
 * verified against payload_sha256 whenever they come from the store, and
 * the user.artfs.* attributes. */
#ifndef ARTFS_OBJECT_H
#define ARTFS_OBJECT_H

#include "format/envelope.h"
#include "state/base.h"

/* Reads and checks the stored header of <ver>/<hash> (no payload check):
 * well-formed, the key of its path, the file's size. -ENOENT if absent,
 * -EIO (logged) if the store holds something else. */
int object_read_meta(struct tree *t, struct version *ver, const uint8_t *hash, size_t hash_len,
		     struct envelope *env);

/* Verifies the stored <ver>/<hash> whole, reading it once: its header
 * must describe the same content as expect (from object_read_meta) and its
 * payload hash to payload_sha256. With dst, the payload (payload_len
 * bytes) lands there. 0, -ENOENT, -EMFILE/-ENFILE/-ENOMEM, or -EIO
 * (logged, counted). */
int object_verify(struct tree *t, struct version *ver, const uint8_t *hash, size_t hash_len,
		  const struct envelope *expect, uint8_t *dst);

/* Reads the stored object o whole into dst (size bytes, its envelope size)
 * and verifies it: well-formed, the key of its name, its payload against
 * payload_sha256. 0, -ENOENT, resource errors, or -EIO (logged, counted).
 * Once o's header is known (object_header_learn), the header read back is
 * checked by its digest instead of being parsed again. */
int object_load_envelope(struct tree *t, struct object *o, uint8_t *dst, size_t size);

/* Remembers o's header (the JSON, len bytes), which has passed every check
 * of a publish, so that later reads of the envelope compare a digest of
 * it instead of parsing it (see struct object). */
void object_header_learn(struct tree *t, struct object *o, const uint8_t *json, size_t len);
/* The same for an object that no other thread can reach yet (a publish's
 * own, before its commit indexes it): no lock. */
void object_header_learn_unshared(struct object *o, const uint8_t *json, size_t len);

/* The envelope size of a committed object (its store file's size). */
int object_envelope_size(struct tree *t, struct object *o, uint64_t *size);

/* Makes o->npy_size known (read from the store after a restart). */
int object_know_size(struct tree *t, struct object *o);

/* Opens a committed object for reading: reads serve its .npy, verified
 * against payload_sha256 before the first byte. */
int object_open(struct tree *t, struct object *o, struct handle **h, struct open_reply *r);
/* The same for its envelope exactly as published (.keys/<key>), read and
 * verified whole at the first read (object_load_envelope). */
int object_open_envelope(struct tree *t, struct object *o, struct handle **h,
			 struct open_reply *r);

int object_getxattr(struct tree *t, struct object *o, const char *name, char *buf, size_t cap,
		    size_t *len);
int object_listxattr(char *buf, size_t cap, size_t *len);

#endif
