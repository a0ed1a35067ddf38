/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "state/metrics.h"

#define COUNTER(f) false, offsetof(struct metrics, f)
#define GAUGE(f) true, offsetof(struct metrics_gauges, f)
const struct metric_def metric_defs[METRIC_COUNT] = {
	[METRIC_OBJECTS] = { "artfs_objects", "Committed R3 objects in the store.", GAUGE(objects) },
	[METRIC_VERSIONS] = { "artfs_versions", "Weight version directories.", GAUGE(versions) },
	[METRIC_BYTES_USED] = { "artfs_bytes_used", "Bytes of committed objects.", GAUGE(bytes_used) },
	[METRIC_BYTES_RESERVED] = { "artfs_bytes_reserved",
		"Bytes reserved by publishes in flight (what they have sent).", GAUGE(bytes_reserved) },
	[METRIC_CAPACITY] = { "artfs_capacity_bytes", "Configured capacity (capacity=).",
		GAUGE(capacity) },
	[METRIC_MAX_OBJECT] = { "artfs_max_object_bytes", "Largest object accepted (max_object=).",
		GAUGE(max_object) },
	[METRIC_PUBLISHING] = { "artfs_uploads_in_flight", "Publishes opened and not yet closed.",
		GAUGE(publishing) },
	[METRIC_MATERIALIZE_HELD] = { "artfs_materialize_held_bytes",
		"Bytes held by open .materialize, .keys/.get and .put files "
		"(results, request text, queued records).",
		GAUGE(materialize_held) },
	[METRIC_MATERIALIZE_MAX] = { "artfs_materialize_max_bytes",
		"What open .materialize files may hold at once (materialize_max=).",
		GAUGE(materialize_max) },
	[METRIC_START_TIME] = { "artfs_start_time_seconds", "Unix time the daemon started.",
		GAUGE(started) },
	[METRIC_STORE_SIZING] = { "artfs_store_sizing",
		"1 while the bytes of a store found at start are being counted.", GAUGE(sizing) },
	[METRIC_DAEMON_PID] = { "artfs_daemon_pid", "Process id of the daemon serving the mount.",
		GAUGE(daemon_pid) },
	[METRIC_DAEMON_GENERATION] = { "artfs_daemon_generation",
		"Daemons started on this mount, the serving one included (1 until a crash or an "
		"upgrade).", GAUGE(daemon_generation) },
	[METRIC_CACHE_BYTES] = { "artfs_cache_bytes", "Committed bytes of the .cache/ tree.",
		GAUGE(cache_bytes) },
	[METRIC_CACHE_FILES] = { "artfs_cache_files", "Committed files of the .cache/ tree.",
		GAUGE(cache_files) },
	[METRIC_CACHE_CAPACITY] = { "artfs_cache_capacity_bytes",
		"Bytes the .cache/ tree may hold (cache_capacity=).", GAUGE(cache_capacity) },
	[METRIC_BLOCKS_BYTES] = { "artfs_blocks_bytes", "Committed bytes of the .blocks/ tree.",
		GAUGE(blocks_bytes) },
	[METRIC_BLOCKS_FILES] = { "artfs_blocks_files", "Committed blocks of the .blocks/ tree.",
		GAUGE(blocks_files) },
	[METRIC_BLOCKS_CAPACITY] = { "artfs_blocks_capacity_bytes",
		"Bytes the .blocks/ tree may hold (blocks_capacity=).", GAUGE(blocks_capacity) },
	[METRIC_PUBLISHES] = { "artfs_publishes_total", "Objects committed.", COUNTER(publishes) },
	[METRIC_REPUBLISH_IDENTICAL] = { "artfs_republish_identical_total",
		"Publishes of a key that already held identical content.",
		COUNTER(republish_identical) },
	[METRIC_COLLISIONS] = { "artfs_collisions_total",
		"Publishes of a key that already held different content (EEXIST).",
		COUNTER(collisions) },
	[METRIC_PUBLISH_ERRORS] = { "artfs_publish_errors_total",
		"Store I/O errors while publishing.", COUNTER(publish_errors) },
	[METRIC_READS] = { "artfs_reads_total", "Opens of an object for reading.", COUNTER(reads) },
	[METRIC_VERIFICATIONS] = { "artfs_verifications_total",
		"Payloads read from the store and checked against payload_sha256.",
		COUNTER(verifications) },
	[METRIC_CHECKSUM_FAILURES] = { "artfs_checksum_failures_total",
		"Stored objects that failed verification (served as EIO).",
		COUNTER(checksum_failures) },
	[METRIC_UNLINKS] = { "artfs_unlinks_total", "Objects removed by unlink.", COUNTER(unlinks) },
	[METRIC_VERSIONS_CREATED] = { "artfs_versions_created_total", "Version directories created.",
		COUNTER(versions_created) },
	[METRIC_VERSIONS_REMOVED] = { "artfs_versions_removed_total",
		"Version directories removed by rmdir.", COUNTER(versions_removed) },
	[METRIC_VERSIONS_COLLECTED] = { "artfs_versions_collected_total",
		"Version directories collected after ttl= seconds idle.", COUNTER(versions_collected) },
	[METRIC_OBJECTS_COLLECTED] = { "artfs_objects_collected_total",
		"Objects removed by collection.", COUNTER(objects_collected) },
	[METRIC_BYTES_COLLECTED] = { "artfs_bytes_collected_total", "Bytes freed by collection.",
		COUNTER(bytes_collected) },
	[METRIC_MATERIALIZE_REFUSED] = { "artfs_materialize_refused_total",
		"Materialized results refused under materialize_max= (ENOMEM).",
		COUNTER(materialize_refused) },
	[METRIC_CACHE_HITS] = { "artfs_cache_hits_total",
		"Opens of a committed .cache/ file (checked, served).", COUNTER(cache_hits) },
	[METRIC_CACHE_MISSES] = { "artfs_cache_misses_total",
		"Lookups of a .cache/ name that the tree does not hold.", COUNTER(cache_misses) },
	[METRIC_CACHE_REMOTE_HITS] = { "artfs_cache_remote_hits_total",
		".cache/ files fetched from the cluster (remote=).", COUNTER(cache_remote_hits) },
	[METRIC_CACHE_COMMITS] = { "artfs_cache_commits_total", ".cache/ files committed.",
		COUNTER(cache_commits) },
	[METRIC_CACHE_COLLISIONS] = { "artfs_cache_collisions_total",
		"Commits or renames onto a .cache/ name that held other bytes (the first stays).",
		COUNTER(cache_collisions) },
	[METRIC_CACHE_EVICTIONS] = { "artfs_cache_evictions_total",
		".cache/ files evicted for room (least recently opened first).",
		COUNTER(cache_evictions) },
	[METRIC_CACHE_DAMAGED] = { "artfs_cache_damaged_total",
		".cache/ files that failed their SHA-256 check (dropped: a miss).",
		COUNTER(cache_damaged) },
	[METRIC_BLOCKS_HITS] = { "artfs_blocks_hits_total",
		"Blocks served from .blocks/ (an open, or one key of a .get; checked).",
		COUNTER(blocks_hits) },
	[METRIC_BLOCKS_MISSES] = { "artfs_blocks_misses_total",
		"Block keys asked that neither this node nor the cluster holds.",
		COUNTER(blocks_misses) },
	[METRIC_BLOCKS_REMOTE_HITS] = { "artfs_blocks_remote_hits_total",
		"Blocks fetched from the cluster (remote=).", COUNTER(blocks_remote_hits) },
	[METRIC_BLOCKS_COMMITS] = { "artfs_blocks_commits_total", "Blocks committed.",
		COUNTER(blocks_commits) },
	[METRIC_BLOCKS_COLLISIONS] = { "artfs_blocks_collisions_total",
		"Puts of a block key that held other bytes (the first stays).",
		COUNTER(blocks_collisions) },
	[METRIC_BLOCKS_REFUSED] = { "artfs_blocks_refused_total",
		"Blocks refused because .blocks/ was full (ENOSPC; nothing is evicted).",
		COUNTER(blocks_refused) },
	[METRIC_BLOCKS_DAMAGED] = { "artfs_blocks_damaged_total",
		"Blocks that failed their SHA-256 check (served as EIO).", COUNTER(blocks_damaged) },
	[METRIC_BLOCKS_COLLECTED] = { "artfs_blocks_collected_total",
		"Blocks removed with their namespace directory after ttl= seconds idle.",
		COUNTER(blocks_collected) },
};

