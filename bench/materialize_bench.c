/* SPDX-License-Identifier: Apache-2.0 */
/* materialize_bench: one request's R3 array through <wv>/.materialize against
 * what a client without artfs does in-process (vLLM's artifact connector):
 * read every object of the request from a raw tmpfs store, validate it and
 * concatenate the payloads.
 *
 *   materialize_bench [--keep] <mountpoint> <raw_dir> [blocks] [rounds]
 *
 * Setup (not timed): `blocks` objects of one request, shape (16, 61, 8) |u1,
 * the last a tail of 7 rows, source_token_start = 16 * i, published through
 * the mount into <mnt>/mbench and written as plain files into <raw_dir>/mbench.
 *
 * Timed, per round, both sides ending with the same .npy bytes in memory:
 *   artfs  open <mnt>/mbench/.materialize O_RDWR, write the request text,
 *          pread from offset 0 until EOF, close
 *   raw    per hash: open, read whole, close, envelope_parse, key check,
 *          payload sha256 check, layout check (contiguous starts, rows,
 *          kind, dtype, shape[1:]); copy the payload after an npy_header of
 *          the whole shape
 * Which side goes first alternates by round; one untimed warm-up of each
 * comes first. After each round both results are compared with the
 * expected bytes (any difference aborts). The ratio raw/artfs of one round
 * compares the two under the same machine load; its median is the number
 * to quote. */
#include "autoconf.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
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

#define WV "mbench"
#define HASH_BYTES 32
#define HASH_HEX (2 * HASH_BYTES)
#define BLOCK_ROWS 16
#define TAIL_ROWS 7
#define LAYERS 61
#define TOP_K 8
#define ROW_BYTES ((size_t)LAYERS * TOP_K) /* |u1 */
#define SEED 0x6d62656e63680001ull          /* fixed: same data every run */

enum side { ARTFS, RAW, SIDES };

static const char *const side_names[SIDES] = { "artfs", "raw" };

struct object {
	uint8_t hash[HASH_BYTES];
	char hex[HASH_HEX + 1];
	uint8_t *envelope;
	size_t envelope_len;
	char *raw_path;
};

struct bench {
	const char *mnt;
	const char *raw;
	char artfs_dir[PATH_MAX];
	char raw_dir[PATH_MAX];
	char mat_path[PATH_MAX];
	size_t n;            /* objects in the request */
	unsigned rounds;
	bool keep;
	bool made_raw;       /* we created raw, so we remove it */
	struct object *obj;
	uint64_t token_end;
	char *request;       /* the request text */
	size_t request_len;
	uint8_t *expect;     /* the .npy both sides must produce */
	size_t expect_len;
	size_t npy_head_len;
	uint8_t *out[SIDES]; /* result buffers, pre-faulted */
	size_t out_cap;
	size_t got[SIDES];
	uint8_t *scratch;    /* one raw envelope at a time */
	size_t scratch_cap;
	double (*ns)[SIDES]; /* ns[round][side] */
};

/* ---- setup (not timed) ------------------------------------------------------ */

static size_t rows_of(const struct bench *b, size_t i)
{
	return i + 1 == b->n ? TAIL_ROWS : BLOCK_ROWS;
}

