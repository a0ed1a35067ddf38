/* SPDX-License-Identifier: Apache-2.0 */
/* artfs's Redis Cluster client (DESIGN.md §7): R3 envelopes stored as
 * <prefix>:<key hex>, created once (SET NX PX) and read back, and values
 * and sets by name (<prefix>:<name>, the .cache/ tree's), with CRC16
 * slot routing, MOVED and ASK, reconnects and slot-map refreshes.
 *
 * Thread-safe: any number of threads may call one struct remote at once.
 * Every call returns within the configured timeout (connects, redirects and
 * retries included) and never blocks longer; a result is 0 or a negative
 * errno, exactly those of DESIGN.md §7:
 *
 *   put:  0        created, or the key already holds identical bytes
 *         -EEXIST  the key holds different bytes
 *         -ENOSPC  the cluster is out of memory (maxmemory, noeviction)
 *         -EIO     no answer within the timeout, or no replica acknowledged
 *                  the write in time (WAIT) on a shard that has one
 *   get:  0        found (*val malloc'd)
 *         -ENOENT  absent
 *         -EIO     no answer within the timeout
 *
 * Built without hiredis, remote_open fails with -ENOTSUP and says so, and
 * callers need no #ifdef. */
#ifndef ARTFS_REMOTE_H
#define ARTFS_REMOTE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define REMOTE_DEFAULT_PREFIX     "artfs"
#define REMOTE_DEFAULT_TIMEOUT_MS 2000
#define REMOTE_PREFIX_MAX         128
#define REMOTE_KEY_HEX            64

/* The options of DESIGN.md §7; remote_open copies what it keeps. */
struct remote_config {
	char *seeds;          /* remote=         "host:port[,host:port...]" */
	char *prefix;         /* remote_prefix=  NULL or "": "artfs" */
	uint64_t ttl_s;       /* remote_ttl=     expiry of written values, 0 = none */
	uint64_t timeout_ms;  /* remote_timeout= bound of one call, 0: 2000 */
	char *auth_file;      /* remote_auth=    first line is the AUTH password; NULL: none */
};

struct remote;

/* Parses the seeds and reads the password file (-EINVAL, or the errno of
 * opening it; logged), then learns the slot map from the first reachable
 * seed within the timeout. An unreachable cluster is not an error here: it
 * is logged, and each call tries again. */
int remote_open(const struct remote_config *cfg, struct remote **out);
/* Closes every connection; no call may be in flight. NULL is a no-op. */
void remote_close(struct remote *r);

/* key_hex: the 64 lowercase hex digits of the object's key (no "vllm-
 * artifact/"), not necessarily NUL-terminated. Anything else is -EINVAL. */
int remote_put(struct remote *r, const char key_hex[REMOTE_KEY_HEX], const void *val,
	       size_t len);
int remote_get(struct remote *r, const char key_hex[REMOTE_KEY_HEX], uint8_t **val,
	       size_t *len);

/* Batches: one pipelined round per cluster node (a put's WAIT rides in the
 * same pipeline), plus a round for whatever came back redirected, refused
 * (NX: GET to compare) or unanswered, while the timeout allows. results[i]
 * is what remote_put or remote_get would return for record i; vals[i] is
 * NULL unless results[i] is 0. Returns 0 when every result is 0, else the
 * first non-zero result in order (-EINVAL/-ENOMEM before anything is sent). */
int remote_put_many(struct remote *r, size_t n, const char *const *keys_hex,
		    const void *const *vals, const size_t *lens, int *results);
int remote_get_many(struct remote *r, size_t n, const char *const *keys_hex, uint8_t **vals,
		    size_t *lens, int *results);

/* Keys by name, for what is not an R3 object (the .cache/ tree): the key
 * is "<prefix>:<name>", name 1 to REMOTE_NAME_MAX bytes (-EINVAL
 * otherwise). put and get answer as remote_put and remote_get do. */
#define REMOTE_NAME_MAX 4200
int remote_put_named(struct remote *r, const char *name, const void *val, size_t len);
int remote_get_named(struct remote *r, const char *name, uint8_t **val, size_t *len);
/* Many by name, as remote_get_many: one pipelined round per node. */
int remote_get_named_many(struct remote *r, size_t n, const char *const *names, uint8_t **vals,
			  size_t *lens, int *results);

/* Sets, in one pipelined round per node: member i is added to the set
 * named names[i] (SADD), whose expiry is then refreshed to remote_ttl=
 * (PEXPIRE; none when it is 0). results[i]: 0 (added, or already there),
 * -EIO (no answer in time, or the key holds no set), -ENOSPC. Returns 0 or
 * the first non-zero result. */
int remote_sadd_named(struct remote *r, size_t n, const char *const *names,
		      const char *const *members, int *results);
/* The same, each member removed from its set (SREM; an absent member or
 * set is 0). */
int remote_srem_named(struct remote *r, size_t n, const char *const *names,
		      const char *const *members, int *results);
/* member removed from the set named set (SREM, as above) and the key
 * named key deleted (DEL; an absent one is 0), in one call: 0, or the
 * first failure (-EIO). */
int remote_srem_del_named(struct remote *r, const char *set, const char *member, const char *key);
/* The members of the set named name (SMEMBERS): at most max of them (the
 * rest are left out), each a NUL-terminated malloc'd string of at most
 * max_len bytes (longer ones, and ones holding a NUL, are left out); an
 * absent set is 0 members. 0 (*members malloc'd, free with
 * remote_members_free), -EIO, -EINVAL, -ENOMEM. */
int remote_members_named(struct remote *r, const char *name, size_t max, size_t max_len,
			 char ***members, size_t *count);
void remote_members_free(char **members, size_t count);

/* Counters since remote_open, for tests and for the caller's own logic. */
struct remote_stats {
	uint64_t hits, misses, puts, errors;
	uint64_t bytes_in, bytes_out;
	uint64_t rounds;       /* pipelines sent: one per node per round */
	uint64_t moved, asked; /* redirections followed */
	uint64_t refreshes;    /* slot maps learnt */
	uint64_t connects;
};
void remote_stats(struct remote *r, struct remote_stats *out);

/* Appends the client's metrics in Prometheus text format to f
 * (artfs_remote_hits_total, _misses_total, _errors_total, _bytes_total{dir},
 * _latency_seconds histogram, ...); nothing when r is NULL. */
void remote_metrics_render(struct remote *r, FILE *f);

#endif
