/* SPDX-License-Identifier: Apache-2.0 */
/* scale_bench's store: written straight to disk in the daemon's layout,
 * <store>/v/<wv>/<hash> = the envelope bytes as published, by one process
 * per few versions; names and payloads from a fixed seed, so that a
 * complete store (its marker, its counts, a spot check) is reused. */
#include "autoconf.h"

#include <dirent.h>
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
#include <sys/wait.h>
#include <unistd.h>

#include "format/array.h"
#include "format/envelope.h"
#include "format/key.h"
#include "format/npy.h"
#include "lib/sha256.h"
#include "scale_i.h"
#include "store/store.h"
#include "util.h"

/* Deletes path and everything under it (no links followed). */
static void remove_tree_at(int parent, const char *name)
{
	int fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

	if (fd < 0) {
		if (errno == ENOENT)
			return;
		if (errno == ENOTDIR || errno == ELOOP) {
			if (unlinkat(parent, name, 0) < 0 && errno != ENOENT)
				bench_die("unlink %s: %s", name, strerror(errno));
			return;
		}
		bench_die("open %s: %s", name, strerror(errno));
	}
	DIR *d = fdopendir(fd);
	if (!d)
		bench_die("fdopendir %s: %s", name, strerror(errno));
	struct dirent *e;
	while ((errno = 0, e = readdir(d)) != NULL) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		if (e->d_type == DT_DIR)
			remove_tree_at(dirfd(d), e->d_name);
		else if (unlinkat(dirfd(d), e->d_name, 0) < 0 && errno != ENOENT)
			bench_die("unlink %s/%s: %s", name, e->d_name, strerror(errno));
	}
	if (errno)
		bench_die("readdir %s: %s", name, strerror(errno));
	closedir(d);
	if (unlinkat(parent, name, AT_REMOVEDIR) < 0 && errno != ENOENT)
		bench_die("rmdir %s: %s", name, strerror(errno));
}

void scale_store_remove(const char *path)
{
	remove_tree_at(AT_FDCWD, path);
}

/* Names, payloads and the layout: deterministic from the seed, so the same
 * for the store written now and for one written by an earlier run. Each
 * version has its own stream, so workers need not share one. */
void scale_store_plan(struct cfg *c)
{
	size_t rest = c->objects - c->big, others = c->versions - 1;

	c->wv = bench_xmalloc(c->versions * sizeof(*c->wv));
	c->count = bench_xmalloc(c->versions * sizeof(*c->count));
	c->first = bench_xmalloc(c->versions * sizeof(*c->first));
	c->obj = bench_xmalloc(c->objects * sizeof(*c->obj));
	snprintf(c->wv[0], sizeof(c->wv[0]), "%s", BIG_WV);
	c->count[0] = c->big;
	for (size_t v = 1; v < c->versions; v++) {
		snprintf(c->wv[v], sizeof(c->wv[v]), "v%03u", (unsigned)v);
		c->count[v] = rest / others + (v - 1 < rest % others ? 1 : 0);
	}
	size_t at = 0;
	for (size_t v = 0; v < c->versions; v++) {
		uint64_t rng = SEED ^ ((uint64_t)v * 0x100000001b3ull);
		c->first[v] = at;
		for (size_t i = 0; i < c->count[v]; i++, at++) {
			struct object *o = &c->obj[at];
			bench_rng_fill(&rng, o->hash, HASH_BYTES);
			bench_rng_fill(&rng, o->payload, PAYLOAD_LEN);
			o->ver = (uint32_t)v;
		}
	}
}