/* Hashes, payloads, envelopes, the request text and the expected .npy. */
static void prepare(struct bench *b)
{
	uint64_t rng = SEED;
	struct envelope env;
	uint8_t payload[BLOCK_ROWS * ROW_BYTES];
	char key[ARTFS_KEY_LEN + 1];
	struct array_desc whole;

	b->token_end = (uint64_t)BLOCK_ROWS * (b->n - 1) + TAIL_ROWS;
	bench_u1_array(&whole, b->token_end, LAYERS, TOP_K);
	uint8_t head[NPY_HEADER_MAX];
	ssize_t h = npy_header(&whole, head, sizeof(head));
	if (h < 0)
		bench_die("npy_header: %s", strerror((int)-h));
	b->npy_head_len = (size_t)h;
	b->expect_len = (size_t)h + (size_t)b->token_end * ROW_BYTES;
	b->expect = bench_xmalloc(b->expect_len);
	memcpy(b->expect, head, (size_t)h);

	/* The request: token_end, then one hash per line. A request of one
	 * object (a lone tail) needs block_size, or its 7 rows would be the
	 * block size and the tail would have to be a block. */
	size_t cap = 64 + b->n * (HASH_HEX + 1);
	b->request = bench_xmalloc(cap);
	int w = snprintf(b->request, cap, "token_end %" PRIu64 "\n", b->token_end);
	if (b->n == 1)
		w += snprintf(b->request + w, cap - (size_t)w, "block_size %d\n", BLOCK_ROWS);
	b->request_len = (size_t)w;

	memset(&env, 0, sizeof(env));
	bench_u1_array(&env.array, 0, LAYERS, TOP_K); /* rows: per object, below */
	size_t at = (size_t)h;
	for (size_t i = 0; i < b->n; i++) {
		struct object *o = &b->obj[i];
		size_t rows = rows_of(b, i), len = rows * ROW_BYTES;

		bench_rng_fill(&rng, o->hash, HASH_BYTES);
		bench_rng_fill(&rng, payload, len);
		key_hex(o->hash, HASH_BYTES, o->hex);
		key_derive(WV, o->hash, HASH_BYTES, key);
		memcpy(env.key, key, sizeof(env.key));
		env.kind = rows == BLOCK_ROWS ? ENVELOPE_BLOCK : ENVELOPE_TAIL;
		env.array.shape[0] = rows;
		env.source_token_start = (uint64_t)BLOCK_ROWS * i;
		sha256_once(payload, len, env.payload_sha256);
		int rc = envelope_encode(&env, payload, len, &o->envelope, &o->envelope_len);
		if (rc < 0)
			bench_die("envelope_encode: %s", strerror(-rc));
		if (o->envelope_len > b->scratch_cap)
			b->scratch_cap = o->envelope_len;
		memcpy(b->expect + at, payload, len);
		at += len;
		memcpy(b->request + b->request_len, o->hex, HASH_HEX);
		b->request[b->request_len + HASH_HEX] = '\n';
		b->request_len += HASH_HEX + 1;
		o->raw_path = bench_xprintf("%s/%s", b->raw_dir, o->hex);
	}
}

static void publish(struct bench *b)
{
	for (size_t i = 0; i < b->n; i++) {
		struct object *o = &b->obj[i];
		char *path = bench_xprintf("%s/%s", b->artfs_dir, o->hex);
		bench_write_file("artfs", path, o->envelope, o->envelope_len, true);
		free(path);
		bench_write_file("raw", o->raw_path, o->envelope, o->envelope_len, false);
	}
}

/* ---- the two timed sides ------------------------------------------------------ */

static uint64_t run_artfs(struct bench *b)
{
	uint8_t *out = b->out[ARTFS];
	size_t off = 0;
	uint64_t t0 = bench_now_ns();

	int fd = open(b->mat_path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		bench_die("open %s: %s", b->mat_path, strerror(errno));
	int rc = bench_write_all(fd, b->request, b->request_len);
	if (rc < 0)
		bench_die("write %s: %s", b->mat_path, strerror(-rc));
	for (;;) {
		if (off == b->out_cap)
			bench_die("%s: more than %zu bytes, expected %zu", b->mat_path, b->out_cap,
				  b->expect_len);
		ssize_t r = pread(fd, out + off, b->out_cap - off, (off_t)off);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			bench_die("read %s: %s", b->mat_path, strerror(errno));
		}
		if (r == 0)
			break;
		off += (size_t)r;
	}
	if (close(fd) != 0)
		bench_die("close %s: %s", b->mat_path, strerror(errno));
	uint64_t t = bench_now_ns() - t0;
	b->got[ARTFS] = off;
	return t;
}

/* Reads one raw file whole into the scratch buffer; returns its length. */
static size_t read_raw_file(struct bench *b, const char *path)
{
	size_t off;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		bench_die("raw open %s: %s", path, strerror(errno));
	int rc = bench_read_all(fd, b->scratch, b->scratch_cap, true, &off);
	if (rc < 0 && off < b->scratch_cap)
		bench_die("raw read %s: %s", path, strerror(-rc));
	if (rc != 0) /* also a failed read of the byte past scratch_cap */
		bench_die("raw %s: longer than %zu bytes", path, b->scratch_cap);
	close(fd);
	return off;
}

