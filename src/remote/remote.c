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
 *   most 10 lines a second in all, each with the key and the node. */
#include "autoconf.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "lib/log.h"
#include "remote/cluster.h"
#include "remote/cluster_reply.h"
#include "remote/redis.h"
#include "remote/remote.h"
#include "remote/stats.h"

#define POOL_SIZE      4     /* connections per node: parallel calls to one node */
#define NODES_MAX      1024  /* addresses ever seen: seeds, masters, redirections */
#define NODE_NONE      0xffff
#define REDIRECTS_MAX  16    /* MOVED/ASK per key per call: a loop is a broken cluster */
#define BACKOFF_MIN_MS 10
#define BACKOFF_MAX_MS 200
#define MAP_MAX_AGE_S  60    /* a map older than this is learnt again before a call */
#define LOG_PER_CALL   4     /* failure lines of one call; the rest are counted */
#define LOG_PER_SECOND 10    /* failure lines of all calls */
#define AUTH_LINE_MAX  4096
#define TTL_MAX_S      (100ull * 365 * 86400)   /* PX must stay far below 2^63 ms */
#define TIMEOUT_MAX_MS 3600000ull

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

/* ---- small helpers --------------------------------------------------------------- */

static struct timespec abs_time(int64_t deadline)
{
	return (struct timespec){ .tv_sec = deadline / 1000000000, .tv_nsec = deadline % 1000000000 };
}

/* pthread_mutex_timedlock until a monotonic deadline. Its clock is the
 * wall clock (pthread_mutex_clocklock would take the monotonic one, but
 * sanitizers do not know it): a clock step can only move the give-up time,
 * and every holder lets go by its own deadline anyway. */
static int lock_until(pthread_mutex_t *m, int64_t deadline)
{
	struct timespec now;
	clock_gettime(CLOCK_REALTIME, &now);
	int64_t left = deadline - redis_now();
	int64_t wall = (int64_t)now.tv_sec * 1000000000 + now.tv_nsec + (left > 0 ? left : 0);
	struct timespec ts = abs_time(wall);
	return pthread_mutex_timedlock(m, &ts);
}

