/* SPDX-License-Identifier: Apache-2.0 */
/* The Redis Cluster client (see remote.h). What it chose where DESIGN.md
 * section 7 is silent:
 *
 * - Time. A call's timeout covers everything: connects, rounds, map
 *   refreshes, back-off. Sockets are non-blocking and every wait is a
 *   poll() or a timed lock up to the deadline; one connect gets at most a
 *   quarter of the timeout (at least 100 ms), so a node that swallows
 *   packets leaves time for the others. Host names are resolved with
 *   getaddrinfo, which does not know the deadline: give addresses.
 * - Retries. A refused or broken connection, CLUSTERDOWN, TRYAGAIN,
 *   LOADING, MASTERDOWN, READONLY and unanswered commands are tried again
 *   (after a map refresh and a back-off of 10 ms doubling to 200 ms) while
 *   the timeout allows, then EIO. NOAUTH, a refused AUTH and other error
 *   replies are EIO at once. SET NX and GET are idempotent, so a command
 *   that may or may not have run before a connection broke is just sent
 *   again.
 * - Replication. WAIT 1 rides in the pipeline of the SETs when the shard
 *   has a healthy replica (CLUSTER NODES: a slave without fail, fail?,
 *   handshake or noaddr), with three quarters of the time left. No
 *   acknowledgement in time is EIO (logged) although the value stays on
 *   the master: a retry then finds it identical and returns 0. A shard
 *   whose replica failed (or that has none) is written without WAIT.
 * - The map. Learnt at open, after MOVED (the slot itself is updated at
 *   once), after any retryable failure, after a WAIT nobody acknowledged,
 *   and before a call when older than a minute (new replicas, resharding
 *   that no MOVED revealed). Nodes are asked in turn, seeds included.
 * - Connections. Up to 4 per node, opened on first use and kept; a batch
 *   holds one per node it touches, taken in node order, so that calls
 *   never wait on each other in a circle.
 * - AUTH. The first line of remote_auth= is the password of the default
 *   user (AUTH <password>); a file readable by every user is warned of.
 * - Logs. One line per failed key (at most 4 per call, then a count), at
 *   most 10 lines a second in all, each with the key and the node.
 *
 * This file is the API, open and close; slots.c the nodes, their
 * connections and the slot map; pipeline.c one call's rounds of
 * pipelines; remote_i.h what they share. */
#include "autoconf.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "lib/log.h"
#include "remote/cluster.h"
#include "remote/redis.h"
#include "remote/remote.h"
#include "remote/remote_i.h"
#include "remote/stats.h"

#define AUTH_LINE_MAX  4096
#define TTL_MAX_S      (100ull * 365 * 86400)   /* PX must stay far below 2^63 ms */
#define TIMEOUT_MAX_MS 3600000ull

/* ---- the API ------------------------------------------------------------------------ */

static bool key_hex_valid(const char *hex)
{
	for (int i = 0; i < REMOTE_KEY_HEX; i++)
		if (!((hex[i] >= '0' && hex[i] <= '9') || (hex[i] >= 'a' && hex[i] <= 'f')))
			return false;
	return true;
}

/* Ops for n keys, or NULL with -EINVAL/-ENOMEM in *rc. */
static struct op *ops_new(struct remote *r, size_t n, const char *const *keys_hex, bool put,
			  int *rc)
{
	struct op *ops = calloc(n, sizeof(*ops));

	if (!ops) {
		*rc = -ENOMEM;
		return NULL;
	}
	for (size_t i = 0; i < n; i++) {
		struct op *op = &ops[i];
		if (!keys_hex[i] || !key_hex_valid(keys_hex[i])) {
			free(ops);
			*rc = -EINVAL;
			return NULL;
		}
		op->key = op->key_buf;
		op->key_len = (size_t)snprintf(op->key, sizeof(op->key_buf), "%s:%.64s", r->prefix,
					       keys_hex[i]);
		op->slot = cluster_key_slot(op->key, op->key_len);
		op->step = put ? STEP_SET : STEP_GET;
		op->ask = NODE_NONE;
		op->node = NODE_NONE;
	}
	return ops;
}

static void ops_free(struct op *ops, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (ops[i].key != ops[i].key_buf)
			free(ops[i].key);
	free(ops);
}

