/* SPDX-License-Identifier: Apache-2.0 */
/* scale_bench: artfs over one large store, measured from the outside.
 *
 *   scale_bench [--regen] [--clean] [--starts=N] <artfs-daemon> <workdir>
 *               [objects] [versions] [big]
 *
 * The store (<workdir>/store) is written straight to disk in the daemon's
 * layout, <store>/v/<wv>/<hash> = the envelope bytes as published: version
 * "big" holds `big` objects, v001.. share the rest. Objects are small (shape
 * (1, 4, 2) |u1, kind tail) so that a million fit in /dev/shm. Names and
 * payloads come from a fixed seed, so a complete store is reused on the next
 * run (--regen forces a new one).
 *
 * Then, with artfs run as a child (`-f -o store=...,capacity=64G <mnt>`: the
 * mount's holder, which runs the daemon that serves):
 *   baseline   VmRSS of the daemon on an empty store
 *   start      fork -> the first stat of the mount answered (the holder
 *              mounts at once, its daemon answers once it has indexed),
 *              --starts times; the daemon's own "indexed ..." log line;
 *              the daemon's VmRSS; bytes per object
 *   listing    `ls <mnt>/big | wc -l` through the shell, and a readdir loop
 *   stat       10,000 distinct random objects, each stat() timed: cold (no
 *              name known to the kernel yet), then cached
 *   open+read  2,000 other random objects: open, read to EOF, close, each
 *              timed: cold (the daemon verifies the checksum) and warm;
 *              the bytes are checked against numpy.save's after timing
 *   stop       umount, the daemon's exit status
 * References, in the same run: the same work in-process on the store's tmpfs
 * (readdir + fstatat of every object; readdir of big; stat and open+read of
 * the same samples), no FUSE and no checks.
 * Every failure path unmounts (lazily) and kills the daemon.
 *
 * This file: the command line, the order of the steps, the samples. The
 * daemon is in scale_daemon.c, the store in scale_store.c, the measurements
 * and the summary in scale_measure.c; scale_i.h is what they share. */
#include "autoconf.h"

#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "scale_i.h"
#include "util.h"

#define SAMPLE_SEED 0x73616d706c650001ull
#define STAT_SAMPLES 10000
#define READ_SAMPLES 2000

/* Unbiased enough for sampling: n is far below 2^64. */
static size_t rng_below(uint64_t *s, size_t n)
{
	return (size_t)(bench_rng_next(s) % n);
}

/* ---- main ---------------------------------------------------------------------------- */

static void usage(void)
{
	fprintf(stderr,
		"usage: scale_bench [--regen] [--clean] [--starts=N] <artfs-daemon> <workdir> "
		"[objects] [versions] [big]\n"
		"  artfs-daemon  the daemon binary (e.g. ./artfs)\n"
		"  workdir       holds store/, empty-store/, mnt/ and the daemon logs; put it on\n"
		"                tmpfs, e.g. /dev/shm/scale (1M objects take ~4.5 GB there)\n"
		"  objects       objects in the store (default 1000000)\n"
		"  versions      weight versions (default 100): \"big\" and v001...\n"
		"  big           objects in version \"big\" (default 100000)\n"
		"  --regen       write a new store even if a complete one is there\n"
		"  --clean       remove workdir's store, logs and mountpoint at the end\n"
		"  --starts=N    daemon starts on the full store to time (default 3)\n");
	exit(2);
}

/* Options and positional arguments into c (defaults first); the daemon's
 * and the workdir's arguments in *daemon and *workdir. */
static void parse_args(struct cfg *c, int argc, char **argv, const char **daemon,
		       const char **workdir)
{
	const char *pos[5];
	int npos = 0;
	unsigned long v;

	c->objects = 1000000;
	c->versions = 100;
	c->big = 100000;
	c->starts = 3;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--regen") == 0)
			c->regen = true;
		else if (strcmp(argv[i], "--clean") == 0)
			c->clean = true;
		else if (strncmp(argv[i], "--starts=", 9) == 0) {
			if (!bench_parse_count(argv[i] + 9, 16, &v))
				usage();
			c->starts = (unsigned)v;
		} else if (argv[i][0] == '-' && argv[i][1])
			usage();
		else if (npos < 5)
			pos[npos++] = argv[i];
		else
			usage();
	}
	if (npos < 2)
		usage();
	if (npos > 2) {
		if (!bench_parse_count(pos[2], 100000000, &v))
			usage();
		c->objects = v;
	}
	if (npos > 3) {
		if (!bench_parse_count(pos[3], 100000, &v))
			usage();
		c->versions = v;
	}
	if (npos > 4) {
		if (!bench_parse_count(pos[4], 100000000, &v))
			usage();
		c->big = v;
	}
	if (c->big > c->objects || (c->versions == 1 && c->big != c->objects) ||
	    (c->versions > 1 && c->objects - c->big < c->versions - 1))
		bench_die("%zu objects cannot be %zu in \"big\" and at least one in each of the "
			  "other %zu versions", c->objects, c->big, c->versions - 1);
	*daemon = pos[0];
	*workdir = pos[1];
}

