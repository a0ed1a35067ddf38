/* SPDX-License-Identifier: Apache-2.0 */
/* Counters of the daemon, exposed in Prometheus text format as
 * .artfs/metrics. Counters are atomics: bumped from any thread, lock-free. */
#ifndef ARTFS_METRICS_H
#define ARTFS_METRICS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "artfs/artfs.h"
#include "format/envelope.h"
#include "lib/counter.h"

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
	/* The .cache/ tree (DESIGN.md §9). */
	counter_t cache_hits;           /* opens of a committed file */
	counter_t cache_misses;         /* lookups of a name it does not hold */
	counter_t cache_remote_hits;    /* files fetched from the cluster */
	counter_t cache_commits;        /* files committed */
	counter_t cache_collisions;     /* commits or renames onto other bytes (the first stays) */
	counter_t cache_evictions;      /* files evicted for room */
	counter_t cache_damaged;        /* files that failed their check (dropped) */
	/* The .blocks/ tree (DESIGN.md §10); never evicted: full is ENOSPC. */
	counter_t blocks_hits;          /* blocks served (an open, or one of a .get) */
	counter_t blocks_misses;        /* keys asked that no node holds */
	counter_t blocks_remote_hits;   /* blocks fetched from the cluster */
	counter_t blocks_commits;       /* blocks committed */
	counter_t blocks_collisions;    /* a key that held other bytes (the first stays) */
	counter_t blocks_refused;       /* blocks refused for room (ENOSPC) */
	counter_t blocks_damaged;       /* blocks that failed their check (EIO) */
	counter_t blocks_collected;     /* blocks of idle namespace directories (ttl=) */
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
	uint64_t publishing;
	uint64_t materialize_held;  /* bytes held by open .materialize files */
	uint64_t materialize_max;
	uint64_t started;           /* Unix seconds */
	uint64_t sizing;            /* 1: the store's bytes are still being counted after a start */
	uint64_t daemon_pid;        /* the serving daemon's */
	uint64_t daemon_generation; /* daemons started on this mount, this one included */
	uint64_t cache_bytes;       /* committed bytes of .cache/ */
	uint64_t cache_files;
	uint64_t cache_capacity;    /* cache_capacity= */
	uint64_t blocks_bytes;      /* committed bytes of .blocks/ */
	uint64_t blocks_files;
	uint64_t blocks_capacity;   /* blocks_capacity= */
	struct metrics_version *per_version;
	size_t nper_version;
};

/* Every plain metric, in the order they are exposed: the renderer and
 * artfsctl both read names from here. */
enum metric_id {
	METRIC_OBJECTS, METRIC_VERSIONS, METRIC_BYTES_USED, METRIC_BYTES_RESERVED,
	METRIC_CAPACITY, METRIC_MAX_OBJECT, METRIC_PUBLISHING, METRIC_MATERIALIZE_HELD,
	METRIC_MATERIALIZE_MAX, METRIC_START_TIME, METRIC_STORE_SIZING, METRIC_DAEMON_PID,
	METRIC_DAEMON_GENERATION, METRIC_CACHE_BYTES, METRIC_CACHE_FILES, METRIC_CACHE_CAPACITY,
	METRIC_BLOCKS_BYTES, METRIC_BLOCKS_FILES, METRIC_BLOCKS_CAPACITY,
	METRIC_PUBLISHES, METRIC_REPUBLISH_IDENTICAL, METRIC_COLLISIONS, METRIC_PUBLISH_ERRORS,
	METRIC_READS, METRIC_VERIFICATIONS, METRIC_CHECKSUM_FAILURES, METRIC_UNLINKS,
	METRIC_VERSIONS_CREATED, METRIC_VERSIONS_REMOVED, METRIC_VERSIONS_COLLECTED,
	METRIC_OBJECTS_COLLECTED, METRIC_BYTES_COLLECTED, METRIC_MATERIALIZE_REFUSED,
	METRIC_CACHE_HITS, METRIC_CACHE_MISSES, METRIC_CACHE_REMOTE_HITS, METRIC_CACHE_COMMITS,
	METRIC_CACHE_COLLISIONS, METRIC_CACHE_EVICTIONS, METRIC_CACHE_DAMAGED,
	METRIC_BLOCKS_HITS, METRIC_BLOCKS_MISSES, METRIC_BLOCKS_REMOTE_HITS, METRIC_BLOCKS_COMMITS,
	METRIC_BLOCKS_COLLISIONS, METRIC_BLOCKS_REFUSED, METRIC_BLOCKS_DAMAGED,
	METRIC_BLOCKS_COLLECTED,
	METRIC_COUNT
};

struct metric_def {
	const char *name;
	const char *help;
	bool gauge;       /* a field of struct metrics_gauges, else a counter of struct metrics */
	size_t offset;
};

extern const struct metric_def metric_defs[METRIC_COUNT];

/* The per-version gauges, labelled {version="<wv>"}. */
enum metric_version_id {
	METRIC_VERSION_OBJECTS, METRIC_VERSION_BYTES, METRIC_VERSION_IDLE, METRIC_VERSION_OPEN,
	METRIC_VERSION_COUNT
};
extern const struct metric_def metric_version_defs[METRIC_VERSION_COUNT];

/* Rejected publishes, labelled {reason="..."}. */
#define METRIC_REJECTED "artfs_rejected_total"

/* The exposition text; malloc'd. */
char *metrics_render(const struct metrics *m, const struct metrics_gauges *g);

#endif
