/* SPDX-License-Identifier: Apache-2.0 */
/* The client's nodes (every address ever seen), their pools of
 * connections, and the slot map learnt from CLUSTER SLOTS and CLUSTER
 * NODES; with the waits until a deadline that their locks take. */
#include "autoconf.h"

#include <errno.h>
#include <pthread.h>
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

/* ---- waiting until a deadline ------------------------------------------------------- */

struct timespec remote_abs_time(int64_t deadline)
{
	return (struct timespec){ .tv_sec = deadline / 1000000000, .tv_nsec = deadline % 1000000000 };
}

/* pthread_mutex_timedlock until a monotonic deadline. Its clock is the
 * wall clock (pthread_mutex_clocklock would take the monotonic one, but
 * sanitizers do not know it): a clock step can only move the give-up time,
 * and every holder lets go by its own deadline anyway. */
int remote_lock_until(pthread_mutex_t *m, int64_t deadline)
{
	struct timespec now;
	clock_gettime(CLOCK_REALTIME, &now);
	int64_t left = deadline - redis_now();
	int64_t wall = (int64_t)now.tv_sec * 1000000000 + now.tv_nsec + (left > 0 ? left : 0);
	struct timespec ts = remote_abs_time(wall);
	return pthread_mutex_timedlock(m, &ts);
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

uint16_t remote_node_intern(struct remote *r, const struct cluster_addr *a)
{
	pthread_rwlock_wrlock(&r->map_lock);
	uint16_t i = node_intern_locked(r, a);
	pthread_rwlock_unlock(&r->map_lock);
	return i;
}

void remote_node_free(struct node *n)
{
	for (int i = 0; i < POOL_SIZE; i++) {
		redis_conn_close(n->pool[i].conn);
		pthread_mutex_destroy(&n->pool[i].lock);
	}
	free(n);
}

/* A free connection slot of the node, or the wait for one until deadline. */
struct pooled *remote_pool_acquire(struct node *n, int64_t deadline)
{
	unsigned start = atomic_fetch_add(&n->next, 1);

	for (unsigned k = 0; k < POOL_SIZE; k++) {
		struct pooled *p = &n->pool[(start + k) % POOL_SIZE];
		if (pthread_mutex_trylock(&p->lock) == 0)
			return p;
	}
	struct pooled *p = &n->pool[start % POOL_SIZE];
	return remote_lock_until(&p->lock, deadline) == 0 ? p : NULL;
}

void remote_count_bytes(struct remote *r, struct redis_conn *c)
{
	uint64_t sent, received;

	redis_conn_take_bytes(c, &sent, &received);
	counter_add(&r->metrics.bytes_out, sent);
	counter_add(&r->metrics.bytes_in, received);
}

void remote_pool_drop(struct remote *r, struct pooled *p)
{
	if (p->conn) {
		remote_count_bytes(r, p->conn);
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

int remote_conn_open(struct remote *r, const struct node *n, int64_t deadline,
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
	remote_count_bytes(r, c);
	redis_conn_close(c);
	return rc;
}

/* Learns the slot map from any known node, unless another thread installed
 * one since seen_gen. */
int remote_map_refresh(struct remote *r, uint64_t seen_gen, int64_t deadline)
{
	if (remote_lock_until(&r->refresh_lock, deadline) != 0)
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
