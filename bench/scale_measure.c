/* SPDX-License-Identifier: Apache-2.0 */
/* scale_bench's measurements through the mount, each beside its reference
 * on the store's tmpfs (in-process, no FUSE, no checks): the scan that
 * indexing costs, listing the big version, stat and open+read of random
 * objects, latency percentiles; and the summary table. */
#include "autoconf.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "format/array.h"
#include "format/key.h"
#include "format/npy.h"
#include "scale_i.h"
#include "util.h"

static int cmp_u64(const void *x, const void *y)
{
	uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
	return (a > b) - (a < b);
}

/* Nearest-rank percentile of a sorted array. */
static double pct_us(const uint64_t *sorted, size_t n, double p)
{
	size_t rank = (size_t)(p / 100.0 * (double)n + 0.999999999);
	if (rank < 1)
		rank = 1;
	if (rank > n)
		rank = n;
	return (double)sorted[rank - 1] / 1e3;
}

static struct lat summarize(uint64_t *ns, size_t n)
{
	struct lat l;
	double sum = 0;

	qsort(ns, n, sizeof(*ns), cmp_u64);
	for (size_t i = 0; i < n; i++)
		sum += (double)ns[i];
	l.p50 = pct_us(ns, n, 50);
	l.p90 = pct_us(ns, n, 90);
	l.p99 = pct_us(ns, n, 99);
	l.max = (double)ns[n - 1] / 1e3;
	l.mean = sum / (double)n / 1e3;
	return l;
}

double scale_measure_median_u64(uint64_t *v, size_t n)
{
	qsort(v, n, sizeof(*v), cmp_u64);
	return n % 2 ? (double)v[n / 2] : ((double)v[n / 2 - 1] + (double)v[n / 2]) / 2;
}

static void object_path(const struct cfg *c, size_t idx, char *buf, size_t len)
{
	char hex[HASH_HEX + 1];
	const struct object *o = &c->obj[idx];

	key_hex(o->hash, HASH_BYTES, hex);
	snprintf(buf, len, "%s/%s/%s", c->mnt, c->wv[o->ver], hex);
}

/* The object's file in the store, for the tmpfs references. */
static void store_path(const struct cfg *c, size_t idx, char *buf, size_t len)
{
	char hex[HASH_HEX + 1];
	const struct object *o = &c->obj[idx];

	key_hex(o->hash, HASH_BYTES, hex);
	bench_fmt_path(buf, len, "%s/v/%s/%s", c->store, c->wv[o->ver], hex);
}

/* Reference for the start: what indexing costs the kernel alone, in-process:
 * readdir of every version, then readdir plus fstatat of every object (the
 * daemon's scan does both, and more). */
