/* SPDX-License-Identifier: Apache-2.0 */
/* The wire between the holder (fs/holder.c: the process that makes and
 * holds the mount) and the serving daemon it forks, and the descriptors
 * the holder keeps for the daemons (DESIGN.md §8): a daemon hands the
 * holder a descriptor whose object must outlive it (KEEP, under a tag),
 * and a later daemon asks for it back (FETCH). The holder only stores and
 * returns descriptors; it opens nothing a daemon gives it.
 *
 * One SOCK_SEQPACKET socket pair per daemon: each message is one struct
 * keeper_msg, a descriptor rides with KEEP and with the answer to FETCH
 * (SCM_RIGHTS). No CUDA, no FUSE: both sides link it. */
#ifndef ARTFS_KEEPER_H
#define ARTFS_KEEPER_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KEEPER_TAG_MAX 96

enum keeper_type {
	/* daemon -> holder */
	KEEPER_READY = 1,   /* serving; value: 0, or -errno: could not start (text: why) */
	KEEPER_KEEP,        /* keep the descriptor that rides along under tag */
	KEEPER_DROP,        /* close what is kept under tag (a prefix, with value 1) */
	KEEPER_FETCH,       /* send back what is kept under tag */
	KEEPER_UPGRADE,     /* start the binary on disk as the next daemon */
	KEEPER_DRAINED,     /* drained: every request answered, state handed over */
	/* holder -> daemon */
	KEEPER_FD,          /* the answer to FETCH: value 0 with the descriptor, or -ENOENT */
	KEEPER_DRAIN,       /* stop reading requests, finish, hand over, exit */
	KEEPER_GO,          /* (a daemon started for an upgrade) the old one is gone: serve */
	KEEPER_ACK,         /* the answer to KEEP, DROP, UPGRADE: value 0 or -errno */
	/* daemon -> holder (answered by KEEPER_FD with the tag found) */
	KEEPER_NEXT,        /* the value-th kept tag that begins with tag */
};

struct keeper_msg {
	uint32_t type;           /* enum keeper_type */
	int32_t value;
	char tag[KEEPER_TAG_MAX]; /* NUL-terminated; or a short text (READY's why) */
};

/* Sends m, with fd (>= 0) as ancillary data. 0 or -errno. */
int keeper_send(int sock, const struct keeper_msg *m, int fd);

/* Receives one message (waiting up to timeout_ms, -1 for ever); a
 * descriptor that rides along lands in *fd (else -1; fd may be NULL when
 * none is expected: one that comes anyway is closed). 0, -ETIMEDOUT,
 * -ECONNRESET (the other side is gone) or -EPROTO (not one message of
 * this wire). */
int keeper_recv(int sock, struct keeper_msg *m, int *fd, int timeout_ms);

/* A message of type with tag (may be NULL) and value. */
struct keeper_msg keeper_msg_make(enum keeper_type type, const char *tag, int32_t value);

/* ---- the holder's store of descriptors --------------------------------------- */

struct keeper_store;

struct keeper_store *keeper_store_new(void);
void keeper_store_free(struct keeper_store *s);   /* closes every descriptor */

/* Keeps fd under tag (taking it: the store closes it), replacing what the
 * tag held. 0, -EINVAL (tag empty or too long), -ENOMEM, -ENOSPC (full). */
int keeper_store_keep(struct keeper_store *s, const char *tag, int fd);
/* What tag holds (the store keeps it), or -ENOENT. */
int keeper_store_get(const struct keeper_store *s, const char *tag);
/* Closes what tag holds, or (prefix) every tag that begins with it; the
 * number closed. */
int keeper_store_drop(struct keeper_store *s, const char *tag, bool prefix);
/* The index-th kept tag that begins with prefix (in the store's order,
 * which only KEEP of a new tag and DROP change): its descriptor (the store
 * keeps it) with its tag copied to tag_out, or -ENOENT past the last. */
int keeper_store_nth(const struct keeper_store *s, const char *prefix, uint32_t index,
		     char tag_out[KEEPER_TAG_MAX]);
size_t keeper_store_count(const struct keeper_store *s);

/* The holder's answer to one message of a daemon (KEEP, DROP, FETCH), sent
 * on sock; other types are the caller's. true when m was one of those. */
bool keeper_store_serve(struct keeper_store *s, int sock, const struct keeper_msg *m, int fd);

/* ---- the daemon's side ----------------------------------------------------------- */

/* Through the daemon's link to its holder: keep fd under tag (the caller
 * keeps its own descriptor), fetch what tag holds (a new descriptor in
 * *fd), drop tag. 0 or -errno; each waits for the holder's answer. Not for
 * several threads at once: callers serialize. */
int keeper_keep(int link, const char *tag, int fd);
int keeper_fetch(int link, const char *tag, int *fd);
int keeper_drop(int link, const char *tag, bool prefix);
/* The index-th kept tag that begins with prefix: its tag in tag_out and a
 * new descriptor in *fd; -ENOENT past the last. Enumerates what the holder
 * keeps (index 0, 1, ... until -ENOENT) while nothing else keeps or drops. */
int keeper_next(int link, const char *prefix, uint32_t index, char tag_out[KEEPER_TAG_MAX],
		int *fd);

/* The daemon's link for descriptors, shared by its threads (one call at a
 * time). fd -1: no holder (unit tests, fuzz targets): every call answers
 * -ENOTCONN. */
struct keeper_link {
	int fd;
	pthread_mutex_t mu;
};

void keeper_link_init(struct keeper_link *k, int fd);
void keeper_link_destroy(struct keeper_link *k);
int keeper_link_keep(struct keeper_link *k, const char *tag, int fd);
int keeper_link_fetch(struct keeper_link *k, const char *tag, int *fd);
int keeper_link_drop(struct keeper_link *k, const char *tag, bool prefix);
int keeper_link_next(struct keeper_link *k, const char *prefix, uint32_t index,
		     char tag_out[KEEPER_TAG_MAX], int *fd);

#endif
