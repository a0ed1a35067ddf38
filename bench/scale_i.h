/* SPDX-License-Identifier: Apache-2.0 */
/* What the files of scale_bench share: the run's configuration and the
 * objects of its store, the daemon under test, the measurements, and the
 * functions each file gives the others (scale_daemon.c: the daemon and the
 * clean-up after it; scale_store.c: the store on disk; scale_measure.c:
 * listing, stat, read and the summary; scale_bench.c: main). */
#ifndef ARTFS_BENCH_SCALE_I_H
#define ARTFS_BENCH_SCALE_I_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define HASH_BYTES 16
#define HASH_HEX (2 * HASH_BYTES)
#define PAYLOAD_LEN 8 /* shape (1, 4, 2) |u1 */
#define BIG_WV "big"
#define SEED 0x7363616c65000001ull
#define LIST_RUNS 3

struct object {
	uint8_t hash[HASH_BYTES];
	uint8_t payload[PAYLOAD_LEN];
	uint32_t ver;
};

struct cfg {
	const char *daemon;
	char workdir[PATH_MAX];
	char store[PATH_MAX];
	char empty[PATH_MAX];
	char mnt[PATH_MAX];
	char marker[PATH_MAX];
	size_t objects, versions, big;
	unsigned starts;
	bool regen, clean;
	char (*wv)[16];   /* version names */
	size_t *count;    /* objects per version */
	size_t *first;    /* index of each version's first object */
	struct object *obj;
};

struct daemon_run {
	pid_t pid;
	char log[PATH_MAX];
	uint64_t start_ns;   /* fork -> mount listed */
	uint64_t ready_ns;   /* fork -> first stat of the mount root answered */
	long rss_kb, hwm_kb, anon_kb;
	bool have_index;
	unsigned long long idx_objects, idx_bytes, idx_versions;
	double idx_ms;
};

struct lat {
	double p50, p90, p99, max, mean;
};

struct results {
	double start_s[16], ready_s[16], exit_s[16];
	long rss_full_kb[16];
	unsigned starts;
	long rss_empty_kb, hwm_empty_kb, anon_empty_kb;
	long rss_end_kb, hwm_end_kb;
	double start_med_s, index_ms_med, bytes_per_obj;
	double ls_s[LIST_RUNS], raw_ls_s[LIST_RUNS];
	double readdir_s[LIST_RUNS], raw_readdir_s[LIST_RUNS];
	double raw_scan_s, raw_scan_stat_s; /* the store's tmpfs, in-process */
	struct lat stat_cold, stat_cached, read_cold, read_warm;
	struct lat raw_stat, raw_read;      /* the same objects on tmpfs directly */
	size_t stat_n, read_n;
	int exit_status;
};

/* scale_daemon.c */

/* This process is the main one: a fatal error in it (bench_die) unmounts
 * and stops the daemon. First thing in main, before anything forks. */
void scale_daemon_guard(void);

/* SIGINT, SIGTERM and SIGHUP unmount mnt (lazily) and stop the daemon
 * before exiting; SIGPIPE is ignored. */
void scale_daemon_signals(const char *mnt);

/* Whether a fuse mount sits at path (an absolute, resolved path). */
bool scale_daemon_is_mounted(const char *path);

/* The last lines of the daemon's log, to stderr. */
void scale_daemon_log_tail(const char *log);

/* VmRSS, VmHWM and RssAnon of pid, in kB. */
void scale_daemon_read_status(pid_t pid, long *rss, long *hwm, long *anon);

/* The daemon that serves: the mount's holder (the process started) runs
 * it as its child. */
pid_t scale_daemon_serving(pid_t holder);

/* Waits up to 60 s for the daemon's background sizing line; its ms or -1. */
double scale_daemon_wait_sized(const char *log, unsigned long long *bytes);

/* Forks the daemon on store, waits for its mount; fills start_ns, RSS and the
 * index line. */
void scale_daemon_start(const struct cfg *c, const char *store, const char *log,
			struct daemon_run *d);

/* umount (the command), then the daemon's exit; returns its exit status and
 * the time from umount to exit. */
int scale_daemon_stop(const struct cfg *c, struct daemon_run *d, uint64_t *exit_ns);

/* scale_store.c */

/* Deletes path and everything under it (no links followed). */
void scale_store_remove(const char *path);

/* Names, payloads and the layout of the store, from the seed. */
void scale_store_plan(struct cfg *c);

/* Entries of a directory that are not dot-names; -1 if it cannot be read. */
long scale_store_count_dir(const char *path);

/* Reuses a complete store of the same parameters, or writes a new one. */
void scale_store_prepare(struct cfg *c);

/* scale_measure.c */

/* Reference for the start: readdir, then readdir + fstatat, of every object
 * on the store's tmpfs, in-process. */
void scale_measure_raw_scan(const struct cfg *c, struct results *res);

/* The median of n values (sorts them). */
double scale_measure_median_u64(uint64_t *v, size_t n);

/* ls | wc -l and a readdir loop over the big version, on the mount and on
 * the store's tmpfs. */
void scale_measure_listing(const struct cfg *c, struct results *res);

/* stat() of the n objects of sample: cold, cached, and on the tmpfs. */
void scale_measure_stats(const struct cfg *c, const size_t *sample, size_t n,
			 struct results *res);

/* open + read + close of the n objects of sample: cold, warm, and on the
 * tmpfs; the bytes are checked after timing. */
void scale_measure_reads(const struct cfg *c, const size_t *sample, size_t n,
			 struct results *res);

/* The table of results, with references and goals. */
void scale_measure_summary(const struct cfg *c, const struct results *r);

#endif