/* Their values come from struct metrics_version (version_value), not a field. */
#define PER_VERSION true, 0
const struct metric_def metric_version_defs[METRIC_VERSION_COUNT] = {
	[METRIC_VERSION_OBJECTS] = { "artfs_version_objects",
		"Committed objects of one weight version.", PER_VERSION },
	[METRIC_VERSION_BYTES] = { "artfs_version_bytes", "Committed bytes of one weight version.",
		PER_VERSION },
	[METRIC_VERSION_IDLE] = { "artfs_version_idle_seconds",
		"Seconds since a publish or read in one weight version.", PER_VERSION },
	[METRIC_VERSION_OPEN] = { "artfs_version_open_files",
		"Open files under one weight version.", PER_VERSION },
};
#undef COUNTER
#undef GAUGE
#undef PER_VERSION

static uint64_t value_of(const struct metric_def *d, const struct metrics *m,
			 const struct metrics_gauges *g)
{
	if (d->gauge)
		return *(const uint64_t *)((const char *)g + d->offset);
	return atomic_load_explicit((const counter_t *)((const char *)m + d->offset),
				    memory_order_relaxed);
}

static void header(FILE *f, const struct metric_def *d)
{
	fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", d->name, d->help, d->name,
		d->gauge ? "gauge" : "counter");
}

