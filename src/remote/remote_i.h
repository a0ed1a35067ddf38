/* SPDX-License-Identifier: Apache-2.0 */
/* What the files of src/remote/ share (other folders see only
 * remote/remote.h): the client, its nodes and their connections, a call's
 * ops, and the functions one file of the folder gives the others. */
#ifndef ARTFS_REMOTE_I_H
#define ARTFS_REMOTE_I_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "remote/cluster.h"
#include "remote/redis.h"
#include "remote/remote.h"
#include "remote/stats.h"

#define POOL_SIZE      4     /* connections per node: parallel calls to one node */
#define NODES_MAX      1024  /* addresses ever seen: seeds, masters, redirections */
#define NODE_NONE      0xffff

struct pooled {
	pthread_mutex_t lock;
	struct redis_conn *conn;   /* NULL until first used, and after a failure */
};

struct node {
	struct cluster_addr addr;
	char name[CLUSTER_HOST_MAX + 8];   /* host:port, for logs */
	atomic_int replicas;               /* healthy replicas of the shard it masters */
	atomic_uint next;                  /* where the next acquire starts */
	struct pooled pool[POOL_SIZE];
};

struct remote {
	char prefix[REMOTE_PREFIX_MAX + 1];
	char ttl_ms[24];                   /* PX argument; "" when ttl is 0 */
	uint64_t timeout_ms;
	char *password;

	/* nodes[] only grows and its entries never change, so an index read
	 * under the lock stays valid after it. */
	pthread_rwlock_t map_lock;
	struct node *nodes[NODES_MAX];
	size_t nnodes;
	uint16_t slots[CLUSTER_SLOTS];     /* slot -> node index, NODE_NONE */

	pthread_mutex_t refresh_lock;      /* one CLUSTER SLOTS at a time */
	atomic_uint_fast64_t map_gen;      /* full refreshes installed */
	_Atomic int64_t map_time;          /* when, monotonic ns; 0: never */
	atomic_bool map_stale;             /* learn it before the next call */
	atomic_uint refresh_next;          /* node asked first, rotating */

	pthread_mutex_t log_lock;          /* the next four */
	int64_t log_second;
	unsigned log_lines, log_suppressed;
	char map_error[240];               /* why the last refresh failed, for the log */

	struct remote_metrics metrics;
};

enum step {
	STEP_SET,      /* put: SET NX PX */
	STEP_COMPARE,  /* put refused by NX: GET to compare */
	STEP_WAIT,     /* put written: waiting for the WAIT in the same pipeline */
	STEP_GET,      /* get */
	STEP_SADD,     /* add (or remove) a member of a set, PEXPIRE in the same pipeline */
	STEP_EXPIRE,   /* added: waiting for the PEXPIRE that follows */
	STEP_MEMBERS,  /* SMEMBERS */
	STEP_DEL,      /* DEL */
	STEP_DONE,
};

struct op {
	const uint8_t *val;   /* put */
	size_t len;
	uint8_t *got;         /* get, or compare: the value found */
	size_t got_len;
	const char *set_cmd;  /* STEP_SADD: "SADD", or "SREM" */
	char **members;       /* SMEMBERS: what came back (NUL-terminated, malloc'd) */
	size_t nmembers;
	size_t members_max;   /* at most this many kept, each at most member_len bytes */
	size_t member_len;
	/* key points at key_buf for an R3 key (no allocation in a batch), or
	 * at a malloc'd "<prefix>:<name>" for a named one. */
	char *key;
	char key_buf[REMOTE_PREFIX_MAX + 2 + REMOTE_KEY_HEX];
	size_t key_len;
	unsigned slot;
	enum step step;
	int result;
	uint16_t ask;         /* node of an ASK, for the next attempt only */
	uint16_t node;        /* of the last attempt, for logs */
	uint32_t lane;        /* in this round; UINT32_MAX when not sent */
	uint8_t redirects;
	bool asking;          /* this attempt goes with ASKING */
	char why[200];        /* the last failure, for the log */
};

/* slots.c: waiting, nodes and connections, the slot map. */
struct timespec remote_abs_time(int64_t deadline);
int remote_lock_until(pthread_mutex_t *m, int64_t deadline);
uint16_t remote_node_intern(struct remote *r, const struct cluster_addr *a);
void remote_node_free(struct node *n);
struct pooled *remote_pool_acquire(struct node *n, int64_t deadline);
void remote_count_bytes(struct remote *r, struct redis_conn *c);
void remote_pool_drop(struct remote *r, struct pooled *p);
int remote_conn_open(struct remote *r, const struct node *n, int64_t deadline,
	      struct redis_conn **out, char *err, size_t errlen);
int remote_map_refresh(struct remote *r, uint64_t seen_gen, int64_t deadline);

/* pipeline.c: one call, every op done (result set) when it returns. what
 * names the call in logs ("put", "get", "sadd", "smembers"). */
void remote_call_run(struct remote *r, struct op *ops, size_t n, int64_t started,
		     const char *what);

#endif
