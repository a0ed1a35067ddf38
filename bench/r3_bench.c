/* SPDX-License-Identifier: Apache-2.0 */
/* r3_bench: R3 objects through an artfs mount against the raw tmpfs store
 * that vLLM's SHM backend uses, in one process, on the same data.
 *
 *   r3_bench [--keep] <mountpoint> <raw_dir> [N] [rounds]
 *
 * Phases, each timed for both stores with CLOCK_MONOTONIC:
 *   publish       artfs: open(O_CREAT|O_WRONLY|O_TRUNC), write envelope, close == 0
 *                 raw:   temporary file (O_EXCL), write, close, link, unlink temporary
 *   first read    artfs: read the .npy until EOF (checked after the timed loop)
 *                 raw:   read the envelope, parse, check key and payload sha256
 *   warm re-read  the same reads again
 * Envelopes are encoded before any timing. The ratio artfs/raw of one round
 * compares the two stores under the same machine load; its median over the
 * rounds is the number to quote. */
#include "autoconf.h"

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
#include "format/envelope.h"
#include "format/key.h"
#include "format/npy.h"
#include "lib/sha256.h"
#include "util.h"

#define WV "bench"
#define HASH_BYTES 32
#define HASH_HEX (2 * HASH_BYTES)
#define SHAPE0 16
#define SHAPE1 48
#define SHAPE2 8
#define PAYLOAD_LEN ((size_t)SHAPE0 * SHAPE1 * SHAPE2) /* |u1 */
#define SEED 0x5233626e63680001ull                     /* fixed: same data every run */

enum phase { PUBLISH, FIRST_READ, WARM_READ, PHASES };
enum store { ARTFS, RAW, STORES };

static const char *const phase_names[PHASES] = { "publish", "first read", "warm re-read" };
static const char *const store_names[STORES] = { "artfs", "raw" };

/* One round's data: every byte prepared before the clock starts. */
struct object {
	uint8_t hash[HASH_BYTES];
	char key[ARTFS_KEY_LEN + 1];
	uint8_t *envelope; /* from envelope_encode */
	size_t envelope_len;
	const uint8_t *payload; /* inside envelope */
	char *artfs_path;
	char *raw_path;
	char *raw_tmp;
};

struct bench {
	const char *mnt;
	const char *raw;
	char artfs_dir[PATH_MAX];
	char raw_dir[PATH_MAX];
	size_t n;
	unsigned rounds;
	bool keep;
	struct object *obj;
	uint8_t npy_head[NPY_HEADER_MAX];
	size_t npy_head_len;
	size_t npy_len;
	size_t envelope_len; /* the same for every object of this shape */
	/* Read buffers: one slot per object, touched before timing, so that the
	 * artfs bytes can be compared after the timed loop. */
	uint8_t *slots;
	size_t slot_cap;
	size_t *got; /* bytes read per object; SIZE_MAX when the slot overflowed */
	uint64_t rng;
	unsigned long tmp_seq;
	/* ns[round][phase][store] */
	double (*ns)[PHASES][STORES];
};

/* Reads until EOF into buf; returns the byte count, SIZE_MAX if the file is
 * longer than cap, and dies on an error. */
static size_t read_all(int fd, uint8_t *buf, size_t cap, const char *path)
{
	size_t len;
	int rc = bench_read_all(fd, buf, cap, true, &len);

	if (rc < 0)
		bench_die("read %s: %s", path, strerror(-rc));
	return rc ? SIZE_MAX : len;
}

/* Hashes, payloads and envelopes of one round; nothing here is timed. */
static void prepare_round(struct bench *b)
{
	struct envelope env;
	uint8_t payload[PAYLOAD_LEN];
	char hex[HASH_HEX + 1];

	memset(&env, 0, sizeof(env));
	bench_u1_array(&env.array, SHAPE0, SHAPE1, SHAPE2);
	env.kind = ENVELOPE_BLOCK;
	env.source_token_start = 0;

	for (size_t i = 0; i < b->n; i++) {
		struct object *o = &b->obj[i];

		bench_rng_fill(&b->rng, o->hash, HASH_BYTES);
		bench_rng_fill(&b->rng, payload, PAYLOAD_LEN);
		key_hex(o->hash, HASH_BYTES, hex);
		key_derive(WV, o->hash, HASH_BYTES, o->key);
		memcpy(env.key, o->key, sizeof(env.key));
		sha256_once(payload, PAYLOAD_LEN, env.payload_sha256);
		int rc = envelope_encode(&env, payload, PAYLOAD_LEN, &o->envelope, &o->envelope_len);
		if (rc < 0)
			bench_die("envelope_encode: %s", strerror(-rc));
		o->payload = o->envelope + o->envelope_len - PAYLOAD_LEN;
		b->envelope_len = o->envelope_len;
		o->artfs_path = bench_xprintf("%s/%s", b->artfs_dir, hex);
		o->raw_path = bench_xprintf("%s/%s", b->raw_dir, hex);
		o->raw_tmp = bench_xprintf("%s/.tmp-%ld-%lu", b->raw_dir, (long)getpid(),
					   b->tmp_seq++);
	}
}

