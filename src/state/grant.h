/* SPDX-License-Identifier: Apache-2.0 */
/* Attach tokens (DESIGN.md §4, §8): ARTFS_IOC_ATTACH on an open rank<k>
 * file grants its caller the rank's slab descriptors, which it fetches on
 * the mount's socket .artfs/attach with the token the ioctl returned. A
 * token serves one fetch, for GRANT_TTL_NS, and only while the file that
 * asked for it is open (its owner drops its grants on release). Tokens
 * come from getrandom(2) and are compared in constant time. */
#ifndef ARTFS_GRANT_H
#define ARTFS_GRANT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "artfs/artfs.h"

#define GRANTS_MAX 1024
#define GRANTS_PER_OWNER 4   /* an open file's newest; its oldest makes room */
#define GRANT_TTL_NS (30ll * 1000000000)

struct grant {
	uint8_t token[ARTFS_ATTACH_TOKEN_SIZE];
	int64_t expires_ns;          /* CLOCK_MONOTONIC; 0: a free slot */
	void *owner;                 /* what asked (an open rank<k> file) */
};

struct grants {
	pthread_mutex_t mu;
	struct grant v[GRANTS_MAX];
};

void grants_init(struct grants *g);
void grants_destroy(struct grants *g);

/* A new token for owner, valid until now_ns + GRANT_TTL_NS; an owner holds
 * at most GRANTS_PER_OWNER (the new one takes the place of its oldest), so
 * a client that asks again and again cannot crowd others out. 0, -EBUSY
 * (GRANTS_MAX tokens unused and unexpired), -EIO (no random bytes). */
int grants_issue(struct grants *g, void *owner, int64_t now_ns,
		 uint8_t token[ARTFS_ATTACH_TOKEN_SIZE]);

/* Takes token (it serves no second time) and, when it is live, calls
 * use(owner, ctx) with the table locked, so that its owner cannot go
 * meanwhile (grants_drop_owner waits); returns what use returned, or
 * -ENOENT (no such token, or expired). */
int grants_take(struct grants *g, const uint8_t token[ARTFS_ATTACH_TOKEN_SIZE], int64_t now_ns,
		int (*use)(void *owner, void *ctx), void *ctx);

/* Drops every token of owner (it is released). */
void grants_drop_owner(struct grants *g, const void *owner);

/* Live tokens (for tests and metrics). */
unsigned grants_live(struct grants *g, int64_t now_ns);

#endif