void scale_measure_raw_scan(const struct cfg *c, struct results *res)
{
	char path[PATH_MAX + 32];

	for (int withstat = 0; withstat < 2; withstat++) {
		size_t n = 0;
		uint64_t t0 = bench_now_ns();
		for (size_t v = 0; v < c->versions; v++) {
			bench_fmt_path(path, sizeof(path), "%s/v/%s", c->store, c->wv[v]);
			DIR *d = opendir(path);
			struct dirent *e;
			struct stat st;
			if (!d)
				bench_die("opendir %s: %s", path, strerror(errno));
			while ((e = readdir(d)) != NULL) {
				if (e->d_name[0] == '.')
					continue;
				if (withstat && fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
					bench_die("fstatat %s/%s: %s", path, e->d_name,
						  strerror(errno));
				n++;
			}
			closedir(d);
		}
		double t = (double)(bench_now_ns() - t0) / 1e9;
		if (n != c->objects)
			bench_die("the store holds %zu objects, expected %zu", n, c->objects);
		if (withstat)
			res->raw_scan_stat_s = t;
		else
			res->raw_scan_s = t;
	}
	printf("\nreference, in-process on the store's tmpfs: readdir of all %zu objects %.3f s; "
	       "readdir + fstatat of each %.3f s\n", c->objects, res->raw_scan_s,
	       res->raw_scan_stat_s);
}

/* Single-quoted for sh. */
static char *shell_quote(const char *s)
{
	size_t n = 3;
	for (const char *p = s; *p; p++)
		n += *p == '\'' ? 4 : 1;
	char *q = bench_xmalloc(n), *o = q;
	*o++ = '\'';
	for (const char *p = s; *p; p++) {
		if (*p == '\'') {
			memcpy(o, "'\\''", 4);
			o += 4;
		} else
			*o++ = *p;
	}
	*o++ = '\'';
	*o = '\0';
	return q;
}


/* `ls <dir> | wc -l` through the shell, timed; the count must be want. */
static double time_ls(const char *dir, size_t want, int run)
{
	char *q = shell_quote(dir);
	size_t cmdlen = strlen(q) + 32;
	char *cmd = bench_xmalloc(cmdlen);
	char out[64] = "";

	snprintf(cmd, cmdlen, "ls %s | wc -l", q);
	fflush(stdout);
	uint64_t t0 = bench_now_ns();
	FILE *p = popen(cmd, "r");
	if (!p)
		bench_die("popen %s: %s", cmd, strerror(errno));
	bool got = fgets(out, sizeof(out), p) != NULL;
	int st = pclose(p);
	uint64_t t = bench_now_ns() - t0;
	if (!got || st != 0)
		bench_die("`%s` failed (status %d)", cmd, st);
	unsigned long long n = strtoull(out, NULL, 10);
	if (n != want)
		bench_die("`%s` counted %llu, expected %zu", cmd, n, want);
	printf("  run %d: `%s` = %llu in %.3f s\n", run, cmd, n, (double)t / 1e9);
	free(cmd);
	free(q);
	return (double)t / 1e9;
}

/* An opendir/readdir loop, timed; the count must be want. */
static double time_readdir(const char *dir, size_t want, int run, const char *what)
{
	uint64_t t0 = bench_now_ns();
	long n = scale_store_count_dir(dir);
	uint64_t t = bench_now_ns() - t0;

	if (n != (long)want)
		bench_die("readdir %s: %ld entries, expected %zu", dir, n, want);
	printf("  run %d: %s %s = %ld in %.3f s\n", run, what, dir, n, (double)t / 1e9);
	return (double)t / 1e9;
}

void scale_measure_listing(const struct cfg *c, struct results *res)
{
	char dir[PATH_MAX + 32], raw[PATH_MAX + 32];

	bench_fmt_path(dir, sizeof(dir), "%s/%s", c->mnt, BIG_WV);
	bench_fmt_path(raw, sizeof(raw), "%s/v/%s", c->store, BIG_WV);
	printf("\nlisting %s (%zu objects); reference: the same on the store's tmpfs\n", dir,
	       c->big);
	for (int r = 0; r < LIST_RUNS; r++)
		res->ls_s[r] = time_ls(dir, c->big, r + 1);
	for (int r = 0; r < LIST_RUNS; r++)
		res->raw_ls_s[r] = time_ls(raw, c->big, r + 1);
	for (int r = 0; r < LIST_RUNS; r++)
		res->readdir_s[r] = time_readdir(dir, c->big, r + 1, "opendir/readdir loop");
	for (int r = 0; r < LIST_RUNS; r++)
		res->raw_readdir_s[r] = time_readdir(raw, c->big, r + 1, "opendir/readdir loop");
}

static void print_lat(const char *what, const struct lat *l, size_t n)
{
	printf("  %-26s n=%-6zu p50 %8.1f  p90 %8.1f  p99 %8.1f  max %9.1f  mean %8.1f us\n",
	       what, n, l->p50, l->p90, l->p99, l->max, l->mean);
}

/* stat(path), timed; dies if it fails. */
static uint64_t timed_stat(const char *path, struct stat *st)
{
	uint64_t t0 = bench_now_ns();
	int rc = stat(path, st);
	uint64_t t = bench_now_ns() - t0;

	if (rc < 0)
		bench_die("stat %s: %s", path, strerror(errno));
	return t;
}

void scale_measure_stats(const struct cfg *c, const size_t *sample, size_t n,
			 struct results *res)
{
	char path[PATH_MAX + 64];
	struct stat st;
	uint64_t *ns = bench_xmalloc(n * sizeof(*ns));

	/* The version directories first, so that the cold pass looks up objects
	 * and not their parents. */
	for (size_t v = 0; v < c->versions; v++) {
		snprintf(path, sizeof(path), "%s/%s", c->mnt, c->wv[v]);
		if (stat(path, &st) < 0)
			bench_die("stat %s: %s", path, strerror(errno));
	}
	printf("\nstat() of %zu distinct random objects across all versions\n", n);
	for (int pass = 0; pass < 2; pass++) {
		for (size_t i = 0; i < n; i++) {
			object_path(c, sample[i], path, sizeof(path));
			ns[i] = timed_stat(path, &st);
			if (!S_ISREG(st.st_mode) || st.st_size <= PAYLOAD_LEN)
				bench_die("stat %s: not a regular file of the expected size", path);
		}
		struct lat l = summarize(ns, n);
		if (pass == 0)
			res->stat_cold = l;
		else
			res->stat_cached = l;
		print_lat(pass == 0 ? "cold (first lookup)" : "cached (second stat)", &l, n);
	}
	/* Reference: the same files on the store's tmpfs, no FUSE. */
	for (size_t i = 0; i < n; i++) {
		store_path(c, sample[i], path, sizeof(path));
		ns[i] = timed_stat(path, &st);
	}
	res->raw_stat = summarize(ns, n);
	print_lat("reference: tmpfs", &res->raw_stat, n);
	res->stat_n = n;
	free(ns);
}

/* open, read until EOF or cap bytes, close: the time that takes; the bytes
 * read in *len. */
static uint64_t timed_read(const char *path, uint8_t *buf, size_t cap, size_t *len)
{
	uint64_t t0 = bench_now_ns();
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		bench_die("open %s: %s", path, strerror(errno));
	int rc = bench_read_all(fd, buf, cap, false, len);
	if (rc < 0)
		bench_die("read %s: %s", path, strerror(-rc));
	close(fd);
	return bench_now_ns() - t0;
}

void scale_measure_reads(const struct cfg *c, const size_t *sample, size_t n,
			 struct results *res)
{
	char path[PATH_MAX + 64];
	uint8_t want[NPY_HEADER_MAX + PAYLOAD_LEN];
	struct array_desc a;
	const size_t slot = 512;
	uint8_t *slots = bench_xmalloc(n * slot);
	size_t *got = bench_xmalloc(n * sizeof(*got));
	uint64_t *ns = bench_xmalloc(n * sizeof(*ns));

	bench_u1_array(&a, 1, 4, 2);
	ssize_t hl = npy_header(&a, want, sizeof(want));
	if (hl < 0)
		bench_die("npy_header: %s", strerror((int)-hl));
	size_t want_len = (size_t)hl + PAYLOAD_LEN;
	memset(slots, 0, n * slot);

	printf("\nopen + read to EOF + close of %zu other distinct random objects\n", n);
	for (int pass = 0; pass < 2; pass++) {
		for (size_t i = 0; i < n; i++) {
			object_path(c, sample[i], path, sizeof(path));
			ns[i] = timed_read(path, slots + i * slot, slot, &got[i]);
		}
		/* After the clock: every file is numpy.save of its payload. */
		for (size_t i = 0; i < n; i++) {
			const struct object *o = &c->obj[sample[i]];
			const uint8_t *buf = slots + i * slot;
			memcpy(want + hl, o->payload, PAYLOAD_LEN);
			if (got[i] != want_len || memcmp(buf, want, want_len) != 0) {
				object_path(c, sample[i], path, sizeof(path));
				bench_die("%s: %zu bytes read, not the expected %zu-byte .npy",
					  path, got[i], want_len);
			}
		}
		memset(slots, 0, n * slot);
		struct lat l = summarize(ns, n);
		if (pass == 0)
			res->read_cold = l;
		else
			res->read_warm = l;
		print_lat(pass == 0 ? "cold (verifies sha256)" : "warm (page cache)", &l, n);
	}
	/* Reference: the envelope files on the store's tmpfs, no FUSE, no checks. */
	for (size_t i = 0; i < n; i++) {
		size_t off;
		store_path(c, sample[i], path, sizeof(path));
		ns[i] = timed_read(path, slots + i * slot, slot, &off);
		if (off <= PAYLOAD_LEN)
			bench_die("%s: %zu bytes", path, off);
	}
	res->raw_read = summarize(ns, n);
	print_lat("reference: tmpfs envelope", &res->raw_read, n);
	res->read_n = n;
	free(ns);
	free(got);
	free(slots);
}

void scale_measure_summary(const struct cfg *c, const struct results *r)
{
	char m[64], ref[64];
	double ls_med[LIST_RUNS], rd_med[LIST_RUNS], raw_rd_med[LIST_RUNS], raw_ls_med[LIST_RUNS];

	memcpy(ls_med, r->ls_s, sizeof(ls_med));
	memcpy(rd_med, r->readdir_s, sizeof(rd_med));
	memcpy(raw_rd_med, r->raw_readdir_s, sizeof(raw_rd_med));
	memcpy(raw_ls_med, r->raw_ls_s, sizeof(raw_ls_med));
	printf("\nsummary: %zu objects in %zu versions (big: %zu), daemon %s, %u start%s\n",
	       c->objects, c->versions, c->big, c->daemon, r->starts, r->starts == 1 ? "" : "s");
	printf("(reference: the same work in-process on the store's tmpfs, no FUSE, no checks)\n");
	printf("%-40s %-20s %-26s %s\n", "measure", "measured", "reference", "goal");
#define ROW(name, goal, reftext, ...)                                                      \
	do {                                                                               \
		snprintf(m, sizeof(m), __VA_ARGS__);                                       \
		printf("%-40s %-20s %-26s %s\n", name, m, reftext, goal);                  \
	} while (0)
	snprintf(ref, sizeof(ref), "%.3f s readdir+fstatat", r->raw_scan_stat_s);
	ROW("start: fork -> first answer (median)", "<= 2 s", ref, "%.3f s", r->start_med_s);
	ROW("start: daemon's own index time (median)", "-", "", "%.0f ms", r->index_ms_med);
	ROW("daemon memory per object", "<= 256 B", "", "%.1f B", r->bytes_per_obj);
	ROW("  VmRSS empty / full store", "-", "", "%.1f / %.1f MiB",
	    (double)r->rss_empty_kb / 1024, (double)r->rss_full_kb[r->starts - 1] / 1024);
	snprintf(ref, sizeof(ref), "%.1f us", r->raw_stat.p99);
	ROW("stat p99, cold (first lookup)", "<= 50 us", ref, "%.1f us", r->stat_cold.p99);
	ROW("stat p99, cached", "<= 50 us", ref, "%.1f us", r->stat_cached.p99);
	snprintf(ref, sizeof(ref), "%.1f us", r->raw_stat.p50);
	ROW("stat p50, cold / cached", "-", ref, "%.1f / %.1f us", r->stat_cold.p50,
	    r->stat_cached.p50);
	snprintf(ref, sizeof(ref), "%.3f s", bench_median(raw_ls_med, LIST_RUNS));
	ROW("ls big | wc -l (median of 3)", "-", ref, "%.3f s", bench_median(ls_med, LIST_RUNS));
	snprintf(ref, sizeof(ref), "%.3f s", bench_median(raw_rd_med, LIST_RUNS));
	ROW("readdir loop over big (median of 3)", "-", ref, "%.3f s",
	    bench_median(rd_med, LIST_RUNS));
	if (r->read_n) {
		snprintf(ref, sizeof(ref), "%.1f / %.1f us", r->raw_read.p50, r->raw_read.p99);
		ROW("open+read+close p50 / p99, cold", "-", ref, "%.1f / %.1f us",
		    r->read_cold.p50, r->read_cold.p99);
		ROW("open+read+close p50 / p99, warm", "-", ref, "%.1f / %.1f us",
		    r->read_warm.p50, r->read_warm.p99);
	}
	ROW("daemon exit status after umount", "0", "", "%d", r->exit_status);
#undef ROW
}