/* What a connector does without artfs: every check artfs makes, in-process. */
static uint64_t run_raw(struct bench *b)
{
	struct envelope env, first;
	uint8_t *out = b->out[RAW];
	size_t at = 0;
	uint64_t start = 0;
	const uint64_t block_size = BLOCK_ROWS; /* the rows of a full block */
	uint64_t t0 = bench_now_ns();

	memset(&first, 0, sizeof(first));
	for (size_t i = 0; i < b->n; i++) {
		const struct object *o = &b->obj[i];
		size_t len = read_raw_file(b, o->raw_path);
		const uint8_t *s = b->scratch;

		bench_check_raw_envelope(o->raw_path, s, len, WV, o->hash, HASH_BYTES, &env);
		const uint8_t *payload = s + len - env.payload_len;

		/* Layout, as §3.4 and vLLM's connector check it. */
		uint64_t rows = env.array.shape[0];
		uint64_t rest = b->token_end - start;
		uint64_t rows_want = rest < block_size ? rest : block_size;
		if (i == 0)
			first = env;
		if (env.source_token_start != start)
			bench_die("raw object %zu starts at %" PRIu64 ", expected %" PRIu64, i,
				  env.source_token_start, start);
		if (start >= b->token_end || rows != rows_want)
			bench_die("raw object %zu has %" PRIu64 " rows, expected %" PRIu64, i, rows,
				  rows_want);
		if (env.kind != (rows == block_size ? ENVELOPE_BLOCK : ENVELOPE_TAIL))
			bench_die("raw object %zu is a %s", i, envelope_kind_name(env.kind));
		if (memcmp(env.array.dtype, first.array.dtype, sizeof(env.array.dtype)) != 0 ||
		    env.array.ndim != first.array.ndim ||
		    memcmp(env.array.shape + 1, first.array.shape + 1,
			   (size_t)(env.array.ndim - 1) * sizeof(env.array.shape[0])) != 0)
			bench_die("raw object %zu: dtype or shape[1:] differ from object 0", i);
		if (b->npy_head_len + at + env.payload_len > b->out_cap)
			bench_die("raw: the concatenation outgrows its buffer");
		memcpy(out + b->npy_head_len + at, payload, env.payload_len);
		at += env.payload_len;
		start += rows;
	}
	if (start != b->token_end)
		bench_die("raw: objects hold %" PRIu64 " rows, token_end is %" PRIu64, start,
			  b->token_end);

	/* The header of the whole shape, in front of the rows. */
	struct array_desc whole = first.array;
	whole.shape[0] = start;
	uint8_t head[NPY_HEADER_MAX];
	ssize_t h = npy_header(&whole, head, sizeof(head));
	if (h < 0 || (size_t)h != b->npy_head_len)
		bench_die("raw: npy_header of the whole shape: %zd bytes, expected %zu", h,
			  b->npy_head_len);
	memcpy(out, head, (size_t)h);
	uint64_t t = bench_now_ns() - t0;
	b->got[RAW] = b->npy_head_len + at;
	return t;
}

static uint64_t run_side(struct bench *b, enum side s)
{
	/* A stale buffer must not pass the comparison: clear it, untimed. */
	memset(b->out[s], 0, b->out_cap);
	b->got[s] = 0;
	return s == ARTFS ? run_artfs(b) : run_raw(b);
}

static void check(const struct bench *b, const char *when)
{
	for (int s = 0; s < SIDES; s++) {
		if (b->got[s] != b->expect_len)
			bench_die("%s: %s produced %zu bytes, expected %zu", when, side_names[s],
				  b->got[s], b->expect_len);
		if (memcmp(b->out[s], b->expect, b->npy_head_len) != 0)
			bench_die("%s: %s: .npy header differs from numpy.save's", when,
				  side_names[s]);
		if (memcmp(b->out[s], b->expect, b->expect_len) != 0)
			bench_die("%s: %s: array bytes differ from the published payloads", when,
				  side_names[s]);
	}
	/* implied above; said anyway */
	if (memcmp(b->out[ARTFS], b->out[RAW], b->expect_len) != 0)
		bench_die("%s: artfs and raw results differ", when);
}