static uint64_t version_value(int k, const struct metrics_version *v)
{
	switch (k) {
	case METRIC_VERSION_OBJECTS: return v->objects;
	case METRIC_VERSION_BYTES: return v->bytes;
	case METRIC_VERSION_IDLE: return (uint64_t)(v->idle > 0 ? v->idle : 0);
	default: return v->open_files;
	}
}

char *metrics_render(const struct metrics *m, const struct metrics_gauges *g)
{
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);

	if (!f)
		return NULL;
	for (int k = 0; k < METRIC_COUNT; k++) {
		header(f, &metric_defs[k]);
		fprintf(f, "%s %" PRIu64 "\n", metric_defs[k].name, value_of(&metric_defs[k], m, g));
	}
	for (int k = 0; k < METRIC_VERSION_COUNT; k++) {
		header(f, &metric_version_defs[k]);
		for (size_t i = 0; i < g->nper_version; i++)
			fprintf(f, "%s{version=\"%s\"} %" PRIu64 "\n", metric_version_defs[k].name,
				g->per_version[i].name, version_value(k, &g->per_version[i]));
	}
	fprintf(f, "# HELP " METRIC_REJECTED " Publishes refused, by reason.\n"
		   "# TYPE " METRIC_REJECTED " counter\n");
	for (int r = 1; r < ENVELOPE_ERROR_COUNT; r++)
		fprintf(f, METRIC_REJECTED "{reason=\"%s\"} %" PRIu64 "\n",
			envelope_error_name((enum envelope_error)r),
			atomic_load_explicit(&m->rejected[r], memory_order_relaxed));
	fprintf(f, METRIC_REJECTED "{reason=\"too_large\"} %" PRIu64 "\n",
		atomic_load_explicit(&m->rejected_too_large, memory_order_relaxed));
	fprintf(f, METRIC_REJECTED "{reason=\"no_space\"} %" PRIu64 "\n",
		atomic_load_explicit(&m->rejected_no_space, memory_order_relaxed));
	if (fclose(f) != 0) {
		free(text);
		return NULL;
	}
	return text;
}
