/* Counters of the daemon, exposed in Prometheus text format as
 * .artfs/metrics. Counters are atomics: bumped from any thread, lock-free. */
#ifndef ARTFS_METRICS_H
#define ARTFS_METRICS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "artfs/artfs.h"
#include "envelope.h"

typedef _Atomic uint64_t counter_t;

struct metrics {
	counter_t publishes;            /* objects committed */
	counter_t republish_identical;  /* publishes of a key that held identical content */
	counter_t collisions;           /* publishes of a key that held different content */
	counter_t rejected[ENVELOPE_ERROR_COUNT]; /* EBADMSG, by reason */
	counter_t rejected_too_large;   /* EFBIG */
	counter_t rejected_no_space;    /* ENOSPC */
	counter_t publish_errors;       /* store I/O errors while publishing */
	counter_t reads;                /* opens of an object for reading */
	counter_t verifications;        /* payloads read from the store and verified */
	counter_t checksum_failures;    /* stored objects that failed verification */
	counter_t unlinks;              /* objects removed by unlink */
	counter_t versions_created;
	counter_t versions_removed;     /* by rmdir */
	counter_t versions_collected;   /* expired (ttl=) */
	counter_t objects_collected;
	counter_t bytes_collected;
	counter_t materialize_refused;  /* results refused under materialize_max= (ENOMEM) */
};

struct metrics_version {
	char name[ARTFS_VERSION_NAME_MAX + 1];
	uint64_t objects;
	uint64_t bytes;
	int64_t idle;        /* seconds since the last publish or read */
	uint32_t open_files;
};

/* Gauges sampled under the tree lock when the file is opened. */
struct metrics_gauges {
	uint64_t objects;
	uint64_t versions;
	uint64_t bytes_used;
	uint64_t bytes_reserved;
	uint64_t capacity;
	uint64_t max_object;
	uint64_t uploads;
	uint64_t materialize_held;  /* bytes held by open .materialize files */
	uint64_t materialize_max;
	int64_t started;
	bool sizing;         /* the store's bytes are still being counted after a start */
	struct metrics_version *per_version;
	size_t nper_version;
};

static inline void counter_inc(counter_t *c)
{
	atomic_fetch_add_explicit(c, 1, memory_order_relaxed);
}

/* The exposition text; malloc'd. */
char *metrics_render(const struct metrics *m, const struct metrics_gauges *g);

#endif