/* Writes the objects of every version v with v % nworkers == worker. */
static void generate_part(const struct cfg *c, int versions_fd, unsigned worker,
			  unsigned nworkers)
{
	struct envelope env;
	char hex[HASH_HEX + 1];

	memset(&env, 0, sizeof(env));
	bench_u1_array(&env.array, 1, 4, 2);
	env.kind = ENVELOPE_TAIL;
	env.source_token_start = 0;
	for (size_t v = worker; v < c->versions; v += nworkers) {
		if (mkdirat(versions_fd, c->wv[v], 0700) < 0)
			bench_die("mkdir %s/v/%s: %s", c->store, c->wv[v], strerror(errno));
		int dfd = openat(versions_fd, c->wv[v], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (dfd < 0)
			bench_die("open %s/v/%s: %s", c->store, c->wv[v], strerror(errno));
		for (size_t i = 0; i < c->count[v]; i++) {
			const struct object *o = &c->obj[c->first[v] + i];
			uint8_t *buf;
			size_t len;
			key_derive(c->wv[v], o->hash, HASH_BYTES, env.key);
			sha256_once(o->payload, PAYLOAD_LEN, env.payload_sha256);
			int rc = envelope_encode(&env, o->payload, PAYLOAD_LEN, &buf, &len);
			if (rc < 0)
				bench_die("envelope_encode: %s", strerror(-rc));
			key_hex(o->hash, HASH_BYTES, hex);
			int fd = openat(dfd, hex, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0400);
			if (fd < 0)
				bench_die("create %s/v/%s/%s: %s", c->store, c->wv[v], hex,
					  strerror(errno));
			rc = bench_write_all(fd, buf, len);
			if (rc < 0)
				bench_die("write %s/v/%s/%s: %s", c->store, c->wv[v], hex,
					  strerror(-rc));
			/* As a commit leaves it: the .npy size in the file's mtime. */
			uint64_t npy;
			if (npy_file_size(&env.array, &npy) == 0)
				store_mark_npy_size(fd, npy);
			if (close(fd) < 0)
				bench_die("close %s/v/%s/%s: %s", c->store, c->wv[v], hex,
					  strerror(errno));
			free(buf);
		}
		close(dfd);
	}
}

static void marker_text(const struct cfg *c, char *buf, size_t len)
{
	snprintf(buf, len, "scale_bench store: objects=%zu versions=%zu big=%zu seed=%016" PRIx64
		 " shape=1,4,2\n", c->objects, c->versions, c->big, (uint64_t)SEED);
}

long scale_store_count_dir(const char *path)
{
	DIR *d = opendir(path);
	struct dirent *e;
	long n = 0;

	if (!d)
		return -1;
	while ((e = readdir(d)) != NULL)
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n;
}

/* A store from an earlier run with the same parameters, complete. */
static bool store_complete(const struct cfg *c)
{
	char want[256], have[256] = "";
	char path[PATH_MAX + 32];
	FILE *f = fopen(c->marker, "re");

	if (!f)
		return false;
	bool ok = fgets(have, sizeof(have), f) != NULL;
	fclose(f);
	marker_text(c, want, sizeof(want));
	if (!ok || strcmp(have, want) != 0)
		return false;
	snprintf(path, sizeof(path), "%s/v", c->store);
	if (scale_store_count_dir(path) != (long)c->versions)
		return false;
	for (size_t v = 0; v < c->versions; v++) {
		snprintf(path, sizeof(path), "%s/v/%s", c->store, c->wv[v]);
		if (scale_store_count_dir(path) != (long)c->count[v])
			return false;
	}
	/* Spot check: the first and last objects by name. */
	char hex[HASH_HEX + 1];
	struct stat st;
	size_t probe[2] = { 0, c->objects - 1 };
	for (int i = 0; i < 2; i++) {
		const struct object *o = &c->obj[probe[i]];
		key_hex(o->hash, HASH_BYTES, hex);
		bench_fmt_path(path, sizeof(path), "%s/v/%s/%s", c->store, c->wv[o->ver], hex);
		if (stat(path, &st) < 0)
			return false;
	}
	return true;
}

void scale_store_prepare(struct cfg *c)
{
	if (!c->regen && store_complete(c)) {
		printf("store %s: reusing it (%zu objects in %zu versions, complete)\n", c->store,
		       c->objects, c->versions);
		return;
	}
	unlink(c->marker);
	uint64_t t0 = bench_now_ns();
	scale_store_remove(c->store);
	uint64_t t1 = bench_now_ns();
	if (mkdir(c->store, 0700) < 0)
		bench_die("mkdir %s: %s", c->store, strerror(errno));
	char vpath[PATH_MAX + 4];
	snprintf(vpath, sizeof(vpath), "%s/v", c->store);
	if (mkdir(vpath, 0700) < 0)
		bench_die("mkdir %s: %s", vpath, strerror(errno));
	int vfd = open(vpath, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (vfd < 0)
		bench_die("open %s: %s", vpath, strerror(errno));

	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	unsigned nworkers = cpus > 1 ? (unsigned)(cpus > 8 ? 8 : cpus) : 1;
	if (nworkers > c->versions)
		nworkers = (unsigned)c->versions;
	pid_t pids[8];
	fflush(stdout);
	for (unsigned w = 0; w < nworkers; w++) {
		pids[w] = fork();
		if (pids[w] < 0)
			bench_die("fork: %s", strerror(errno));
		if (pids[w] == 0) {
			generate_part(c, vfd, w, nworkers);
			_exit(0);
		}
	}
	bool failed = false;
	for (unsigned w = 0; w < nworkers; w++) {
		int status;
		if (waitpid(pids[w], &status, 0) != pids[w] || !WIFEXITED(status) ||
		    WEXITSTATUS(status) != 0)
			failed = true;
	}
	close(vfd);
	if (failed)
		bench_die("generating the store failed (see above)");
	uint64_t t2 = bench_now_ns();
	FILE *f = fopen(c->marker, "we");
	char text[256];
	marker_text(c, text, sizeof(text));
	if (!f || fputs(text, f) < 0 || fclose(f) != 0)
		bench_die("write %s: %s", c->marker, strerror(errno));
	printf("store %s: generated %zu objects in %zu versions in %.1f s with %u processes "
	       "(removing the old one: %.1f s; setup, not a result)\n",
	       c->store, c->objects, c->versions, (double)(t2 - t1) / 1e9, nworkers,
	       (double)(t1 - t0) / 1e9);
}