/* The daemon's binary, the workdir and the paths in it, the mountpoint
 * (which must not be mounted yet). */
static void set_up_workdir(struct cfg *c, const char *daemon, const char *workdir)
{
	if (access(daemon, X_OK) < 0)
		bench_die("%s: not an executable: %s", daemon, strerror(errno));
	c->daemon = realpath(daemon, NULL);
	if (!c->daemon)
		bench_die("realpath %s: %s", daemon, strerror(errno));
	if (mkdir(workdir, 0755) < 0 && errno != EEXIST)
		bench_die("mkdir %s: %s", workdir, strerror(errno));
	if (!realpath(workdir, c->workdir))
		bench_die("realpath %s: %s", workdir, strerror(errno));
	if ((size_t)snprintf(c->store, sizeof(c->store), "%s/store", c->workdir) >=
		    sizeof(c->store) ||
	    (size_t)snprintf(c->empty, sizeof(c->empty), "%s/empty-store", c->workdir) >=
		    sizeof(c->empty) ||
	    (size_t)snprintf(c->mnt, sizeof(c->mnt), "%s/mnt", c->workdir) >= sizeof(c->mnt) ||
	    (size_t)snprintf(c->marker, sizeof(c->marker), "%s/store.complete", c->workdir) >=
		    sizeof(c->marker))
		bench_die("workdir path too long");
	if (mkdir(c->mnt, 0755) < 0 && errno != EEXIST)
		bench_die("mkdir %s: %s", c->mnt, strerror(errno));
	if (scale_daemon_is_mounted(c->mnt))
		bench_die("%s is already mounted (umount it first)", c->mnt);
}

/* b) the baseline: the daemon on an empty store, its memory. */
static void run_empty(const struct cfg *c, struct results *res)
{
	char path[PATH_MAX];
	struct daemon_run d;
	uint64_t exit_ns;

	scale_store_remove(c->empty);
	bench_fmt_path(path, sizeof(path), "%s/daemon-empty.log", c->workdir);
	scale_daemon_start(c, c->empty, path, &d);
	res->rss_empty_kb = d.rss_kb;
	res->hwm_empty_kb = d.hwm_kb;
	res->anon_empty_kb = d.anon_kb;
	int st = scale_daemon_stop(c, &d, &exit_ns);
	printf("\nempty store: mounted in %.3f s; VmRSS %ld kB, VmHWM %ld kB, RssAnon %ld kB; "
	       "exit status %d\n", (double)d.start_ns / 1e9, d.rss_kb, d.hwm_kb, d.anon_kb, st);
	if (st != 0)
		bench_die("the daemon on the empty store exited with status %d (log: %s)", st,
			  path);
}

/* One start on the full store (number s), timed and measured, its index
 * and sizing lines read from the log at path; the start in *ready_ns. */
static void run_start(const struct cfg *c, unsigned s, const char *path, struct results *res,
		      struct daemon_run *d, uint64_t *ready_ns)
{
	scale_daemon_start(c, c->store, path, d);
	if (!d->have_index) {
		scale_daemon_log_tail(path);
		bench_die("no \"indexed N objects ...\" line in %s", path);
	}
	res->start_s[s] = (double)d->start_ns / 1e9;
	res->ready_s[s] = (double)d->ready_ns / 1e9;
	res->rss_full_kb[s] = d->rss_kb;
	*ready_ns = d->ready_ns; /* the holder mounts at once; its daemon answers later */
	double sized_ms = scale_daemon_wait_sized(path, &d->idx_bytes);
	printf("  start %u: mount %.3f s, first stat answered %.3f s; daemon log: indexed "
	       "%llu objects in %llu versions in %.0f ms, then sized %llu bytes in the "
	       "background in %.0f ms (publishes wait for it); VmRSS %ld kB, VmHWM "
	       "%ld kB, RssAnon %ld kB\n", s + 1, res->start_s[s], res->ready_s[s],
	       d->idx_objects, d->idx_versions, d->idx_ms, d->idx_bytes, sized_ms, d->rss_kb,
	       d->hwm_kb, d->anon_kb);
	if (d->idx_objects != c->objects || d->idx_versions != c->versions)
		printf("  NOTE: the daemon indexed %llu objects in %llu versions; the store "
		       "has %zu in %zu\n", d->idx_objects, d->idx_versions, c->objects,
		       c->versions);
}

/* c) starts on the full store; the last one stays up for the rest (in *d).
 * Their medians, and memory per object against the empty store's. */