/* Ops for n named keys ("<prefix>:<name>"), each starting at step, or NULL
 * with -EINVAL/-ENOMEM in *rc. */
static struct op *ops_new_named(struct remote *r, size_t n, const char *const *names,
				enum step step, int *rc)
{
	struct op *ops = calloc(n, sizeof(*ops));

	*rc = ops ? 0 : -ENOMEM;
	for (size_t i = 0; ops && i < n; i++) {
		struct op *op = &ops[i];
		size_t len = names[i] ? strnlen(names[i], REMOTE_NAME_MAX + 1) : 0;
		op->key = op->key_buf;   /* until its own, so that ops_free skips it */
		if (len == 0 || len > REMOTE_NAME_MAX)
			*rc = -EINVAL;
		else if (!(op->key = malloc(strlen(r->prefix) + 1 + len + 1)))
			*rc = -ENOMEM;
		if (*rc < 0) {
			if (!op->key)
				op->key = op->key_buf;
			ops_free(ops, i + 1);
			return NULL;
		}
		op->key_len = (size_t)sprintf(op->key, "%s:%s", r->prefix, names[i]);
		op->slot = cluster_key_slot(op->key, op->key_len);
		op->step = step;
		op->ask = NODE_NONE;
		op->node = NODE_NONE;
	}
	return ops;
}

/* Each op's result into results, ops freed: 0, or the first result that
 * is not. */
static int results_end(struct op *ops, size_t n, int *results)
{
	int rc = 0;

	for (size_t i = 0; i < n; i++) {
		results[i] = ops[i].result;
		if (rc == 0)
			rc = ops[i].result;
	}
	ops_free(ops, n);
	return rc;
}

int remote_put_many(struct remote *r, size_t n, const char *const *keys_hex,
		    const void *const *vals, const size_t *lens, int *results)
{
	int64_t started = redis_now();
	int rc = 0;

	if (n == 0)
		return 0;
	struct op *ops = ops_new(r, n, keys_hex, true, &rc);
	if (!ops)
		return rc;
	for (size_t i = 0; i < n; i++) {
		ops[i].val = vals[i];
		ops[i].len = lens[i];
	}
	remote_call_run(r, ops, n, started, "put");
	return results_end(ops, n, results);
}

/* A batch of gets run, each one's value handed over (or freed), ops freed:
 * 0, or the first result that is not. */
static int gets_end(struct remote *r, struct op *ops, size_t n, int64_t started, uint8_t **vals,
		    size_t *lens, int *results)
{
	remote_call_run(r, ops, n, started, "get");
	for (size_t i = 0; i < n; i++) {
		vals[i] = ops[i].result == 0 ? ops[i].got : NULL;
		lens[i] = ops[i].result == 0 ? ops[i].got_len : 0;
		if (ops[i].result != 0)
			free(ops[i].got);
	}
	return results_end(ops, n, results);
}

int remote_get_many(struct remote *r, size_t n, const char *const *keys_hex, uint8_t **vals,
		    size_t *lens, int *results)
{
	int64_t started = redis_now();
	int rc = 0;

	if (n == 0)
		return 0;
	struct op *ops = ops_new(r, n, keys_hex, false, &rc);
	if (!ops)
		return rc;
	return gets_end(r, ops, n, started, vals, lens, results);
}

int remote_put(struct remote *r, const char key_hex[REMOTE_KEY_HEX], const void *val, size_t len)
{
	int result;
	const char *keys[] = { key_hex };
	const void *vals[] = { val };

	return remote_put_many(r, 1, keys, vals, &len, &result);
}

int remote_get(struct remote *r, const char key_hex[REMOTE_KEY_HEX], uint8_t **val, size_t *len)
{
	int result;
	const char *keys[] = { key_hex };

	return remote_get_many(r, 1, keys, val, len, &result);
}

int remote_put_named(struct remote *r, const char *name, const void *val, size_t len)
{
	int64_t started = redis_now();
	int rc;
	struct op *ops = ops_new_named(r, 1, &name, STEP_SET, &rc);

	if (!ops)
		return rc;
	ops[0].val = val;
	ops[0].len = len;
	remote_call_run(r, ops, 1, started, "put");
	rc = ops[0].result;
	ops_free(ops, 1);
	return rc;
}

