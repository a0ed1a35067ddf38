#include "autoconf.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "metrics.h"

static uint64_t get(const counter_t *c)
{
	return atomic_load_explicit(c, memory_order_relaxed);
}

static void metric(FILE *f, const char *name, const char *type, const char *help, uint64_t v)
{
	fprintf(f, "# HELP %s %s\n# TYPE %s %s\n%s %" PRIu64 "\n", name, help, name, type, name, v);
}

char *metrics_render(const struct metrics *m, const struct metrics_gauges *g)
{
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);

	if (!f)
		return NULL;
	metric(f, "artfs_objects", "gauge", "Committed R3 objects in the store.", g->objects);
	metric(f, "artfs_versions", "gauge", "Weight version directories.", g->versions);
	metric(f, "artfs_bytes_used", "gauge", "Bytes of committed objects.", g->bytes_used);
	metric(f, "artfs_bytes_reserved", "gauge", "Bytes reserved by publishes in flight.",
	       g->bytes_reserved);
	metric(f, "artfs_capacity_bytes", "gauge", "Configured capacity (capacity=).", g->capacity);
	metric(f, "artfs_max_object_bytes", "gauge", "Largest object accepted (max_object=).",
	       g->max_object);
	metric(f, "artfs_uploads_in_flight", "gauge", "Publishes opened and not yet closed.",
	       g->uploads);
	metric(f, "artfs_materialize_held_bytes", "gauge",
	       "Bytes held by open .materialize files (results and request text).",
	       g->materialize_held);
	metric(f, "artfs_materialize_max_bytes", "gauge",
	       "What open .materialize files may hold at once (materialize_max=).", g->materialize_max);
	metric(f, "artfs_start_time_seconds", "gauge", "Unix time the daemon started.",
	       (uint64_t)g->started);
	metric(f, "artfs_store_sizing", "gauge",
	       "1 while the bytes of a store found at start are being counted.", g->sizing);
	static const struct { const char *name, *help; } per_version[] = {
		{ "artfs_version_objects", "Committed objects of one weight version." },
		{ "artfs_version_bytes", "Committed bytes of one weight version." },
		{ "artfs_version_idle_seconds", "Seconds since a publish or read in one weight version." },
		{ "artfs_version_open_files", "Open files under one weight version." },
	};
	for (int k = 0; k < 4; k++) {
		fprintf(f, "# HELP %s %s\n# TYPE %s gauge\n", per_version[k].name, per_version[k].help,
			per_version[k].name);
		for (size_t i = 0; i < g->nper_version; i++) {
			const struct metrics_version *v = &g->per_version[i];
			uint64_t value = k == 0 ? v->objects : k == 1 ? v->bytes
				       : k == 2 ? (uint64_t)(v->idle > 0 ? v->idle : 0) : v->open_files;
			fprintf(f, "%s{version=\"%s\"} %" PRIu64 "\n", per_version[k].name, v->name, value);
		}
	}
	metric(f, "artfs_publishes_total", "counter", "Objects committed.", get(&m->publishes));
	metric(f, "artfs_republish_identical_total", "counter",
	       "Publishes of a key that already held identical content.",
	       get(&m->republish_identical));
	metric(f, "artfs_collisions_total", "counter",
	       "Publishes of a key that already held different content (EEXIST).",
	       get(&m->collisions));
	fprintf(f, "# HELP artfs_rejected_total Publishes refused, by reason.\n"
		   "# TYPE artfs_rejected_total counter\n");
	for (int r = 1; r < ENVELOPE_ERROR_COUNT; r++)
		fprintf(f, "artfs_rejected_total{reason=\"%s\"} %" PRIu64 "\n",
			envelope_error_name((enum envelope_error)r), get(&m->rejected[r]));
	fprintf(f, "artfs_rejected_total{reason=\"too_large\"} %" PRIu64 "\n",
		get(&m->rejected_too_large));
	fprintf(f, "artfs_rejected_total{reason=\"no_space\"} %" PRIu64 "\n",
		get(&m->rejected_no_space));
	metric(f, "artfs_publish_errors_total", "counter", "Store I/O errors while publishing.",
	       get(&m->publish_errors));
	metric(f, "artfs_reads_total", "counter", "Opens of an object for reading.", get(&m->reads));
	metric(f, "artfs_verifications_total", "counter",
	       "Payloads read from the store and checked against payload_sha256.",
	       get(&m->verifications));
	metric(f, "artfs_checksum_failures_total", "counter",
	       "Stored objects that failed verification (served as EIO).",
	       get(&m->checksum_failures));
	metric(f, "artfs_unlinks_total", "counter", "Objects removed by unlink.", get(&m->unlinks));
	metric(f, "artfs_versions_created_total", "counter", "Version directories created.",
	       get(&m->versions_created));
	metric(f, "artfs_versions_removed_total", "counter", "Version directories removed by rmdir.",
	       get(&m->versions_removed));
	metric(f, "artfs_versions_collected_total", "counter",
	       "Version directories collected after ttl= seconds idle.", get(&m->versions_collected));
	metric(f, "artfs_objects_collected_total", "counter", "Objects removed by collection.",
	       get(&m->objects_collected));
	metric(f, "artfs_bytes_collected_total", "counter", "Bytes freed by collection.",
	       get(&m->bytes_collected));
	metric(f, "artfs_materialize_refused_total", "counter",
	       "Materialized results refused under materialize_max= (ENOMEM).",
	       get(&m->materialize_refused));
	if (fclose(f) != 0) {
		free(text);
		return NULL;
	}
	return text;
}