/* ---- report --------------------------------------------------------------------- */

static void report(const struct bench *b)
{
	unsigned n = b->rounds;
	double *v = bench_xmalloc(n * sizeof(*v));
	double med[SIDES], best_t[SIDES];

	for (int s = 0; s < SIDES; s++) {
		best_t[s] = 0;
		for (unsigned r = 0; r < n; r++) {
			v[r] = b->ns[r][s];
			if (r == 0 || v[r] < best_t[s])
				best_t[s] = v[r];
		}
		med[s] = bench_median(v, n);
	}
	double best = 0;
	for (unsigned r = 0; r < n; r++) {
		v[r] = b->ns[r][RAW] / b->ns[r][ARTFS];
		if (v[r] > best)
			best = v[r];
	}
	double ratio_med = bench_median(v, n);
	double mb = (double)b->expect_len / 1e6;

	printf("\nrequest: %zu objects (%zu blocks of (%d, %d, %d) + 1 tail of %d rows) |u1, "
	       "token_end %" PRIu64 ", %zu-byte request text, %.2f MB .npy; %u round%s\n",
	       b->n, b->n - 1, BLOCK_ROWS, LAYERS, TOP_K, TAIL_ROWS, b->token_end,
	       b->request_len, mb, n, n == 1 ? "" : "s");
	printf("time: median and best over rounds; MB/s: .npy bytes (1 MB = 1e6 B) / median "
	       "time; ratio = raw time / artfs time within a round (> 1: artfs faster)\n\n");
	printf("%-6s %12s %12s %10s %12s\n", "side", "median ms", "best ms", "MB/s", "us/object");
	for (int s = 0; s < SIDES; s++)
		printf("%-6s %12.2f %12.2f %10.1f %12.2f\n", side_names[s], med[s] / 1e6,
		       best_t[s] / 1e6, mb / (med[s] / 1e9), med[s] / 1e3 / (double)b->n);
	printf("\nratio raw/artfs: median %.3f, best %.3f\n", ratio_med, best);
	free(v);
}

static void usage(void)
{
	fprintf(stderr,
		"usage: materialize_bench [--keep] <mountpoint> <raw_dir> [blocks] [rounds]\n"
		"  mountpoint  a mounted artfs; objects go to <mountpoint>/%s\n"
		"  raw_dir     a plain directory (tmpfs, e.g. /dev/shm/raw-mb); objects go to "
		"<raw_dir>/%s\n"
		"  blocks      objects in the request, the last a tail (default 2048)\n"
		"  rounds      timed rounds (default 5)\n"
		"  --keep      leave the objects and the %s directories in place\n",
		WV, WV, WV);
	exit(2);
}

