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

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "array.h"
#include "envelope.h"
#include "key.h"
#include "npy.h"
#include "sha256.h"

#define WV "bench"
#define HASH_BYTES 32
#define HASH_HEX (2 * HASH_BYTES)
#define SHAPE0 16
#define SHAPE1 48
#define SHAPE2 8
#define PAYLOAD_LEN ((size_t)SHAPE0 * SHAPE1 * SHAPE2) /* |u1 */
#define SEED 0x5233626e63680001ull                     /* fixed: same data every run */
#define FUSE_SUPER_MAGIC 0x65735546

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

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

static void die(const char *fmt, ...)
{
	va_list ap;

	fflush(stdout);
	fputs("r3_bench: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

static void *xmalloc(size_t len)
{
	void *p = malloc(len ? len : 1);

	if (!p)
		die("out of memory (%zu bytes)", len);
	return p;
}

static char *xprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static char *xprintf(const char *fmt, ...)
{
	va_list ap;
	char *s;

	va_start(ap, fmt);
	int rc = vasprintf(&s, fmt, ap);
	va_end(ap);
	if (rc < 0)
		die("out of memory");
	return s;
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* splitmix64: deterministic, and enough for names and payload bytes. */
static uint64_t rng_next(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static void rng_fill(uint64_t *s, uint8_t *buf, size_t len)
{
	while (len) {
		uint64_t v = rng_next(s);
		size_t k = len < 8 ? len : 8;
		memcpy(buf, &v, k);
		buf += k;
		len -= k;
	}
}

static int write_all(int fd, const uint8_t *buf, size_t len)
{
	while (len) {
		ssize_t w = write(fd, buf, len);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (w == 0)
			return -EIO;
		buf += w;
		len -= (size_t)w;
	}
	return 0;
}

/* Reads until EOF into buf; returns the byte count, SIZE_MAX if the file is
 * longer than cap, and dies on an error. */
static size_t read_all(int fd, uint8_t *buf, size_t cap, const char *path)
{
	size_t off = 0;

	for (;;) {
		if (off == cap) {
			uint8_t extra;
			ssize_t r = read(fd, &extra, 1);
			if (r < 0 && errno == EINTR)
				continue;
			if (r < 0)
				die("read %s: %s", path, strerror(errno));
			return r == 0 ? off : SIZE_MAX;
		}
		ssize_t r = read(fd, buf + off, cap - off);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			die("read %s: %s", path, strerror(errno));
		}
		if (r == 0)
			return off;
		off += (size_t)r;
	}
}

/* Removes every entry of dir (a flat directory of objects), then dir itself. */
static void remove_dir(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;

	if (!d) {
		if (errno == ENOENT)
			return;
		die("opendir %s: %s", dir, strerror(errno));
	}
	while ((errno = 0, e = readdir(d)) != NULL) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		if (unlinkat(dirfd(d), e->d_name, 0) < 0 && errno != ENOENT &&
		    e->d_name[0] != '.') /* artfs lists its special files; rmdir tells */
			die("unlink %s/%s: %s", dir, e->d_name, strerror(errno));
	}
	if (errno)
		die("readdir %s: %s", dir, strerror(errno));
	closedir(d);
	if (rmdir(dir) < 0 && errno != ENOENT)
		die("rmdir %s: %s", dir, strerror(errno));
}

static void make_dir(const char *dir)
{
	if (mkdir(dir, 0755) < 0)
		die("mkdir %s: %s", dir, strerror(errno));
}

/* Hashes, payloads and envelopes of one round; nothing here is timed. */
static void prepare_round(struct bench *b)
{
	struct envelope env;
	uint8_t payload[PAYLOAD_LEN];
	char hex[HASH_HEX + 1];

	memset(&env, 0, sizeof(env));
	if (array_dtype_set(&env.array, "|u1") < 0)
		die("array_dtype_set(|u1) failed");
	env.array.ndim = 3;
	env.array.shape[0] = SHAPE0;
	env.array.shape[1] = SHAPE1;
	env.array.shape[2] = SHAPE2;
	env.kind = ENVELOPE_BLOCK;
	env.source_token_start = 0;

	for (size_t i = 0; i < b->n; i++) {
		struct object *o = &b->obj[i];

		rng_fill(&b->rng, o->hash, HASH_BYTES);
		rng_fill(&b->rng, payload, PAYLOAD_LEN);
		key_hex(o->hash, HASH_BYTES, hex);
		key_derive(WV, o->hash, HASH_BYTES, o->key);
		memcpy(env.key, o->key, sizeof(env.key));
		sha256_once(payload, PAYLOAD_LEN, env.payload_sha256);
		int rc = envelope_encode(&env, payload, PAYLOAD_LEN, &o->envelope, &o->envelope_len);
		if (rc < 0)
			die("envelope_encode: %s", strerror(-rc));
		o->payload = o->envelope + o->envelope_len - PAYLOAD_LEN;
		b->envelope_len = o->envelope_len;
		o->artfs_path = xprintf("%s/%s", b->artfs_dir, hex);
		o->raw_path = xprintf("%s/%s", b->raw_dir, hex);
		o->raw_tmp = xprintf("%s/.tmp-%ld-%lu", b->raw_dir, (long)getpid(), b->tmp_seq++);
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
	uint64_t t0 = now_ns();

	for (size_t i = 0; i < b->n; i++) {
		struct object *o = &b->obj[i];
		int fd = open(o->artfs_path, O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
		if (fd < 0)
			die("artfs open %s: %s", o->artfs_path, strerror(errno));
		int rc = write_all(fd, o->envelope, o->envelope_len);
		if (rc < 0)
			die("artfs write %s: %s", o->artfs_path, strerror(-rc));
		if (close(fd) != 0)
			die("artfs close %s (the publish result): %s", o->artfs_path,
			    strerror(errno));
	}
	return now_ns() - t0;
}

static uint64_t publish_raw(struct bench *b)
{
	uint64_t t0 = now_ns();

	for (size_t i = 0; i < b->n; i++) {
		struct object *o = &b->obj[i];
		int fd = open(o->raw_tmp, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
		if (fd < 0)
			die("raw open %s: %s", o->raw_tmp, strerror(errno));
		int rc = write_all(fd, o->envelope, o->envelope_len);
		if (rc < 0)
			die("raw write %s: %s", o->raw_tmp, strerror(-rc));
		if (close(fd) != 0)
			die("raw close %s: %s", o->raw_tmp, strerror(errno));
		if (link(o->raw_tmp, o->raw_path) < 0 && errno != EEXIST)
			die("raw link %s: %s", o->raw_path, strerror(errno));
		if (unlink(o->raw_tmp) < 0)
			die("raw unlink %s: %s", o->raw_tmp, strerror(errno));
	}
	return now_ns() - t0;
}

static uint64_t read_artfs(struct bench *b)
{
	uint64_t t0 = now_ns();

	for (size_t i = 0; i < b->n; i++) {
		struct object *o = &b->obj[i];
		int fd = open(o->artfs_path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			die("artfs open %s: %s", o->artfs_path, strerror(errno));
		b->got[i] = read_all(fd, b->slots + i * b->slot_cap, b->slot_cap, o->artfs_path);
		close(fd);
	}
	return now_ns() - t0;
}

/* After the timed loop: every artfs read must be numpy.save of the payload. */
static void check_artfs(const struct bench *b, const char *phase)
{
	for (size_t i = 0; i < b->n; i++) {
		const struct object *o = &b->obj[i];
		const uint8_t *s = b->slots + i * b->slot_cap;

		if (b->got[i] == SIZE_MAX)
			die("artfs %s %s: more than %zu bytes, expected %zu", phase,
			    o->artfs_path, b->slot_cap, b->npy_len);
		if (b->got[i] != b->npy_len)
			die("artfs %s %s: read %zu bytes, expected %zu", phase, o->artfs_path,
			    b->got[i], b->npy_len);
		if (memcmp(s, b->npy_head, b->npy_head_len) != 0)
			die("artfs %s %s: .npy header differs from numpy.save's", phase,
			    o->artfs_path);
		if (memcmp(s + b->npy_head_len, o->payload, PAYLOAD_LEN) != 0)
			die("artfs %s %s: array bytes differ from the published payload", phase,
			    o->artfs_path);
	}
}

/* The raw reader's work, all timed: read, parse, identity, checksum. */
static uint64_t read_raw(struct bench *b)
{
	struct envelope env;
	char detail[160];
	char want[ARTFS_KEY_LEN + 1];
	uint8_t sha[32];
	uint64_t t0 = now_ns();

	for (size_t i = 0; i < b->n; i++) {
		struct object *o = &b->obj[i];
		uint8_t *s = b->slots + i * b->slot_cap;
		int fd = open(o->raw_path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			die("raw open %s: %s", o->raw_path, strerror(errno));
		size_t len = read_all(fd, s, b->slot_cap, o->raw_path);
		close(fd);
		if (len == SIZE_MAX)
			die("raw %s: longer than %zu bytes", o->raw_path, b->slot_cap);
		enum envelope_error err = envelope_parse(s, len, &env, detail, sizeof(detail));
		if (err != ENVELOPE_OK)
			die("raw %s: %s: %s", o->raw_path, envelope_error_name(err), detail);
		if (envelope_total_len(&env) != len)
			die("raw %s: %zu bytes, envelope says %" PRIu64, o->raw_path, len,
			    envelope_total_len(&env));
		key_derive(WV, o->hash, HASH_BYTES, want);
		if (strcmp(env.key, want) != 0)
			die("raw %s: key is not the key of this name", o->raw_path);
		sha256_once(s + len - env.payload_len, env.payload_len, sha);
		if (memcmp(sha, env.payload_sha256, 32) != 0)
			die("raw %s: payload checksum mismatch", o->raw_path);
		b->got[i] = len;
	}
	return now_ns() - t0;
}

/* Guards against a reader that was fast because it read nothing. */
static void check_raw(const struct bench *b, const char *phase)
{
	for (size_t i = 0; i < b->n; i++) {
		const struct object *o = &b->obj[i];
		if (b->got[i] != o->envelope_len ||
		    memcmp(b->slots + i * b->slot_cap, o->envelope, o->envelope_len) != 0)
			die("raw %s %s: bytes differ from the published envelope", phase,
			    o->raw_path);
	}
}

static void remove_objects(const struct bench *b)
{
	for (size_t i = 0; i < b->n; i++) {
		const struct object *o = &b->obj[i];
		if (unlink(o->artfs_path) < 0)
			die("unlink %s: %s", o->artfs_path, strerror(errno));
		if (unlink(o->raw_path) < 0)
			die("unlink %s: %s", o->raw_path, strerror(errno));
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

static int cmp_double(const void *x, const void *y)
{
	double a = *(const double *)x, c = *(const double *)y;
	return (a > c) - (a < c);
}

static double median(double *v, unsigned n)
{
	qsort(v, n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void report(const struct bench *b)
{
	unsigned n = b->rounds;
	double *v = xmalloc(n * sizeof(*v));

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
			med[s] = median(v, n);
			mean_us[s] = sum / 1e3 / ((double)b->n * n);
		}
		double best = 0;
		for (unsigned r = 0; r < n; r++) {
			v[r] = b->ns[r][p][ARTFS] > 0 ? b->ns[r][p][RAW] / b->ns[r][p][ARTFS] : 0;
			if (v[r] > best)
				best = v[r];
		}
		printf("%-14s %12.0f %12.0f %10.2f %10.2f %10.3f %10.3f\n", phase_names[p],
		       med[ARTFS], med[RAW], mean_us[ARTFS], mean_us[RAW], median(v, n), best);
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

static bool parse_count(const char *s, unsigned long max, unsigned long *out)
{
	char *end;

	if (!*s || *s == '-' || *s == '+')
		return false;
	errno = 0;
	unsigned long v = strtoul(s, &end, 10);
	if (errno || *end || v == 0 || v > max)
		return false;
	*out = v;
	return true;
}

int main(int argc, char **argv)
{
	struct bench b;
	const char *pos[4];
	int npos = 0;
	unsigned long v;
	struct stat st;

	memset(&b, 0, sizeof(b));
	b.n = 20000;
	b.rounds = 3;
	b.rng = SEED;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--keep") == 0)
			b.keep = true;
		else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0)
			usage();
		else if (argv[i][0] == '-' && argv[i][1])
			usage();
		else if (npos < 4)
			pos[npos++] = argv[i];
		else
			usage();
	}
	if (npos < 2)
		usage();
	b.mnt = pos[0];
	b.raw = pos[1];
	if (npos > 2) {
		if (!parse_count(pos[2], 10000000, &v))
			usage();
		b.n = v;
	}
	if (npos > 3) {
		if (!parse_count(pos[3], 1000, &v))
			usage();
		b.rounds = (unsigned)v;
	}
	struct statfs sfs;
	if (stat(b.mnt, &st) < 0 || !S_ISDIR(st.st_mode))
		die("%s is not a directory (mount artfs there first)", b.mnt);
	/* A plain directory would "work" until the first .npy check. */
	if (statfs(b.mnt, &sfs) < 0 || sfs.f_type != FUSE_SUPER_MAGIC)
		die("%s is not a FUSE mount (mount artfs there first)", b.mnt);
	if ((size_t)snprintf(b.artfs_dir, sizeof(b.artfs_dir), "%s/%s", b.mnt, WV) >=
		    sizeof(b.artfs_dir) ||
	    (size_t)snprintf(b.raw_dir, sizeof(b.raw_dir), "%s/%s", b.raw, WV) >=
		    sizeof(b.raw_dir))
		die("path too long");

	/* The .npy every artfs read must return, as numpy.save writes it. */
	struct array_desc a;
	memset(&a, 0, sizeof(a));
	if (array_dtype_set(&a, "|u1") < 0)
		die("array_dtype_set(|u1) failed");
	a.ndim = 3;
	a.shape[0] = SHAPE0;
	a.shape[1] = SHAPE1;
	a.shape[2] = SHAPE2;
	ssize_t h = npy_header(&a, b.npy_head, sizeof(b.npy_head));
	if (h < 0)
		die("npy_header: %s", strerror((int)-h));
	b.npy_head_len = (size_t)h;
	b.npy_len = b.npy_head_len + PAYLOAD_LEN;

	b.obj = xmalloc(b.n * sizeof(*b.obj));
	memset(b.obj, 0, b.n * sizeof(*b.obj));
	b.ns = xmalloc(b.rounds * sizeof(*b.ns));
	b.got = xmalloc(b.n * sizeof(*b.got));
	/* Room for the larger of envelope and .npy, plus slack, 64-byte aligned. */
	b.slot_cap = (ENVELOPE_HEADER_BYTES_MAX + PAYLOAD_LEN + NPY_HEADER_MAX + 63) & ~(size_t)63;
	b.slots = xmalloc(b.n * b.slot_cap);
	memset(b.slots, 0, b.n * b.slot_cap); /* fault the pages in before timing */

	/* Leftovers of an earlier run: objects, temporaries, the directories. */
	if (mkdir(b.raw, 0755) < 0 && errno != EEXIST)
		die("mkdir %s: %s", b.raw, strerror(errno));
	remove_dir(b.artfs_dir);
	remove_dir(b.raw_dir);
	make_dir(b.artfs_dir);
	make_dir(b.raw_dir);

	printf("r3_bench: artfs %s vs raw %s, N=%zu, rounds=%u\n", b.artfs_dir, b.raw_dir, b.n,
	       b.rounds);
	for (unsigned r = 0; r < b.rounds; r++)
		run_round(&b, r);
	report(&b);

	if (!b.keep) {
		remove_dir(b.artfs_dir);
		remove_dir(b.raw_dir);
	}
	free(b.slots);
	free(b.got);
	free(b.ns);
	free(b.obj);
	return 0;
}
