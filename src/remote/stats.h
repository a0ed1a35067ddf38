/* SPDX-License-Identifier: Apache-2.0 */
/* Counters and the latency histogram of the Redis Cluster client, and their
 * Prometheus text. Atomics, bumped from any thread; no I/O of its own, so
 * the client and its stub-free tests share it. */
#ifndef ARTFS_REMOTE_METRICS_H
#define ARTFS_REMOTE_METRICS_H

#include <stdint.h>
#include <stdio.h>

#include "remote/remote.h"
#include "lib/counter.h"

/* Upper bounds of the latency buckets: 100 us .. 2 s, then +Inf. */
#define REMOTE_LATENCY_BUCKETS 14

struct remote_metrics {
	counter_t hits;        /* keys read and found */
	counter_t misses;      /* keys read and absent */
	counter_t puts;        /* values this client created (SET NX accepted) */
	counter_t errors;      /* keys that failed: EIO or ENOSPC */
	counter_t bytes_in;    /* bytes received from the cluster (wire) */
	counter_t bytes_out;   /* bytes sent to the cluster (wire) */
	counter_t rounds;      /* pipelines sent, one per node per round */
	counter_t moved;       /* MOVED redirections followed */
	counter_t asked;       /* ASK redirections followed */
	counter_t refreshes;   /* slot maps learnt with CLUSTER SLOTS */
	counter_t connects;    /* connections opened (first use and reconnects) */
	counter_t latency[REMOTE_LATENCY_BUCKETS]; /* calls by bucket, not cumulative */
	counter_t latency_count;
	counter_t latency_sum_us;
};

/* One call of the API that took usec microseconds. */
void remote_metrics_observe(struct remote_metrics *m, uint64_t usec);

void remote_metrics_snapshot(const struct remote_metrics *m, struct remote_stats *out);

/* Prometheus text of every counter and the histogram. */
void remote_metrics_print(const struct remote_metrics *m, FILE *f);

#endif