int main(int argc, char **argv)
{
	struct bench b;
	struct bench_mount_args args = { .count = 2048, .rounds = 5 };

	bench_progname = "materialize_bench";
	/* The daemon takes at most MATERIALIZE_BLOCKS_MAX (1 << 20) hashes. */
	if (!bench_parse_mount_args(argc, argv, 1u << 20, 1000, &args))
		usage();
	memset(&b, 0, sizeof(b));
	b.mnt = args.mnt;
	b.raw = args.raw;
	b.n = args.count;
	b.rounds = (unsigned)args.rounds;
	b.keep = args.keep;
	bench_require_fuse_mount(b.mnt);
	if ((size_t)snprintf(b.artfs_dir, sizeof(b.artfs_dir), "%s/%s", b.mnt, WV) >=
		    sizeof(b.artfs_dir) ||
	    (size_t)snprintf(b.raw_dir, sizeof(b.raw_dir), "%s/%s", b.raw, WV) >=
		    sizeof(b.raw_dir) ||
	    (size_t)snprintf(b.mat_path, sizeof(b.mat_path), "%s/%s", b.artfs_dir,
			     ARTFS_MATERIALIZE_NAME) >= sizeof(b.mat_path))
		bench_die("path too long");

	b.obj = bench_xmalloc(b.n * sizeof(*b.obj));
	memset(b.obj, 0, b.n * sizeof(*b.obj));
	b.ns = bench_xmalloc(b.rounds * sizeof(*b.ns));
	prepare(&b);
	/* Result buffers with room for a page more than expected, so that a
	 * longer answer is seen; pre-faulted, like the scratch buffer. */
	b.out_cap = b.expect_len + 4096;
	for (int s = 0; s < SIDES; s++) {
		b.out[s] = bench_xmalloc(b.out_cap);
		memset(b.out[s], 0, b.out_cap);
	}
	b.scratch = bench_xmalloc(b.scratch_cap);
	memset(b.scratch, 0, b.scratch_cap);

	/* Leftovers of an earlier run, then the objects (not timed). */
	if (mkdir(b.raw, 0755) == 0)
		b.made_raw = true;
	else if (errno != EEXIST)
		bench_die("mkdir %s: %s", b.raw, strerror(errno));
	bench_remove_dir(b.artfs_dir);
	bench_remove_dir(b.raw_dir);
	bench_make_dir(b.artfs_dir);
	bench_make_dir(b.raw_dir);
	printf("materialize_bench: artfs %s vs raw %s, %zu objects, %u rounds\n", b.mat_path,
	       b.raw_dir, b.n, b.rounds);
	uint64_t t0 = bench_now_ns();
	publish(&b);
	printf("published %zu objects to both stores in %.2f s (setup, not a result)\n", b.n,
	       (double)(bench_now_ns() - t0) / 1e9);

	/* Warm-up: the first materialize reads and verifies every object in the
	 * daemon; the first raw pass warms the dentry cache and the code. */
	for (int s = 0; s < SIDES; s++) {
		uint64_t t = run_side(&b, (enum side)s);
		printf("warm-up %-5s %10.2f ms (not counted)\n", side_names[s], (double)t / 1e6);
	}
	check(&b, "warm-up");

	printf("\n%-6s %-6s %12s %12s %10s\n", "round", "first", "artfs ms", "raw ms",
	       "raw/artfs");
	for (unsigned r = 0; r < b.rounds; r++) {
		enum side first = r % 2 ? RAW : ARTFS;
		for (int k = 0; k < SIDES; k++) {
			enum side s = k == 0 ? first : (enum side)(1 - first);
			b.ns[r][s] = (double)run_side(&b, s);
		}
		check(&b, "round");
		printf("%-6u %-6s %12.2f %12.2f %10.3f\n", r + 1, side_names[first],
		       b.ns[r][ARTFS] / 1e6, b.ns[r][RAW] / 1e6, b.ns[r][RAW] / b.ns[r][ARTFS]);
		fflush(stdout);
	}
	printf("both results byte-identical to the expected .npy (%zu bytes) in every round\n",
	       b.expect_len);
	report(&b);

	if (!b.keep) {
		for (size_t i = 0; i < b.n; i++) {
			char *path = bench_xprintf("%s/%s", b.artfs_dir, b.obj[i].hex);
			if (unlink(path) < 0)
				bench_die("unlink %s: %s", path, strerror(errno));
			free(path);
			if (unlink(b.obj[i].raw_path) < 0)
				bench_die("unlink %s: %s", b.obj[i].raw_path, strerror(errno));
		}
		bench_remove_dir(b.artfs_dir);
		bench_remove_dir(b.raw_dir);
		if (b.made_raw && rmdir(b.raw) < 0)
			fprintf(stderr, "materialize_bench: rmdir %s: %s (left in place)\n", b.raw,
				strerror(errno));
	}
	for (size_t i = 0; i < b.n; i++) {
		free(b.obj[i].envelope);
		free(b.obj[i].raw_path);
	}
	free(b.obj);
	free(b.ns);
	free(b.request);
	free(b.expect);
	free(b.scratch);
	for (int s = 0; s < SIDES; s++)
		free(b.out[s]);
	return 0;
}