int remote_get_named_many(struct remote *r, size_t n, const char *const *names, uint8_t **vals,
			  size_t *lens, int *results)
{
	int64_t started = redis_now();
	int rc = 0;

	if (n == 0)
		return 0;
	struct op *ops = ops_new_named(r, n, names, STEP_GET, &rc);
	if (!ops)
		return rc;
	return gets_end(r, ops, n, started, vals, lens, results);
}

int remote_get_named(struct remote *r, const char *name, uint8_t **val, size_t *len)
{
	int result;

	return remote_get_named_many(r, 1, &name, val, len, &result);
}

/* cmd: "SADD" or "SREM" (4 bytes both). */
static int set_change(struct remote *r, const char *cmd, size_t n, const char *const *names,
		      const char *const *members, int *results)
{
	int64_t started = redis_now();
	int rc;

	if (n == 0)
		return 0;
	struct op *ops = ops_new_named(r, n, names, STEP_SADD, &rc);
	if (!ops)
		return rc;
	for (size_t i = 0; i < n; i++) {
		ops[i].set_cmd = cmd;
		ops[i].val = (const uint8_t *)members[i];
		ops[i].len = strlen(members[i]);
	}
	remote_call_run(r, ops, n, started, cmd[1] == 'A' ? "sadd" : "srem");
	return results_end(ops, n, results);
}

int remote_sadd_named(struct remote *r, size_t n, const char *const *names,
		      const char *const *members, int *results)
{
	return set_change(r, "SADD", n, names, members, results);
}

int remote_srem_named(struct remote *r, size_t n, const char *const *names,
		      const char *const *members, int *results)
{
	return set_change(r, "SREM", n, names, members, results);
}

int remote_srem_del_named(struct remote *r, const char *set, const char *member, const char *key)
{
	int64_t started = redis_now();
	const char *names[] = { set, key };
	int rc, results[2];
	struct op *ops = ops_new_named(r, 2, names, STEP_SADD, &rc);

	if (!ops)
		return rc;
	ops[0].set_cmd = "SREM";
	ops[0].val = (const uint8_t *)member;
	ops[0].len = strlen(member);
	ops[1].step = STEP_DEL;
	remote_call_run(r, ops, 2, started, "srem+del");
	return results_end(ops, 2, results);
}

void remote_members_free(char **members, size_t count)
{
	for (size_t i = 0; members && i < count; i++)
		free(members[i]);
	free(members);
}

int remote_members_named(struct remote *r, const char *name, size_t max, size_t max_len,
			 char ***members, size_t *count)
{
	int64_t started = redis_now();
	int rc;
	struct op *ops = ops_new_named(r, 1, &name, STEP_MEMBERS, &rc);

	*members = NULL;
	*count = 0;
	if (!ops)
		return rc;
	ops[0].members_max = max;
	ops[0].member_len = max_len;
	remote_call_run(r, ops, 1, started, "smembers");
	rc = ops[0].result;
	if (rc == 0) {
		*members = ops[0].members;
		*count = ops[0].nmembers;
	} else {
		remote_members_free(ops[0].members, ops[0].nmembers);
	}
	ops_free(ops, 1);
	return rc;
}

void remote_stats(struct remote *r, struct remote_stats *out)
{
	remote_metrics_snapshot(&r->metrics, out);
}

void remote_metrics_render(struct remote *r, FILE *f)
{
	if (r)
		remote_metrics_print(&r->metrics, f);
}

/* ---- open and close ---------------------------------------------------------------- */

/* The first line of the file, without its line end. */
static int password_read(const char *path, char **out)
{
	FILE *f = fopen(path, "re");
	struct stat st;
	char line[AUTH_LINE_MAX + 2];

	if (!f) {
		int e = errno;
		log_err("remote_auth=%s: %s", path, strerror(e));
		return -e;
	}
	if (fstat(fileno(f), &st) == 0 && (st.st_mode & S_IROTH))
		log_warn("remote_auth=%s is readable by every user; chmod o-r it", path);
	if (!fgets(line, sizeof(line), f))
		line[0] = '\0';
	fclose(f);
	size_t len = strlen(line);
	while (len && (line[len - 1] == '\n' || line[len - 1] == '\r'))
		line[--len] = '\0';
	if (len == 0 || len > AUTH_LINE_MAX) {
		log_err("remote_auth=%s: the first line must hold the password (1 to %d bytes)",
			path, AUTH_LINE_MAX);
		return -EINVAL;
	}
	if (!(*out = strdup(line)))
		return -ENOMEM;
	return 0;
}