static void run_starts(const struct cfg *c, struct results *res, struct daemon_run *d)
{
	char path[PATH_MAX];
	double idx_ms[16];
	uint64_t start_ns[16], exit_ns;

	bench_fmt_path(path, sizeof(path), "%s/daemon-full.log", c->workdir);
	printf("\nfull store: %u start%s (fork -> mount listed in /proc/self/mounts)\n", c->starts,
	       c->starts == 1 ? "" : "s");
	for (unsigned s = 0; s < c->starts; s++) {
		run_start(c, s, path, res, d, &start_ns[s]);
		idx_ms[s] = d->idx_ms;
		if (s + 1 < c->starts) {
			int st = scale_daemon_stop(c, d, &exit_ns);
			printf("          umount -> daemon exit %.3f s, status %d\n",
			       (double)exit_ns / 1e9, st);
			if (st != 0)
				bench_die("the daemon exited with status %d (log: %s)", st, path);
		}
	}
	res->starts = c->starts;
	res->start_med_s = scale_measure_median_u64(start_ns, c->starts) / 1e9;
	res->index_ms_med = bench_median(idx_ms, c->starts);
	double rss_med = 0;
	{
		double r[16];
		for (unsigned s = 0; s < c->starts; s++)
			r[s] = (double)res->rss_full_kb[s];
		rss_med = bench_median(r, c->starts);
	}
	res->bytes_per_obj = (rss_med - (double)res->rss_empty_kb) * 1024.0 / (double)c->objects;
	printf("  median start %.3f s; median VmRSS %.0f kB; (VmRSS full - VmRSS empty) / objects "
	       "= %.1f bytes per object\n", res->start_med_s, rss_med, res->bytes_per_obj);
}

/* e), f) distinct random objects: the stat sample, then the read sample,
 * their sizes in res; free the result. */
static size_t *pick_samples(const struct cfg *c, struct results *res)
{
	res->stat_n = c->objects < STAT_SAMPLES ? c->objects : STAT_SAMPLES;
	res->read_n = c->objects - res->stat_n < READ_SAMPLES ? c->objects - res->stat_n
							      : READ_SAMPLES;
	size_t want = res->stat_n + res->read_n;
	uint32_t *perm = bench_xmalloc(c->objects * sizeof(*perm));
	size_t *sample = bench_xmalloc(want * sizeof(*sample));
	uint64_t srng = SAMPLE_SEED;
	for (size_t i = 0; i < c->objects; i++)
		perm[i] = (uint32_t)i;
	for (size_t i = 0; i < want; i++) { /* partial Fisher-Yates */
		size_t j = i + rng_below(&srng, c->objects - i);
		uint32_t t = perm[i];
		perm[i] = perm[j];
		perm[j] = t;
		sample[i] = perm[i];
	}
	free(perm);
	return sample;
}

/* --clean: the store, the logs, the mountpoint and the workdir. */
static void clean_workdir(const struct cfg *c)
{
	char path[PATH_MAX];

	scale_store_remove(c->store);
	scale_store_remove(c->empty);
	unlink(c->marker);
	bench_fmt_path(path, sizeof(path), "%s/daemon-empty.log", c->workdir);
	unlink(path);
	bench_fmt_path(path, sizeof(path), "%s/daemon-full.log", c->workdir);
	unlink(path);
	rmdir(c->mnt);
	rmdir(c->workdir);
}

int main(int argc, char **argv)
{
	struct cfg c;
	struct results res;
	struct daemon_run d;
	const char *daemon, *workdir;
	uint64_t exit_ns;

	bench_progname = "scale_bench";
	scale_daemon_guard();
	memset(&c, 0, sizeof(c));
	memset(&res, 0, sizeof(res));
	parse_args(&c, argc, argv, &daemon, &workdir);
	set_up_workdir(&c, daemon, workdir);
	scale_daemon_signals(c.mnt);

	printf("scale_bench: %zu objects in %zu versions (\"big\": %zu), workdir %s\n", c.objects,
	       c.versions, c.big, c.workdir);
	scale_store_plan(&c);
	scale_store_prepare(&c);
	scale_measure_raw_scan(&c, &res);
	run_empty(&c, &res);
	run_starts(&c, &res, &d);

	/* d) listing the big version. */
	scale_measure_listing(&c, &res);

	/* e), f) the stat sample, then the read sample. */
	size_t *sample = pick_samples(&c, &res);
	scale_measure_stats(&c, sample, res.stat_n, &res);
	if (res.read_n)
		scale_measure_reads(&c, sample + res.stat_n, res.read_n, &res);
	else
		printf("\nopen+read: no objects left outside the stat sample; skipped\n");
	free(sample);

	long anon;
	scale_daemon_read_status(scale_daemon_serving(d.pid), &res.rss_end_kb, &res.hwm_end_kb,
				 &anon);
	printf("\ndaemon after the measurements: VmRSS %ld kB, VmHWM %ld kB, RssAnon %ld kB\n",
	       res.rss_end_kb, res.hwm_end_kb, anon);

	/* g) stop. */
	res.exit_status = scale_daemon_stop(&c, &d, &exit_ns);
	printf("umount -> daemon exit %.3f s, exit status %d\n", (double)exit_ns / 1e9,
	       res.exit_status);
	scale_measure_summary(&c, &res);

	if (c.clean)
		clean_workdir(&c);
	free(c.wv);
	free(c.count);
	free(c.first);
	free(c.obj);
	free((char *)c.daemon);
	return res.exit_status == 0 ? 0 : 1;
}