static void sleep_until(int64_t t)
{
	struct timespec ts = abs_time(t);
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

/* Failure lines are limited per second over all threads: an outage seen by
 * a thousand calls is worth a few lines and a count, not a flood. */
__attribute__((format(printf, 2, 3)))
static void remote_log(struct remote *r, const char *fmt, ...)
{
	int64_t second = redis_now() / 1000000000;
	unsigned suppressed = 0;
	char line[512];
	va_list ap;

	pthread_mutex_lock(&r->log_lock);
	if (second != r->log_second) {
		suppressed = r->log_suppressed;
		r->log_second = second;
		r->log_lines = r->log_suppressed = 0;
	}
	bool emit = r->log_lines < LOG_PER_SECOND;
	if (emit)
		r->log_lines++;
	else
		r->log_suppressed++;
	pthread_mutex_unlock(&r->log_lock);
	if (suppressed)
		log_warn("remote: %u similar lines suppressed in the last second", suppressed);
	if (!emit)
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	log_warn("remote: %s", line);
}

/* ---- nodes and connections -------------------------------------------------------- */

/* Under map_lock held for writing. Returns the index or NODE_NONE when the
 * table is full. */
static uint16_t node_intern_locked(struct remote *r, const struct cluster_addr *a)
{
	for (size_t i = 0; i < r->nnodes; i++)
		if (r->nodes[i]->addr.port == a->port && strcmp(r->nodes[i]->addr.host, a->host) == 0)
			return (uint16_t)i;
	if (r->nnodes == NODES_MAX)
		return NODE_NONE;
	struct node *n = calloc(1, sizeof(*n));
	if (!n)
		return NODE_NONE;
	n->addr = *a;
	snprintf(n->name, sizeof(n->name), strchr(a->host, ':') ? "[%s]:%d" : "%s:%d", a->host,
		 a->port);
	for (int i = 0; i < POOL_SIZE; i++)
		pthread_mutex_init(&n->pool[i].lock, NULL);
	r->nodes[r->nnodes] = n;
	return (uint16_t)r->nnodes++;
}

static uint16_t node_intern(struct remote *r, const struct cluster_addr *a)
{
	pthread_rwlock_wrlock(&r->map_lock);
	uint16_t i = node_intern_locked(r, a);
	pthread_rwlock_unlock(&r->map_lock);
	return i;
}

static void node_free(struct node *n)
{
	for (int i = 0; i < POOL_SIZE; i++) {
		redis_conn_close(n->pool[i].conn);
		pthread_mutex_destroy(&n->pool[i].lock);
	}
	free(n);
}

/* A free connection slot of the node, or the wait for one until deadline. */
static struct pooled *pool_acquire(struct node *n, int64_t deadline)
{
	unsigned start = atomic_fetch_add(&n->next, 1);

	for (unsigned k = 0; k < POOL_SIZE; k++) {
		struct pooled *p = &n->pool[(start + k) % POOL_SIZE];
		if (pthread_mutex_trylock(&p->lock) == 0)
			return p;
	}
	struct pooled *p = &n->pool[start % POOL_SIZE];
	return lock_until(&p->lock, deadline) == 0 ? p : NULL;
}

static void count_bytes(struct remote *r, struct redis_conn *c)
{
	uint64_t sent, received;

	redis_conn_take_bytes(c, &sent, &received);
	counter_add(&r->metrics.bytes_out, sent);
	counter_add(&r->metrics.bytes_in, received);
}

static void pool_drop(struct remote *r, struct pooled *p)
{
	if (p->conn) {
		count_bytes(r, p->conn);
		redis_conn_close(p->conn);
		p->conn = NULL;
	}
}

/* A quarter of the timeout (at least 100 ms) for one connect, so that a
 * node that swallows packets leaves time for the others. */
static int64_t connect_deadline(const struct remote *r, int64_t deadline)
{
	int64_t share = (int64_t)r->timeout_ms * 1000000 / 4;
	if (share < 100000000)
		share = 100000000;
	int64_t until = redis_now() + share;
	return until < deadline ? until : deadline;
}

static int conn_open(struct remote *r, const struct node *n, int64_t deadline,
		     struct redis_conn **out, char *err, size_t errlen)
{
	counter_inc(&r->metrics.connects);
	return redis_conn_open(n->addr.host, n->addr.port, r->password,
			       connect_deadline(r, deadline), out, err, errlen);
}

/* ---- the slot map -------------------------------------------------------------------- */

/* Asks one node for the map and installs it. */
static int refresh_from(struct remote *r, const struct cluster_addr *addr, const char *name,
			int64_t deadline, char *err, size_t errlen)
{
	struct redis_conn *c;
	redisReply *slots = NULL, *nodes = NULL;
	struct cluster_shard *s = NULL;
	size_t n = 0;

	counter_inc(&r->metrics.connects);
	int rc = redis_conn_open(addr->host, addr->port, r->password, deadline, &c, err, errlen);
	if (rc < 0)
		return rc;
	const char *slots_argv[] = { "CLUSTER", "SLOTS" }, *nodes_argv[] = { "CLUSTER", "NODES" };
	const size_t slots_lens[] = { 7, 5 }, nodes_lens[] = { 7, 5 };
	rc = redis_conn_call(c, deadline, 2, slots_argv, slots_lens, &slots);
	if (rc < 0) {
		snprintf(err, errlen, "CLUSTER SLOTS: %s", redis_conn_error(c));
		goto out;
	}
	if (slots->type == REDIS_REPLY_ERROR) {
		snprintf(err, errlen, "CLUSTER SLOTS: %s", slots->str);
		rc = -EPROTO;
		goto out;
	}
	if ((rc = cluster_slots_parse(slots, addr, &s, &n)) < 0) {
		snprintf(err, errlen, "CLUSTER SLOTS: %s",
			 rc == -ENOMEM ? "out of memory" : "malformed reply");
		goto out;
	}
	if (n == 0) {
		snprintf(err, errlen, "CLUSTER SLOTS: no slot is served");
		rc = -EPROTO;
		goto out;
	}
	/* Without the node list the replica counts of CLUSTER SLOTS stand. */
	if (redis_conn_call(c, deadline, 2, nodes_argv, nodes_lens, &nodes) == 0)
		cluster_nodes_count_replicas(nodes, s, n);

	uint16_t map[CLUSTER_SLOTS];
	for (size_t i = 0; i < CLUSTER_SLOTS; i++)
		map[i] = NODE_NONE;
	pthread_rwlock_wrlock(&r->map_lock);
	bool owns[NODES_MAX] = { false };
	for (size_t i = 0; i < n; i++) {
		uint16_t idx = node_intern_locked(r, &s[i].master);
		if (idx == NODE_NONE)
			continue;
		atomic_store(&r->nodes[idx]->replicas, s[i].replicas);
		owns[idx] = true;
		for (unsigned slot = s[i].start; slot <= s[i].end; slot++)
			map[slot] = idx;
	}
	for (size_t i = 0; i < r->nnodes; i++)
		if (!owns[i])
			atomic_store(&r->nodes[i]->replicas, 0);
	memcpy(r->slots, map, sizeof(map));
	atomic_fetch_add(&r->map_gen, 1);
	atomic_store(&r->map_time, redis_now());
	atomic_store(&r->map_stale, false);
	pthread_rwlock_unlock(&r->map_lock);
	counter_inc(&r->metrics.refreshes);
	log_debug("remote: slot map learnt from %s: %zu slot ranges", name, n);
	rc = 0;
out:
	if (slots)
		freeReplyObject(slots);
	if (nodes)
		freeReplyObject(nodes);
	free(s);
	count_bytes(r, c);
	redis_conn_close(c);
	return rc;
}

/* Learns the slot map from any known node, unless another thread installed
 * one since seen_gen. */
static int map_refresh(struct remote *r, uint64_t seen_gen, int64_t deadline)
{
	if (lock_until(&r->refresh_lock, deadline) != 0)
		return -ETIMEDOUT;
	if (atomic_load(&r->map_gen) != seen_gen) {
		pthread_mutex_unlock(&r->refresh_lock);
		return 0;
	}
	pthread_rwlock_rdlock(&r->map_lock);
	size_t count = r->nnodes;
	pthread_rwlock_unlock(&r->map_lock);

	unsigned start = atomic_fetch_add(&r->refresh_next, 1);
	char err[200] = "no node known", last[CLUSTER_HOST_MAX + 8] = "";
	int rc = -EIO;
	for (size_t k = 0; k < count && redis_now() < deadline; k++) {
		const struct node *n = r->nodes[(start + k) % count];
		if (refresh_from(r, &n->addr, n->name, connect_deadline(r, deadline), err,
				 sizeof(err)) == 0) {
			rc = 0;
			break;
		}
		snprintf(last, sizeof(last), "%s", n->name);
	}
	pthread_mutex_unlock(&r->refresh_lock);
	if (rc < 0) {
		/* Said by the calls that fail for it, not once per attempt. */
		pthread_mutex_lock(&r->log_lock);
		snprintf(r->map_error, sizeof(r->map_error), "none of %zu known nodes gave the slot "
			 "map (last: %s: %s)", count, last, err);
		pthread_mutex_unlock(&r->log_lock);
	}
	return rc;
}

/* ---- one call: rounds of pipelines ------------------------------------------------- */

enum step {
	STEP_SET,      /* put: SET NX PX */
	STEP_COMPARE,  /* put refused by NX: GET to compare */
	STEP_WAIT,     /* put written: waiting for the WAIT in the same pipeline */
	STEP_GET,      /* get */
	STEP_DONE,
};

struct op {
	const uint8_t *val;   /* put */
	size_t len;
	uint8_t *got;         /* get, or compare: the value found */
	size_t got_len;
	char key[REMOTE_PREFIX_MAX + 2 + REMOTE_KEY_HEX];
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

enum tag_kind { TAG_ASKING, TAG_CMD, TAG_WAIT };

struct tag {
	uint32_t op;
	uint8_t kind;
};

/* One node's pipeline in a round. */
struct lane {
	struct node *node;
	struct pooled *slot;   /* held for the round */
	struct tag *tags;      /* replies expected, in order */
	size_t ntags, got;
	int replicas;
	bool failed;
};

struct outcome {
	bool refresh;     /* learn the slot map before the next round */
	bool backoff;     /* wait a little before the next round */
	bool progress;    /* some reply arrived */
};

static void finish(struct op *op, int result)
{
	op->step = STEP_DONE;
	op->result = result;
}


static void on_redirect(struct remote *r, struct op *op, const char *e, bool moved,
			struct outcome *o)
{
	unsigned slot;
	struct cluster_addr a;

	if (cluster_redirect_parse(e, &slot, &a) < 0) {
		snprintf(op->why, sizeof(op->why), "malformed redirection: %.100s", e);
		finish(op, -EIO);
		return;
	}
	if (++op->redirects > REDIRECTS_MAX) {
		snprintf(op->why, sizeof(op->why), "more than %d redirections (last: %.100s)",
			 REDIRECTS_MAX, e);
		finish(op, -EIO);
		return;
	}
	uint16_t idx = node_intern(r, &a);
	if (idx == NODE_NONE) {
		snprintf(op->why, sizeof(op->why), "too many nodes to follow %.100s", e);
		finish(op, -EIO);
		return;
	}
	if (moved) {
		/* This slot now; the rest of a resharding with the next refresh. */
		pthread_rwlock_wrlock(&r->map_lock);
		r->slots[slot] = idx;
		pthread_rwlock_unlock(&r->map_lock);
		counter_inc(&r->metrics.moved);
		o->refresh = true;
	} else {
		op->ask = idx;
		counter_inc(&r->metrics.asked);
	}
}

static void on_error(struct remote *r, struct op *op, const redisReply *reply, struct outcome *o)
{
	const char *e = reply->str;
	enum cluster_error kind = cluster_error_kind(e);

	if (kind == CLUSTER_ERROR_MOVED || kind == CLUSTER_ERROR_ASK) {
		on_redirect(r, op, e, kind == CLUSTER_ERROR_MOVED, o);
		return;
	}
	snprintf(op->why, sizeof(op->why), "%.150s", e);
	switch (kind) {
	case CLUSTER_ERROR_OOM:
		finish(op, -ENOSPC);
		break;
	case CLUSTER_ERROR_RETRY:
		o->backoff = true;
		break;
	case CLUSTER_ERROR_FAILOVER: /* ask again where the slot lives */
		o->backoff = o->refresh = true;
		break;
	default:
		finish(op, -EIO); /* NOAUTH, WRONGPASS, WRONGTYPE, ...: retrying won't help */
	}
}

static bool reply_is(const redisReply *r, int type)
{
	return r && r->type == type;
}

static void on_wait(struct remote *r, struct op *ops, struct lane *l, const redisReply *reply,
		    struct outcome *o)
{
	bool acked = reply_is(reply, REDIS_REPLY_INTEGER) && reply->integer >= 1;

	for (size_t t = 0; t < l->ntags; t++) {
		struct op *op = &ops[l->tags[t].op];
		if (l->tags[t].kind != TAG_CMD || op->step != STEP_WAIT)
			continue;
		if (acked) {
			finish(op, 0);
		} else {
			snprintf(op->why, sizeof(op->why), "written, but no replica acknowledged "
				 "it within the timeout (WAIT%s%.100s)",
				 reply_is(reply, REDIS_REPLY_ERROR) ? ": " : "",
				 reply_is(reply, REDIS_REPLY_ERROR) ? reply->str : "");
			finish(op, -EIO);
		}
	}
	if (!acked)
		o->refresh = true;   /* the replica may be gone: learn the count again */
}

static void on_reply(struct remote *r, struct op *ops, struct lane *l, const struct tag *tag,
		     redisReply *reply, struct outcome *o)
{
	struct op *op = &ops[tag->op];

	o->progress = true;
	if (tag->kind == TAG_ASKING)
		return;   /* +OK; an error shows in the command that follows */
	if (tag->kind == TAG_WAIT) {
		on_wait(r, ops, l, reply, o);
		return;
	}
	if (reply->type == REDIS_REPLY_ERROR) {
		on_error(r, op, reply, o);
		return;
	}
	switch (op->step) {
	case STEP_GET:
	case STEP_COMPARE:
		if (reply->type == REDIS_REPLY_NIL) {
			if (op->step == STEP_GET) {
				counter_inc(&r->metrics.misses);
				finish(op, -ENOENT);
			} else {
				op->step = STEP_SET;   /* expired or deleted since the SET */
			}
			return;
		}
		if (reply->type != REDIS_REPLY_STRING)
			break;
		if (op->step == STEP_GET) {
			/* hiredis 0.14 allocates strings with malloc and frees with
			 * free(): the value is taken, not copied. */
			op->got = (uint8_t *)reply->str;
			op->got_len = reply->len;
			reply->str = NULL;
			counter_inc(&r->metrics.hits);
			finish(op, 0);
		} else {
			bool same = reply->len == op->len &&
				    (op->len == 0 || memcmp(reply->str, op->val, op->len) == 0);
			finish(op, same ? 0 : -EEXIST);
		}
		return;
	case STEP_SET:
		if (reply->type == REDIS_REPLY_NIL) {
			op->step = STEP_COMPARE;
			return;
		}
		if (reply->type != REDIS_REPLY_STATUS)
			break;
		counter_inc(&r->metrics.puts);
		if (l->replicas > 0)
			op->step = STEP_WAIT;
		else
			finish(op, 0);
		return;
	default:
		break;
	}
	snprintf(op->why, sizeof(op->why), "unexpected reply type %d", reply->type);
	finish(op, -EIO);
}

static int append_op(struct remote *r, struct lane *l, struct op *op, uint32_t index)
{
	if (op->asking) {
		const char *argv[] = { "ASKING" };
		const size_t lens[] = { 6 };
		if (redis_conn_append(l->slot->conn, 1, argv, lens) < 0)
			return -ENOMEM;
		l->tags[l->ntags++] = (struct tag){ index, TAG_ASKING };
	}
	int rc;
	if (op->step == STEP_SET) {
		const char *argv[] = { "SET", op->key, (const char *)op->val, "NX", "PX", r->ttl_ms };
		const size_t lens[] = { 3, op->key_len, op->len, 2, 2, strlen(r->ttl_ms) };
		rc = redis_conn_append(l->slot->conn, r->ttl_ms[0] ? 6 : 4, argv, lens);
	} else {
		const char *argv[] = { "GET", op->key };
		const size_t lens[] = { 3, op->key_len };
		rc = redis_conn_append(l->slot->conn, 2, argv, lens);
	}
	if (rc < 0)
		return rc;
	l->tags[l->ntags++] = (struct tag){ index, TAG_CMD };
	return 0;
}

static void lane_fail(struct remote *r, struct op *ops, struct lane *l, const char *why,
		      struct outcome *o)
{
	l->failed = true;
	o->refresh = o->backoff = true;
	for (size_t t = l->got; t < l->ntags; t++)
		if (l->tags[t].kind == TAG_CMD)
			snprintf(ops[l->tags[t].op].why, sizeof(ops[0].why), "%s", why);
	if (l->slot)
		pool_drop(r, l->slot);
}

/* A round's memory, sized by the ops still pending. */
struct round {
	struct lane *lanes;      /* in node order */
	size_t nlanes;
	struct tag *tags;        /* every lane's share: 2 per op + WAIT */
	struct pollfd *pfds;     /* the lanes poll() watches */
	struct lane **polled;
	uint32_t *lane_of;       /* node -> a count of its ops, then its lane + 1 */
};

static int round_alloc(struct round *rd, const struct op *ops, size_t n)
{
	size_t pending = 0;

	for (size_t i = 0; i < n; i++)
		pending += ops[i].step != STEP_DONE;
	if (!(rd->lane_of = calloc(NODES_MAX, sizeof(*rd->lane_of))) ||
	    !(rd->lanes = calloc(pending, sizeof(*rd->lanes))) ||
	    !(rd->tags = calloc(2 * pending + pending, sizeof(*rd->tags))) ||
	    !(rd->pfds = calloc(pending, sizeof(*rd->pfds))) ||
	    !(rd->polled = calloc(pending, sizeof(*rd->polled))))
		return -ENOMEM;
	return 0;
}

static void round_free(struct round *rd)
{
	free(rd->lane_of);
	free(rd->lanes);
	free(rd->tags);
	free(rd->pfds);
	free(rd->polled);
}

/* Each pending op's node (an ASK's, for this attempt only, else its
 * slot's), counted per node. The map's read lock is held. */
static void round_route_locked(struct remote *r, struct round *rd, struct op *ops, size_t n,
			       struct outcome *o)
{
	for (size_t i = 0; i < n; i++) {
		struct op *op = &ops[i];
		op->lane = UINT32_MAX;
		if (op->step == STEP_DONE)
			continue;
		uint16_t node = op->ask != NODE_NONE ? op->ask : r->slots[op->slot];
		op->asking = op->ask != NODE_NONE;
		op->ask = NODE_NONE;
		op->node = node;
		if (node == NODE_NONE) {
			snprintf(op->why, sizeof(op->why), "no node known for slot %u", op->slot);
			o->refresh = o->backoff = true;
			continue;
		}
		rd->lane_of[node]++;   /* a count for now */
	}
}

/* Groups what is pending by node (map read once), one lane per node in
 * node order. */
static void round_route(struct remote *r, struct round *rd, struct op *ops, size_t n,
			struct outcome *o)
{
	pthread_rwlock_rdlock(&r->map_lock);
	round_route_locked(r, rd, ops, n, o);
	/* Lanes in node order; each gets its share of tags: 2 per op + WAIT. */
	size_t nnodes = r->nnodes;
	size_t offset = 0;
	for (size_t i = 0; i < nnodes; i++) {
		if (!rd->lane_of[i])
			continue;
		struct lane *l = &rd->lanes[rd->nlanes];
		l->node = r->nodes[i];
		l->replicas = atomic_load(&l->node->replicas);
		l->tags = rd->tags + offset;
		offset += 2 * rd->lane_of[i] + 1;
		rd->lane_of[i] = (uint32_t)++rd->nlanes;
	}
	pthread_rwlock_unlock(&r->map_lock);

	for (size_t i = 0; i < n; i++)
		if (ops[i].step != STEP_DONE && ops[i].node != NODE_NONE)
			ops[i].lane = rd->lane_of[ops[i].node] - 1;
}

/* The lane's connection, held for the round (opened on first use); a
 * lane without one fails, and its ops say why. */
static void lane_connect(struct remote *r, struct lane *l, size_t li, struct op *ops, size_t n,
			 int64_t deadline, struct outcome *o)
{
	if (!(l->slot = pool_acquire(l->node, deadline))) {
		l->failed = true;
		for (size_t i = 0; i < n; i++)
			if (ops[i].lane == li)
				snprintf(ops[i].why, sizeof(ops[i].why),
					 "every connection to it busy until the deadline");
		return;
	}
	if (l->slot->conn)
		return;
	char err[200];
	int c = conn_open(r, l->node, deadline, &l->slot->conn, err, sizeof(err));
	if (c < 0) {
		for (size_t i = 0; i < n; i++)
			if (ops[i].lane == li) {
				snprintf(ops[i].why, sizeof(ops[i].why), "%s", err);
				if (c == -EACCES)   /* a wrong password stays wrong */
					finish(&ops[i], -EIO);
			}
		l->failed = true;
		o->refresh = o->backoff = true;
	}
}

/* Takes one connection per node in node order, so that two calls never
 * wait on each other in a circle. */
static void round_connect(struct remote *r, struct round *rd, struct op *ops, size_t n,
			  int64_t deadline, struct outcome *o)
{
	for (size_t li = 0; li < rd->nlanes; li++)
		lane_connect(r, &rd->lanes[li], li, ops, n, deadline, o);
}

/* WAIT 1 after the lane's SETs; it answers within the time left, with
 * room for the reply. */
static void lane_append_wait(struct lane *l, int64_t deadline)
{
	int ms = redis_poll_ms(deadline);
	char wait_ms[16];
	snprintf(wait_ms, sizeof(wait_ms), "%d", ms > 4 ? ms * 3 / 4 : 1);
	const char *argv[] = { "WAIT", "1", wait_ms };
	const size_t lens[] = { 4, 1, strlen(wait_ms) };
	if (redis_conn_append(l->slot->conn, 3, argv, lens) == 0)
		l->tags[l->ntags++] = (struct tag){ 0, TAG_WAIT };
	else
		l->replicas = 0;   /* then the SETs answer alone */
}

/* Every pending op into its lane's pipeline, and a WAIT where SETs go to a
 * shard with a replica. */
static void round_fill(struct remote *r, struct round *rd, struct op *ops, size_t n,
		       int64_t deadline)
{
	bool sets[NODES_MAX] = { false };
	for (size_t i = 0; i < n; i++) {
		struct op *op = &ops[i];
		if (op->lane == UINT32_MAX || op->step == STEP_DONE || rd->lanes[op->lane].failed)
			continue;
		struct lane *l = &rd->lanes[op->lane];
		snprintf(op->why, sizeof(op->why), "no reply within %llu ms",
			 (unsigned long long)r->timeout_ms);
		if (append_op(r, l, op, (uint32_t)i) < 0) {
			snprintf(op->why, sizeof(op->why), "out of memory");
			finish(op, -ENOMEM);
			continue;
		}
		sets[op->lane] |= op->step == STEP_SET;
	}
	for (size_t li = 0; li < rd->nlanes; li++) {
		struct lane *l = &rd->lanes[li];
		if (l->failed || l->ntags == 0)
			continue;
		if (sets[li] && l->replicas > 0)
			lane_append_wait(l, deadline);
		counter_inc(&r->metrics.rounds);
	}
}

/* What poll() found on a lane: its pipeline sent on, the replies that
 * arrived read; a broken connection fails the lane. */
static void lane_exchange(struct remote *r, struct op *ops, struct lane *l, short rev,
			  struct outcome *o)
{
	struct redis_conn *c = l->slot->conn;
	int err = 0;
	if (rev & POLLOUT)
		err = redis_conn_send(c);
	if (!err && (rev & (POLLIN | POLLERR | POLLHUP)))
		err = redis_conn_receive(c);
	redisReply *reply = NULL;
	while (!err && l->got < l->ntags && (err = redis_conn_reply(c, &reply)) == 0 && reply) {
		on_reply(r, ops, l, &l->tags[l->got++], reply, o);
		freeReplyObject(reply);
	}
	if (err) {
		char why[200];
		snprintf(why, sizeof(why), "%s", redis_conn_error(c));
		lane_fail(r, ops, l, why, o);
	}
}

/* Sends every pipeline and reads the replies of all of them as they come,
 * until all arrived or the deadline. */
static void round_exchange(struct remote *r, struct round *rd, struct op *ops, int64_t deadline,
			   struct outcome *o)
{
	for (;;) {
		size_t active = 0;
		for (size_t li = 0; li < rd->nlanes; li++) {
			struct lane *l = &rd->lanes[li];
			if (l->failed || l->got == l->ntags)
				continue;
			int fd = redis_conn_fd(l->slot->conn);
			short ev = POLLIN | (redis_conn_has_output(l->slot->conn) ? POLLOUT : 0);
			rd->pfds[active] = (struct pollfd){ .fd = fd, .events = ev };
			rd->polled[active++] = l;
		}
		int ms = redis_poll_ms(deadline);
		if (active == 0 || ms == 0)
			break;
		int ready = poll(rd->pfds, active, ms);
		if (ready < 0 && errno != EINTR)
			break;
		for (size_t k = 0; ready > 0 && k < active; k++)
			lane_exchange(r, ops, rd->polled[k], rd->pfds[k].revents, o);
	}
}

/* The round's connections go back to their pools; one still owed replies
 * is dropped, and a WAIT that never answered fails its SETs. */
static void round_release(struct remote *r, struct round *rd, struct op *ops, struct outcome *o)
{
	for (size_t li = 0; li < rd->nlanes; li++) {
		struct lane *l = &rd->lanes[li];
		if (!l->slot)
			continue;
		/* Replies still owed would answer the next user: drop the connection. */
		if (!l->failed && l->got < l->ntags) {
			o->refresh = true;
			pool_drop(r, l->slot);
		}
		for (size_t t = 0; t < l->ntags; t++) {
			struct op *op = &ops[l->tags[t].op];
			if (l->tags[t].kind == TAG_CMD && op->step == STEP_WAIT) {
				snprintf(op->why, sizeof(op->why),
					 "written, but WAIT for a replica got no answer");
				finish(op, -EIO);
			}
		}
		if (l->slot->conn)
			count_bytes(r, l->slot->conn);
		pthread_mutex_unlock(&l->slot->lock);
	}
}

/* One round: what is pending grouped by node, one connection per node,
 * every pipeline sent and its replies read, the connections given back. */
static int round_run(struct remote *r, struct op *ops, size_t n, int64_t deadline,
		     struct outcome *o)
{
	struct round rd = { 0 };
	int rc = round_alloc(&rd, ops, n);

	if (rc == 0) {
		round_route(r, &rd, ops, n, o);
		round_connect(r, &rd, ops, n, deadline, o);
		round_fill(r, &rd, ops, n, deadline);
		round_exchange(r, &rd, ops, deadline, o);
		round_release(r, &rd, ops, o);
	}
	round_free(&rd);
	return rc;
}

static bool any_pending(const struct op *ops, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (ops[i].step != STEP_DONE)
			return true;
	return false;
}

/* Rounds until every op is done or the deadline; then the accounting and
 * one log line per failure (a few per call, the rest counted). */
static void call_run(struct remote *r, struct op *ops, size_t n, int64_t started, bool put)
{
	int64_t deadline = started + (int64_t)r->timeout_ms * 1000000;
	int backoff = BACKOFF_MIN_MS;

	int64_t learnt = atomic_load(&r->map_time);
	if (learnt == 0 || atomic_load(&r->map_stale) ||
	    started - learnt > (int64_t)MAP_MAX_AGE_S * 1000000000)
		map_refresh(r, atomic_load(&r->map_gen), deadline);
	while (any_pending(ops, n) && redis_now() < deadline) {
		uint64_t gen = atomic_load(&r->map_gen);
		struct outcome o = { false, false, false };
		if (round_run(r, ops, n, deadline, &o) < 0) {
			for (size_t i = 0; i < n; i++)
				if (ops[i].step != STEP_DONE) {
					snprintf(ops[i].why, sizeof(ops[i].why), "out of memory");
					finish(&ops[i], -ENOMEM);
				}
			break;
		}
		if (!any_pending(ops, n)) {
			/* Learnt something (a WAIT nobody acknowledged, a MOVED) too
			 * late to refresh for this call: the next one will. */
			if (o.refresh)
				atomic_store(&r->map_stale, true);
			break;
		}
		if (o.refresh)
			map_refresh(r, gen, deadline);
		if (o.backoff || !o.progress) {
			int64_t until = redis_now() + (int64_t)backoff * 1000000;
			sleep_until(until < deadline ? until : deadline);
			backoff = backoff * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : backoff * 2;
		}
	}

	size_t failed = 0;
	for (size_t i = 0; i < n; i++) {
		struct op *op = &ops[i];
		if (op->step != STEP_DONE)
			finish(op, -EIO);
		if (op->result == 0 || op->result == -ENOENT || op->result == -EEXIST)
			continue;
		counter_inc(&r->metrics.errors);
		if (failed++ >= LOG_PER_CALL)
			continue;
		if (op->node == NODE_NONE) {
			char map_error[sizeof(r->map_error)];
			pthread_mutex_lock(&r->log_lock);
			memcpy(map_error, r->map_error, sizeof(map_error));
			pthread_mutex_unlock(&r->log_lock);
			remote_log(r, "%s %s: %s%s%s", put ? "put" : "get", op->key, op->why,
				   map_error[0] ? "; " : "", map_error);
		} else {
			remote_log(r, "%s %s on %s: %s%s", put ? "put" : "get", op->key,
				   r->nodes[op->node]->name, op->why,
				   op->result == -ENOSPC ? " (cluster out of memory)" : "");
		}
	}
	if (failed > LOG_PER_CALL)
		remote_log(r, "... and %zu more keys of the same call failed", failed - LOG_PER_CALL);
	remote_metrics_observe(&r->metrics, (uint64_t)(redis_now() - started) / 1000);
}

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
		op->key_len = (size_t)snprintf(op->key, sizeof(op->key), "%s:%.64s", r->prefix,
					       keys_hex[i]);
		op->slot = cluster_key_slot(op->key, op->key_len);
		op->step = put ? STEP_SET : STEP_GET;
		op->ask = NODE_NONE;
		op->node = NODE_NONE;
	}
	return ops;
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
	call_run(r, ops, n, started, true);
	for (size_t i = 0; i < n; i++) {
		results[i] = ops[i].result;
		if (rc == 0)
			rc = ops[i].result;
	}
	free(ops);
	return rc;
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
	call_run(r, ops, n, started, false);
	for (size_t i = 0; i < n; i++) {
		results[i] = ops[i].result;
		vals[i] = ops[i].result == 0 ? ops[i].got : NULL;
		lens[i] = ops[i].result == 0 ? ops[i].got_len : 0;
		if (ops[i].result != 0)
			free(ops[i].got);
		if (rc == 0)
			rc = ops[i].result;
	}
	free(ops);
	return rc;
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
		node_intern(r, &seeds[i]);
	free(seeds);
	if (r->nnodes == 0) {
		remote_close(r);
		return -ENOMEM;
	}

	int64_t deadline = redis_now() + (int64_t)r->timeout_ms * 1000000;
	if (map_refresh(r, 0, deadline) < 0)
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
		node_free(r->nodes[i]);
	pthread_rwlock_destroy(&r->map_lock);
	pthread_mutex_destroy(&r->refresh_lock);
	pthread_mutex_destroy(&r->log_lock);
	free(r->password);
	free(r);
}
