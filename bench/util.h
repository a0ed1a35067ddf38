/* SPDX-License-Identifier: Apache-2.0 */
/* Helpers shared by the benchmark programs (r3_bench, materialize_bench,
 * scale_bench): fatal errors, allocation, the clock, a seeded RNG, whole-file
 * I/O, flat directories, medians, the command line, and the publish, the raw
 * reader's checks and the array shapes that more than one of them uses.
 *
 * Every failure here is fatal through bench_die, which prints
 * "<bench_progname>: <message>" to stderr and exits with status 1. */
#ifndef ARTFS_BENCH_UTIL_H
#define ARTFS_BENCH_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct array_desc;
struct envelope;

/* The program's name in bench_die's messages; main sets it first. */
extern const char *bench_progname;

/* Called by bench_die after the message and before exit(1), if set: a
 * program that must clean up on a fatal error (scale_bench: its mount and
 * its daemon) puts that here. */
extern void (*bench_die_hook)(void);

/* Flushes stdout, prints "<bench_progname>: <message>\n" to stderr, runs
 * bench_die_hook, exits with status 1. */
void bench_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

/* A path formatted into buf (len bytes); one that does not fit dies. */
void bench_fmt_path(char *buf, size_t len, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* malloc that dies when out of memory; 0 bytes is an allocation of 1. */
void *bench_xmalloc(size_t len);

/* asprintf that dies when out of memory; free the result. */
char *bench_xprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t bench_now_ns(void);

/* splitmix64: deterministic, and enough for names and payload bytes. */
uint64_t bench_rng_next(uint64_t *s);
void bench_rng_fill(uint64_t *s, uint8_t *buf, size_t len);

/* Writes all of data, retrying EINTR; 0, or -errno (-EIO for a write of 0). */
int bench_write_all(int fd, const void *data, size_t len);

/* Reads fd into buf until EOF or until cap bytes are in, retrying EINTR, and
 * sets *len to the bytes read (on an error too). Returns 0 at EOF, 1 when buf
 * filled up first, -errno on a read error. probe: once buf is full, read one
 * byte more to tell a file of exactly cap bytes (0) from a longer one (1);
 * an error of that read is -errno with *len == cap. Without probe a full buf
 * returns 1 at once, whether or not the file ends there. */
int bench_read_all(int fd, void *buf, size_t cap, bool probe, size_t *len);

/* Creates or truncates path (mode 0644) and writes data to it; dies with
 * "<side> open|write|close <path>: <error>" on a failure. close_is_result:
 * close's status is the store's verdict on the object (an artfs publish),
 * and the close message says so. */
void bench_write_file(const char *side, const char *path, const void *data, size_t len,
		      bool close_is_result);

/* What a reader of the raw store checks of a file's bytes s[0, len) before it
 * uses them: the envelope parses, is len bytes long, carries the key of
 * (wv, hash) and a payload that hashes to the sha256 it declares. Fills *env;
 * dies with "raw <path>: ..." at the first check that fails. */
void bench_check_raw_envelope(const char *path, const uint8_t *s, size_t len, const char *wv,
			      const uint8_t *hash, size_t hash_len, struct envelope *env);

/* Removes every entry of dir (a flat directory of objects), then dir itself;
 * a dir that does not exist is fine. Entries that start with a dot and cannot
 * be unlinked are passed over (artfs lists its special files; rmdir tells). */
void bench_remove_dir(const char *dir);

/* mkdir(dir, 0755), or die. */
void bench_make_dir(const char *dir);

/* Sorts v and returns its median (the mean of the middle two for even n). */
double bench_median(double *v, size_t n);

/* A decimal count from 1 to max, no sign, nothing after it. */
bool bench_parse_count(const char *s, unsigned long max, unsigned long *out);

/* The command line of the benchmarks that compare an artfs mount with a raw
 * directory (r3_bench, materialize_bench):
 *   [--keep] <mountpoint> <raw_dir> [count] [rounds]
 * count from 1 to count_max, rounds from 1 to rounds_max; a->count and
 * a->rounds hold the defaults on entry. Returns false for any other command
 * line (another option, fewer or more arguments, a bad number): the caller
 * prints its usage. */
struct bench_mount_args {
	bool keep;
	const char *mnt;
	const char *raw;
	unsigned long count;
	unsigned long rounds;
};
bool bench_parse_mount_args(int argc, char **argv, unsigned long count_max,
			    unsigned long rounds_max, struct bench_mount_args *a);

/* Dies unless mnt is a directory with a FUSE file system mounted on it. */
void bench_require_fuse_mount(const char *mnt);

/* Sets *a to a 3-d |u1 array of shape (d0, d1, d2), every other field 0. */
void bench_u1_array(struct array_desc *a, uint64_t d0, uint64_t d1, uint64_t d2);

#endif