static void release_round(struct bench *b)
{
	for (size_t i = 0; i < b->n; i++) {
		struct object *o = &b->obj[i];
		free(o->envelope);
		free(o->artfs_path);
		free(o->raw_path);
		free(o->raw_tmp);
		memset(o, 0, sizeof(*o));
	}
}

static uint64_t publish_artfs(struct bench *b)
{
	uint64_t t0 = bench_now_ns();

	for (size_t i = 0; i < b->n; i++) {
		struct object *o = &b->obj[i];
		bench_write_file("artfs", o->artfs_path, o->envelope, o->envelope_len, true);
	}
	return bench_now_ns() - t0;
}

static uint64_t publish_raw(struct bench *b)
{
	uint64_t t0 = bench_now_ns();

	for (size_t i = 0; i < b->n; i++) {
		struct object *o = &b->obj[i];
		int fd = open(o->raw_tmp, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
		if (fd < 0)
			bench_die("raw open %s: %s", o->raw_tmp, strerror(errno));
		int rc = bench_write_all(fd, o->envelope, o->envelope_len);
		if (rc < 0)
			bench_die("raw write %s: %s", o->raw_tmp, strerror(-rc));
		if (close(fd) != 0)
			bench_die("raw close %s: %s", o->raw_tmp, strerror(errno));
		if (link(o->raw_tmp, o->raw_path) < 0 && errno != EEXIST)
			bench_die("raw link %s: %s", o->raw_path, strerror(errno));
		if (unlink(o->raw_tmp) < 0)
			bench_die("raw unlink %s: %s", o->raw_tmp, strerror(errno));
	}
	return bench_now_ns() - t0;
}

static uint64_t read_artfs(struct bench *b)
{
	uint64_t t0 = bench_now_ns();

	for (size_t i = 0; i < b->n; i++) {
		struct object *o = &b->obj[i];
		int fd = open(o->artfs_path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			bench_die("artfs open %s: %s", o->artfs_path, strerror(errno));
		b->got[i] = read_all(fd, b->slots + i * b->slot_cap, b->slot_cap, o->artfs_path);
		close(fd);
	}
	return bench_now_ns() - t0;
}

/* After the timed loop: every artfs read must be numpy.save of the payload. */
static void check_artfs(const struct bench *b, const char *phase)
{
	for (size_t i = 0; i < b->n; i++) {
		const struct object *o = &b->obj[i];
		const uint8_t *s = b->slots + i * b->slot_cap;

		if (b->got[i] == SIZE_MAX)
			bench_die("artfs %s %s: more than %zu bytes, expected %zu", phase,
				  o->artfs_path, b->slot_cap, b->npy_len);
		if (b->got[i] != b->npy_len)
			bench_die("artfs %s %s: read %zu bytes, expected %zu", phase, o->artfs_path,
				  b->got[i], b->npy_len);
		if (memcmp(s, b->npy_head, b->npy_head_len) != 0)
			bench_die("artfs %s %s: .npy header differs from numpy.save's", phase,
				  o->artfs_path);
		if (memcmp(s + b->npy_head_len, o->payload, PAYLOAD_LEN) != 0)
			bench_die("artfs %s %s: array bytes differ from the published payload",
				  phase, o->artfs_path);
	}
}

/* The raw reader's work, all timed: read, parse, identity, checksum. */
static uint64_t read_raw(struct bench *b)
{
	struct envelope env;
	uint64_t t0 = bench_now_ns();

	for (size_t i = 0; i < b->n; i++) {
		struct object *o = &b->obj[i];
		uint8_t *s = b->slots + i * b->slot_cap;
		int fd = open(o->raw_path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			bench_die("raw open %s: %s", o->raw_path, strerror(errno));
		size_t len = read_all(fd, s, b->slot_cap, o->raw_path);
		close(fd);
		if (len == SIZE_MAX)
			bench_die("raw %s: longer than %zu bytes", o->raw_path, b->slot_cap);
		bench_check_raw_envelope(o->raw_path, s, len, WV, o->hash, HASH_BYTES, &env);
		b->got[i] = len;
	}
	return bench_now_ns() - t0;
}

/* Guards against a reader that was fast because it read nothing. */
static void check_raw(const struct bench *b, const char *phase)
{
	for (size_t i = 0; i < b->n; i++) {
		const struct object *o = &b->obj[i];
		if (b->got[i] != o->envelope_len ||
		    memcmp(b->slots + i * b->slot_cap, o->envelope, o->envelope_len) != 0)
			bench_die("raw %s %s: bytes differ from the published envelope", phase,
				  o->raw_path);
	}
}

static void remove_objects(const struct bench *b)
{
	for (size_t i = 0; i < b->n; i++) {
		const struct object *o = &b->obj[i];
		if (unlink(o->artfs_path) < 0)
			bench_die("unlink %s: %s", o->artfs_path, strerror(errno));
		if (unlink(o->raw_path) < 0)
			bench_die("unlink %s: %s", o->raw_path, strerror(errno));
	}
}

static double rate(const struct bench *b, double ns)
{
	return ns > 0 ? (double)b->n * 1e9 / ns : 0.0;
}

static double us_per_obj(const struct bench *b, double ns)
{
	return ns / 1e3 / (double)b->n;
}

static uint64_t timed(struct bench *b, enum phase p, enum store s)
{
	if (p == PUBLISH)
		return s == ARTFS ? publish_artfs(b) : publish_raw(b);
	return s == ARTFS ? read_artfs(b) : read_raw(b);
}

static void run_round(struct bench *b, unsigned r)
{
	/* Alternate which store goes first so neither always runs second. */
	enum store first = r % 2 ? RAW : ARTFS;

	prepare_round(b);
	printf("round %u/%u (%s first)\n", r + 1, b->rounds, store_names[first]);
	for (int p = 0; p < PHASES; p++) {
		for (int k = 0; k < STORES; k++) {
			enum store s = k == 0 ? first : (enum store)(1 - first);
			b->ns[r][p][s] = (double)timed(b, (enum phase)p, s);
			if (p != PUBLISH) {
				if (s == ARTFS)
					check_artfs(b, phase_names[p]);
				else
					check_raw(b, phase_names[p]);
			}
		}
		double a = b->ns[r][p][ARTFS], w = b->ns[r][p][RAW];
		printf("  %-13s artfs %10.0f obj/s %8.2f us   raw %10.0f obj/s %8.2f us   "
		       "ratio %.3f\n",
		       phase_names[p], rate(b, a), us_per_obj(b, a), rate(b, w), us_per_obj(b, w),
		       a > 0 ? w / a : 0.0);
	}
	fflush(stdout);
	if (!(b->keep && r + 1 == b->rounds))
		remove_objects(b);
	release_round(b);
}

static void report(const struct bench *b)
{
	unsigned n = b->rounds;
	double *v = bench_xmalloc(n * sizeof(*v));

	printf("\nN = %zu objects of shape (%d, %d, %d) |u1 (%zu payload bytes, %zu-byte "
	       "envelope, %zu-byte .npy), %u round%s\n",
	       b->n, SHAPE0, SHAPE1, SHAPE2, PAYLOAD_LEN, b->envelope_len,
	       b->npy_len, n, n == 1 ? "" : "s");
	printf("obj/s: median over rounds; us/obj: mean over all rounds; ratio = artfs obj/s "
	       "/ raw obj/s within a round (> 1: artfs faster)\n\n");
	printf("%-14s %12s %12s %10s %10s %10s %10s\n", "phase", "artfs obj/s", "raw obj/s",
	       "artfs us", "raw us", "ratio med", "ratio best");
	for (int p = 0; p < PHASES; p++) {
		double med[STORES], mean_us[STORES];
		for (int s = 0; s < STORES; s++) {
			double sum = 0;
			for (unsigned r = 0; r < n; r++) {
				v[r] = rate(b, b->ns[r][p][s]);
				sum += b->ns[r][p][s];
			}
			med[s] = bench_median(v, n);
			mean_us[s] = sum / 1e3 / ((double)b->n * n);
		}
		double best = 0;
		for (unsigned r = 0; r < n; r++) {
			v[r] = b->ns[r][p][ARTFS] > 0 ? b->ns[r][p][RAW] / b->ns[r][p][ARTFS] : 0;
			if (v[r] > best)
				best = v[r];
		}
		printf("%-14s %12.0f %12.0f %10.2f %10.2f %10.3f %10.3f\n", phase_names[p],
		       med[ARTFS], med[RAW], mean_us[ARTFS], mean_us[RAW], bench_median(v, n),
		       best);
	}
	free(v);
}

static void usage(void)
{
	fprintf(stderr,
		"usage: r3_bench [--keep] <mountpoint> <raw_dir> [N] [rounds]\n"
		"  mountpoint  a mounted artfs; objects go to <mountpoint>/%s\n"
		"  raw_dir     a plain directory (tmpfs, e.g. /dev/shm/raw-bench); objects go to "
		"<raw_dir>/%s\n"
		"  N           objects per round (default 20000)\n"
		"  rounds      rounds, fresh objects each (default 3)\n"
		"  --keep      leave the last round's objects and the %s directories in place\n",
		WV, WV, WV);
	exit(2);
}

int main(int argc, char **argv)
{
	struct bench b;
	struct bench_mount_args args = { .count = 20000, .rounds = 3 };

	bench_progname = "r3_bench";
	if (!bench_parse_mount_args(argc, argv, 10000000, 1000, &args))
		usage();
	memset(&b, 0, sizeof(b));
	b.mnt = args.mnt;
	b.raw = args.raw;
	b.n = args.count;
	b.rounds = (unsigned)args.rounds;
	b.keep = args.keep;
	b.rng = SEED;
	/* A plain directory would "work" until the first .npy check. */
	bench_require_fuse_mount(b.mnt);
	if ((size_t)snprintf(b.artfs_dir, sizeof(b.artfs_dir), "%s/%s", b.mnt, WV) >=
		    sizeof(b.artfs_dir) ||
	    (size_t)snprintf(b.raw_dir, sizeof(b.raw_dir), "%s/%s", b.raw, WV) >=
		    sizeof(b.raw_dir))
		bench_die("path too long");

	/* The .npy every artfs read must return, as numpy.save writes it. */
	struct array_desc a;
	bench_u1_array(&a, SHAPE0, SHAPE1, SHAPE2);
	ssize_t h = npy_header(&a, b.npy_head, sizeof(b.npy_head));
	if (h < 0)
		bench_die("npy_header: %s", strerror((int)-h));
	b.npy_head_len = (size_t)h;
	b.npy_len = b.npy_head_len + PAYLOAD_LEN;

	b.obj = bench_xmalloc(b.n * sizeof(*b.obj));
	memset(b.obj, 0, b.n * sizeof(*b.obj));
	b.ns = bench_xmalloc(b.rounds * sizeof(*b.ns));
	b.got = bench_xmalloc(b.n * sizeof(*b.got));
	/* Room for the larger of envelope and .npy, plus slack, 64-byte aligned. */
	b.slot_cap = (ENVELOPE_HEADER_BYTES_MAX + PAYLOAD_LEN + NPY_HEADER_MAX + 63) & ~(size_t)63;
	b.slots = bench_xmalloc(b.n * b.slot_cap);
	memset(b.slots, 0, b.n * b.slot_cap); /* fault the pages in before timing */

	/* Leftovers of an earlier run: objects, temporaries, the directories. */
	if (mkdir(b.raw, 0755) < 0 && errno != EEXIST)
		bench_die("mkdir %s: %s", b.raw, strerror(errno));
	bench_remove_dir(b.artfs_dir);
	bench_remove_dir(b.raw_dir);
	bench_make_dir(b.artfs_dir);
	bench_make_dir(b.raw_dir);

	printf("r3_bench: artfs %s vs raw %s, N=%zu, rounds=%u\n", b.artfs_dir, b.raw_dir, b.n,
	       b.rounds);
	for (unsigned r = 0; r < b.rounds; r++)
		run_round(&b, r);
	report(&b);

	if (!b.keep) {
		bench_remove_dir(b.artfs_dir);
		bench_remove_dir(b.raw_dir);
	}
	free(b.slots);
	free(b.got);
	free(b.ns);
	free(b.obj);
	return 0;
}