static bool prefix_valid(const char *p)
{
	size_t n = strlen(p);
	if (n == 0 || n > REMOTE_PREFIX_MAX)
		return false;
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)p[i] <= ' ' || p[i] == 0x7f)
			return false;
	return true;
}

int remote_open(const struct remote_config *cfg, struct remote **out)
{
	const char *prefix = cfg->prefix && *cfg->prefix ? cfg->prefix : REMOTE_DEFAULT_PREFIX;
	struct cluster_addr *seeds;
	size_t nseeds;
	int rc;

	if (!cfg->seeds || !*cfg->seeds) {
		log_err("remote=: no seed node given (host:port[,host:port...])");
		return -EINVAL;
	}
	if (!prefix_valid(prefix)) {
		log_err("remote_prefix=%s: 1 to %d printable characters without spaces", prefix,
			REMOTE_PREFIX_MAX);
		return -EINVAL;
	}
	if (cfg->ttl_s > TTL_MAX_S) {
		log_err("remote_ttl=%llu: more than %llu seconds", (unsigned long long)cfg->ttl_s,
			(unsigned long long)TTL_MAX_S);
		return -EINVAL;
	}
	if (cfg->timeout_ms > TIMEOUT_MAX_MS) {
		log_err("remote_timeout=%llu ms: more than an hour", (unsigned long long)cfg->timeout_ms);
		return -EINVAL;
	}
	if ((rc = cluster_seeds_parse(cfg->seeds, &seeds, &nseeds)) < 0)
		return rc;
	struct remote *r = calloc(1, sizeof(*r));
	if (!r) {
		free(seeds);
		return -ENOMEM;
	}
	if (cfg->auth_file && (rc = password_read(cfg->auth_file, &r->password)) < 0) {
		free(seeds);
		free(r);
		return rc;
	}
	snprintf(r->prefix, sizeof(r->prefix), "%s", prefix);
	if (cfg->ttl_s)
		snprintf(r->ttl_ms, sizeof(r->ttl_ms), "%llu",
			 (unsigned long long)cfg->ttl_s * 1000);
	r->timeout_ms = cfg->timeout_ms ? cfg->timeout_ms : REMOTE_DEFAULT_TIMEOUT_MS;
	pthread_rwlockattr_t attr;
	pthread_rwlockattr_init(&attr);
	/* Refreshes and MOVED must not starve behind a stream of readers. */
	pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
	pthread_rwlock_init(&r->map_lock, &attr);
	pthread_rwlockattr_destroy(&attr);
	pthread_mutex_init(&r->refresh_lock, NULL);
	pthread_mutex_init(&r->log_lock, NULL);
	for (size_t i = 0; i < CLUSTER_SLOTS; i++)
		r->slots[i] = NODE_NONE;
	for (size_t i = 0; i < nseeds; i++)
		remote_node_intern(r, &seeds[i]);
	free(seeds);
	if (r->nnodes == 0) {
		remote_close(r);
		return -ENOMEM;
	}

	int64_t deadline = redis_now() + (int64_t)r->timeout_ms * 1000000;
	if (remote_map_refresh(r, 0, deadline) < 0)
		log_warn("remote: %s; every call will try again", r->map_error);
	else
		log_info("remote: Redis Cluster at %s, keys %s:<key>, ttl %llu s, timeout %llu ms",
			 cfg->seeds, r->prefix, (unsigned long long)cfg->ttl_s,
			 (unsigned long long)r->timeout_ms);
	*out = r;
	return 0;
}

void remote_close(struct remote *r)
{
	if (!r)
		return;
	for (size_t i = 0; i < r->nnodes; i++)
		remote_node_free(r->nodes[i]);
	pthread_rwlock_destroy(&r->map_lock);
	pthread_mutex_destroy(&r->refresh_lock);
	pthread_mutex_destroy(&r->log_lock);
	free(r->password);
	free(r);
}
