/* SPDX-License-Identifier: Apache-2.0 */
/* What .blocks/'s files share (DESIGN.md §10): blocks by key
 * (blocks_keys.c) for its batches, .put (blocks_put.c) and .get
 * (blocks_get.c). Inside src/trees/ only. */
#ifndef ARTFS_TREES_BLOCKS_H
#define ARTFS_TREES_BLOCKS_H

#include <pthread.h>

#include "trees/wtree_i.h"

#define WBLOCKS_LINES_MAX (16u << 20) /* bytes of result lines one batch keeps */
/* A key line longer than a key is that record's EINVAL up to this many
 * bytes; past them the stream is not one of records (the batch ends). */
#define WBLOCKS_LINE_MAX 4096

/* Records a write completes are committed together, spread over a few
 * threads (each costs a few system calls), at most this many at once. */
#define WBLOCKS_PUT_GROUP 256
#define WBLOCKS_PUT_PER_THREAD 8

enum wput_state { PUT_KEY, PUT_LEN, PUT_BODY, PUT_SKIP, PUT_DONE, PUT_DEAD };

/* A record read whole, waiting for its commit (or its refusal: error). */
struct precord {
	char *key;               /* malloc'd, key_len bytes (printable or not) */
	size_t key_len;
	struct wvalue v;
	int error;
};

struct wput {
	struct handle h;
	pthread_mutex_t mu;
	enum wput_state state;
	uint64_t received;       /* bytes of the stream */
	uint64_t owner;          /* the file table that writes */
	char key[WBLOCKS_LINE_MAX];
	size_t key_len;
	uint8_t len_buf[8];
	size_t len_have;
	uint64_t body_len, body_have;
	struct wvalue v;         /* SHA-256, then the body */
	int record_error;        /* decided before its body: EINVAL, EFBIG */
	char *lines;
	size_t lines_len, lines_cap;
	int first_error;
	uint64_t records;
	struct precord *queue;   /* records read whole, not committed yet */
	size_t nqueued, queue_cap;
	struct tree *t;          /* for the commit threads */
};

/* blocks_put_records.c: the batch's bytes read on (records committed as
 * they end, each one's line added); a record's line (and the batch's
 * errno, if first); the record in progress forgotten. */
int wblocks_put_consume(struct tree *t, struct wput *p, const uint8_t *buf, size_t len);
void wblocks_put_line(struct wput *p, const char *key, size_t key_len, int rc);
void wblocks_put_reset(struct wput *p);
/* blocks_put_handover.c: an upgrade's drained daemon hands an open batch
 * over in its handle's record; the next daemon goes on with it. */
void wblocks_put_hand_over(struct tree *t, struct handle *h);
int wblocks_put_restore(struct tree *t, struct wput *p, const uint8_t *text, size_t len);

/* The block of key (len bytes, checked by wblocks_key_check), referenced,
 * with its size; NULL when this node holds none. */
struct wnode *wblocks_find(struct wtree *w, const char *key, size_t len, uint64_t *size);
/* The block v (SHA-256 then bytes) committed as key: its directories made
 * as needed, sent to the cluster first (remote=, unless fetched from it).
 * A key held already keeps its first bytes (other bytes: counted, logged)
 * and is 0. *out (when not NULL) the key's block, referenced. -EEXIST: a
 * directory holds the key's name or a block a directory's; -ENOSPC,
 * -EIO (the cluster did not take it), -errno: nothing committed. */
int wblocks_place(struct tree *t, struct wtree *w, const char *key, size_t len,
		  const struct wvalue *v, bool fetched, struct wnode **out);

#endif
