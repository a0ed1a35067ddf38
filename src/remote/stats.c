/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <inttypes.h>

#include "remote/stats.h"

static const uint64_t bound_us[REMOTE_LATENCY_BUCKETS] = {
	100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 500000,
	1000000, 2000000,
};
static const char *const bound_label[REMOTE_LATENCY_BUCKETS] = {
	"0.0001", "0.00025", "0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05",
	"0.1", "0.25", "0.5", "1", "2",
};

static uint64_t get(const counter_t *c)
{
	return atomic_load_explicit(c, memory_order_relaxed);
}

/* The count goes up before its bucket and is read after the buckets, so a
 * concurrent render never shows a bucket above +Inf. */
void remote_metrics_observe(struct remote_metrics *m, uint64_t usec)
{
	counter_inc(&m->latency_count);
	counter_add(&m->latency_sum_us, usec);
	for (int b = 0; b < REMOTE_LATENCY_BUCKETS; b++)
		if (usec <= bound_us[b]) {
			counter_inc(&m->latency[b]);
			break;
		}
}

void remote_metrics_snapshot(const struct remote_metrics *m, struct remote_stats *out)
{
	*out = (struct remote_stats){
		.hits = get(&m->hits),
		.misses = get(&m->misses),
		.puts = get(&m->puts),
		.errors = get(&m->errors),
		.bytes_in = get(&m->bytes_in),
		.bytes_out = get(&m->bytes_out),
		.rounds = get(&m->rounds),
		.moved = get(&m->moved),
		.asked = get(&m->asked),
		.refreshes = get(&m->refreshes),
		.connects = get(&m->connects),
	};
}

static void counter(FILE *f, const char *name, const char *help, uint64_t v)
{
	fprintf(f, "# HELP %s %s\n# TYPE %s counter\n%s %" PRIu64 "\n", name, help, name, name, v);
}

void remote_metrics_print(const struct remote_metrics *m, FILE *f)
{
	counter(f, "artfs_remote_hits_total", "Keys read from the Redis Cluster and found.",
		get(&m->hits));
	counter(f, "artfs_remote_misses_total", "Keys read from the Redis Cluster and absent.",
		get(&m->misses));
	counter(f, "artfs_remote_puts_total", "Values written to the Redis Cluster (SET NX accepted).",
		get(&m->puts));
	counter(f, "artfs_remote_errors_total",
		"Keys whose read or write failed: cluster unreachable or out of memory.",
		get(&m->errors));
	fprintf(f, "# HELP artfs_remote_bytes_total Bytes exchanged with the Redis Cluster.\n"
		   "# TYPE artfs_remote_bytes_total counter\n"
		   "artfs_remote_bytes_total{dir=\"in\"} %" PRIu64 "\n"
		   "artfs_remote_bytes_total{dir=\"out\"} %" PRIu64 "\n",
		get(&m->bytes_in), get(&m->bytes_out));
	counter(f, "artfs_remote_rounds_total", "Pipelines sent, one per cluster node per round.",
		get(&m->rounds));
	fprintf(f, "# HELP artfs_remote_redirects_total MOVED and ASK redirections followed.\n"
		   "# TYPE artfs_remote_redirects_total counter\n"
		   "artfs_remote_redirects_total{kind=\"moved\"} %" PRIu64 "\n"
		   "artfs_remote_redirects_total{kind=\"ask\"} %" PRIu64 "\n",
		get(&m->moved), get(&m->asked));
	counter(f, "artfs_remote_slot_map_refreshes_total",
		"Slot maps learnt from the cluster (CLUSTER SLOTS).", get(&m->refreshes));
	counter(f, "artfs_remote_connects_total", "Connections opened to cluster nodes.",
		get(&m->connects));
	fprintf(f, "# HELP artfs_remote_latency_seconds Time of one remote call (a key or a batch).\n"
		   "# TYPE artfs_remote_latency_seconds histogram\n");
	uint64_t cumulative = 0;
	for (int b = 0; b < REMOTE_LATENCY_BUCKETS; b++) {
		cumulative += get(&m->latency[b]);
		fprintf(f, "artfs_remote_latency_seconds_bucket{le=\"%s\"} %" PRIu64 "\n",
			bound_label[b], cumulative);
	}
	uint64_t sum = get(&m->latency_sum_us), count = get(&m->latency_count);
	fprintf(f, "artfs_remote_latency_seconds_bucket{le=\"+Inf\"} %" PRIu64 "\n"
		   "artfs_remote_latency_seconds_sum %" PRIu64 ".%06" PRIu64 "\n"
		   "artfs_remote_latency_seconds_count %" PRIu64 "\n",
		count, sum / 1000000, sum % 1000000, count);
}
