/* SPDX-License-Identifier: Apache-2.0 */
/* One call: its ops grouped by node into rounds of pipelines (SET NX PX,
 * GET, WAIT 1), the replies read as they come, MOVED and ASK followed,
 * retries with a back-off until the deadline, and one log line per
 * failed key. */
#include "autoconf.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lib/log.h"
#include "remote/cluster.h"
#include "remote/cluster_reply.h"
#include "remote/redis.h"
#include "remote/remote_i.h"

#define REDIRECTS_MAX  16    /* MOVED/ASK per key per call: a loop is a broken cluster */
#define BACKOFF_MIN_MS 10
#define BACKOFF_MAX_MS 200
#define MAP_MAX_AGE_S  60    /* a map older than this is learnt again before a call */
#define LOG_PER_CALL   4     /* failure lines of one call; the rest are counted */
#define LOG_PER_SECOND 10    /* failure lines of all calls */
#define TAGS_PER_OP    3     /* replies one op may expect: ASKING, its command, PEXPIRE */

/* ---- small helpers --------------------------------------------------------------- */

static void sleep_until(int64_t t)
{
	struct timespec ts = remote_abs_time(t);
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

/* ---- one call: rounds of pipelines ------------------------------------------------- */

enum tag_kind { TAG_ASKING, TAG_CMD, TAG_WAIT, TAG_EXPIRE };

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
	uint16_t idx = remote_node_intern(r, &a);
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

/* SMEMBERS's array into op->members: at most members_max, each at most
 * member_len bytes without a NUL (the rest left out: they come from
 * outside). */
static void on_members(struct op *op, const redisReply *reply)
{
	size_t n = reply->elements < op->members_max ? reply->elements : op->members_max;

	if (n && !(op->members = calloc(n, sizeof(*op->members)))) {
		snprintf(op->why, sizeof(op->why), "out of memory");
		finish(op, -ENOMEM);
		return;
	}
	for (size_t i = 0; i < reply->elements && op->nmembers < n; i++) {
		const redisReply *e = reply->element[i];
		if (!reply_is(e, REDIS_REPLY_STRING) || e->len == 0 || e->len > op->member_len ||
		    memchr(e->str, '\0', e->len))
			continue;
		char *m = strndup(e->str, e->len);
		if (!m) {
			snprintf(op->why, sizeof(op->why), "out of memory");
			finish(op, -ENOMEM);
			return;
		}
		op->members[op->nmembers++] = m;
	}
	finish(op, 0);
}

/* The replies of the set steps: SADD (then its PEXPIRE, when one was
 * sent), SMEMBERS, and DEL's count. */
static void on_set_reply(struct remote *r, struct op *op, const redisReply *reply)
{
	if (op->step == STEP_MEMBERS && reply->type == REDIS_REPLY_ARRAY) {
		on_members(op, reply);
		return;
	}
	if (op->step != STEP_MEMBERS && reply->type == REDIS_REPLY_INTEGER) {
		if (op->step == STEP_SADD && r->ttl_ms[0])
			op->step = STEP_EXPIRE;   /* the PEXPIRE's reply follows */
		else
			finish(op, 0);
		return;
	}
	snprintf(op->why, sizeof(op->why), "unexpected reply type %d", reply->type);
	finish(op, -EIO);
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
	if (tag->kind == TAG_EXPIRE && op->step != STEP_EXPIRE)
		return;   /* its SADD failed: that error is the op's */
	if (reply->type == REDIS_REPLY_ERROR) {
		on_error(r, op, reply, o);
		return;
	}
	if (op->step >= STEP_SADD && op->step <= STEP_DEL) {
		on_set_reply(r, op, reply);
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

/* SADD (or SREM), and PEXPIRE after it when values expire: both again
 * from the start when an earlier round lost the PEXPIRE's reply (both are
 * idempotent). */
static int append_sadd(struct remote *r, struct lane *l, struct op *op, uint32_t index)
{
	const char *argv[] = { op->set_cmd, op->key, (const char *)op->val };
	const size_t lens[] = { 4, op->key_len, op->len };

	op->step = STEP_SADD;
	if (redis_conn_append(l->slot->conn, 3, argv, lens) < 0)
		return -ENOMEM;
	l->tags[l->ntags++] = (struct tag){ index, TAG_CMD };
	if (!r->ttl_ms[0])
		return 0;
	const char *ex[] = { "PEXPIRE", op->key, r->ttl_ms };
	const size_t exl[] = { 7, op->key_len, strlen(r->ttl_ms) };
	if (redis_conn_append(l->slot->conn, 3, ex, exl) < 0)
		return -ENOMEM;
	l->tags[l->ntags++] = (struct tag){ index, TAG_EXPIRE };
	return 0;
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
	if (op->step == STEP_SADD || op->step == STEP_EXPIRE)
		return append_sadd(r, l, op, index);
	if (op->step == STEP_MEMBERS || op->step == STEP_DEL) {
		const char *argv[] = { op->step == STEP_DEL ? "DEL" : "SMEMBERS", op->key };
		const size_t lens[] = { op->step == STEP_DEL ? 3 : 8, op->key_len };
		rc = redis_conn_append(l->slot->conn, 2, argv, lens);
	} else if (op->step == STEP_SET) {
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
		remote_pool_drop(r, l->slot);
}

/* A round's memory, sized by the ops still pending. */
struct round {
	struct lane *lanes;      /* in node order */
	size_t nlanes;
	struct tag *tags;        /* every lane's share: 3 per op + WAIT */
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
	    !(rd->tags = calloc(TAGS_PER_OP * pending + pending, sizeof(*rd->tags))) ||
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
	/* Lanes in node order; each gets its share of tags: 3 per op + WAIT. */
	size_t nnodes = r->nnodes;
	size_t offset = 0;
	for (size_t i = 0; i < nnodes; i++) {
		if (!rd->lane_of[i])
			continue;
		struct lane *l = &rd->lanes[rd->nlanes];
		l->node = r->nodes[i];
		l->replicas = atomic_load(&l->node->replicas);
		l->tags = rd->tags + offset;
		offset += TAGS_PER_OP * rd->lane_of[i] + 1;
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
	if (!(l->slot = remote_pool_acquire(l->node, deadline))) {
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
	int c = remote_conn_open(r, l->node, deadline, &l->slot->conn, err, sizeof(err));
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
			remote_pool_drop(r, l->slot);
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
			remote_count_bytes(r, l->slot->conn);
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
void remote_call_run(struct remote *r, struct op *ops, size_t n, int64_t started,
		     const char *what)
{
	int64_t deadline = started + (int64_t)r->timeout_ms * 1000000;
	int backoff = BACKOFF_MIN_MS;

	int64_t learnt = atomic_load(&r->map_time);
	if (learnt == 0 || atomic_load(&r->map_stale) ||
	    started - learnt > (int64_t)MAP_MAX_AGE_S * 1000000000)
		remote_map_refresh(r, atomic_load(&r->map_gen), deadline);
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
			remote_map_refresh(r, gen, deadline);
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
			remote_log(r, "%s %.300s: %s%s%s", what, op->key, op->why,
				   map_error[0] ? "; " : "", map_error);
		} else {
			remote_log(r, "%s %.300s on %s: %s%s", what, op->key,
				   r->nodes[op->node]->name, op->why,
				   op->result == -ENOSPC ? " (cluster out of memory)" : "");
		}
	}
	if (failed > LOG_PER_CALL)
		remote_log(r, "... and %zu more keys of the same call failed", failed - LOG_PER_CALL);
	remote_metrics_observe(&r->metrics, (uint64_t)(redis_now() - started) / 1000);
}
