/* SPDX-License-Identifier: Apache-2.0 */
/* Helpers shared by the benchmark programs; see util.h. */
#include "autoconf.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include "format/array.h"
#include "format/envelope.h"
#include "format/key.h"
#include "lib/sha256.h"
#include "util.h"

#define FUSE_SUPER_MAGIC 0x65735546

const char *bench_progname = "bench";
void (*bench_die_hook)(void);

void bench_die(const char *fmt, ...)
{
	va_list ap;

	fflush(stdout);
	fprintf(stderr, "%s: ", bench_progname);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	if (bench_die_hook)
		bench_die_hook();
	exit(1);
}

void *bench_xmalloc(size_t len)
{
	void *p = malloc(len ? len : 1);

	if (!p)
		bench_die("out of memory (%zu bytes)", len);
	return p;
}

char *bench_xprintf(const char *fmt, ...)
{
	va_list ap;
	char *s;

	va_start(ap, fmt);
	int rc = vasprintf(&s, fmt, ap);
	va_end(ap);
	if (rc < 0)
		bench_die("out of memory");
	return s;
}

uint64_t bench_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t bench_rng_next(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

void bench_rng_fill(uint64_t *s, uint8_t *buf, size_t len)
{
	while (len) {
		uint64_t v = bench_rng_next(s);
		size_t k = len < 8 ? len : 8;
		memcpy(buf, &v, k);
		buf += k;
		len -= k;
	}
}

int bench_write_all(int fd, const void *data, size_t len)
{
	const uint8_t *buf = data;

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

int bench_read_all(int fd, void *buf, size_t cap, bool probe, size_t *len)
{
	uint8_t *b = buf;
	size_t off = 0;

	for (;;) {
		if (off == cap) {
			*len = off;
			if (!probe)
				return 1;
			uint8_t extra;
			ssize_t r = read(fd, &extra, 1);
			if (r < 0 && errno == EINTR)
				continue;
			if (r < 0)
				return -errno;
			return r == 0 ? 0 : 1;
		}
		ssize_t r = read(fd, b + off, cap - off);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			*len = off;
			return -errno;
		}
		if (r == 0) {
			*len = off;
			return 0;
		}
		off += (size_t)r;
	}
}

void bench_write_file(const char *side, const char *path, const void *data, size_t len,
		      bool close_is_result)
{
	int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);

	if (fd < 0)
		bench_die("%s open %s: %s", side, path, strerror(errno));
	int rc = bench_write_all(fd, data, len);
	if (rc < 0)
		bench_die("%s write %s: %s", side, path, strerror(-rc));
	if (close(fd) != 0)
		bench_die("%s close %s%s: %s", side, path,
			  close_is_result ? " (the publish result)" : "", strerror(errno));
}

void bench_check_raw_envelope(const char *path, const uint8_t *s, size_t len, const char *wv,
			      const uint8_t *hash, size_t hash_len, struct envelope *env)
{
	char detail[160];
	char want[ARTFS_KEY_LEN + 1];
	uint8_t sha[32];

	enum envelope_error err = envelope_parse(s, len, env, detail, sizeof(detail));
	if (err != ENVELOPE_OK)
		bench_die("raw %s: %s: %s", path, envelope_error_name(err), detail);
	if (envelope_total_len(env) != len)
		bench_die("raw %s: %zu bytes, envelope says %" PRIu64, path, len,
			  envelope_total_len(env));
	key_derive(wv, hash, hash_len, want);
	if (strcmp(env->key, want) != 0)
		bench_die("raw %s: key is not the key of this name", path);
	sha256_once(s + len - env->payload_len, env->payload_len, sha);
	if (memcmp(sha, env->payload_sha256, 32) != 0)
		bench_die("raw %s: payload checksum mismatch", path);
}

void bench_remove_dir(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;

	if (!d) {
		if (errno == ENOENT)
			return;
		bench_die("opendir %s: %s", dir, strerror(errno));
	}
	while ((errno = 0, e = readdir(d)) != NULL) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		if (unlinkat(dirfd(d), e->d_name, 0) < 0 && errno != ENOENT &&
		    e->d_name[0] != '.') /* artfs lists its special files; rmdir tells */
			bench_die("unlink %s/%s: %s", dir, e->d_name, strerror(errno));
	}
	if (errno)
		bench_die("readdir %s: %s", dir, strerror(errno));
	closedir(d);
	if (rmdir(dir) < 0 && errno != ENOENT)
		bench_die("rmdir %s: %s", dir, strerror(errno));
}

void bench_make_dir(const char *dir)
{
	if (mkdir(dir, 0755) < 0)
		bench_die("mkdir %s: %s", dir, strerror(errno));
}

static int cmp_double(const void *x, const void *y)
{
	double a = *(const double *)x, c = *(const double *)y;
	return (a > c) - (a < c);
}

double bench_median(double *v, size_t n)
{
	qsort(v, n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

bool bench_parse_count(const char *s, unsigned long max, unsigned long *out)
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

bool bench_parse_mount_args(int argc, char **argv, unsigned long count_max,
			    unsigned long rounds_max, struct bench_mount_args *a)
{
	const char *pos[4];
	int npos = 0;

	a->keep = false;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--keep") == 0)
			a->keep = true;
		else if (argv[i][0] == '-' && argv[i][1])
			return false; /* -h and --help among them */
		else if (npos < 4)
			pos[npos++] = argv[i];
		else
			return false;
	}
	if (npos < 2)
		return false;
	a->mnt = pos[0];
	a->raw = pos[1];
	if (npos > 2 && !bench_parse_count(pos[2], count_max, &a->count))
		return false;
	if (npos > 3 && !bench_parse_count(pos[3], rounds_max, &a->rounds))
		return false;
	return true;
}

void bench_require_fuse_mount(const char *mnt)
{
	struct stat st;
	struct statfs sfs;

	if (stat(mnt, &st) < 0 || !S_ISDIR(st.st_mode))
		bench_die("%s is not a directory (mount artfs there first)", mnt);
	/* A plain directory would "work" until the first check of what it reads. */
	if (statfs(mnt, &sfs) < 0 || sfs.f_type != FUSE_SUPER_MAGIC)
		bench_die("%s is not a FUSE mount (mount artfs there first)", mnt);
}

void bench_u1_array(struct array_desc *a, uint64_t d0, uint64_t d1, uint64_t d2)
{
	memset(a, 0, sizeof(*a));
	if (array_dtype_set(a, "|u1") < 0)
		bench_die("array_dtype_set(|u1) failed");
	a->ndim = 3;
	a->shape[0] = d0;
	a->shape[1] = d1;
	a->shape[2] = d2;
}

void bench_fmt_path(char *buf, size_t len, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	int n = vsnprintf(buf, len, fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= len)
		bench_die("path too long: %s...", buf);
}
