/* SPDX-License-Identifier: Apache-2.0 */
/* shm_read_bench: why the first read of a checkpoint just written into a
 * tmpfs is slower than the next (bench/RESULTS, "First read after a
 * write"), and which way of reading it avoids that.
 *
 *     bench/shm_read_bench [dir] [GiB] [threads]
 *
 * dir (default /dev/shm/artfs-read-bench) is made and removed; 4 files of
 * GiB/4 each (default 8 GiB in all) are written anew by 8 threads before
 * every variant, as a trainer writes a checkpoint; then the variant reads
 * them once on `threads` threads (default 16) into a 2 MiB buffer each, 2
 * MiB at a time, as the loader reads into its pinned buffers, and a plain
 * way reads them a second time, then a plain pread a third. Prints GB/s of
 * each read per variant (a mapping's read includes mmap and munmap, and its
 * munmap is also given apart):
 *   pread     pread(2)
 *   noreuse   posix_fadvise(POSIX_FADV_NOREUSE) on the file, then pread
 *   mmap      memcpy out of a shared mapping of each file (page faults)
 *   mmap-seq  the same, the mapping madvise(MADV_SEQUENTIAL)
 *   mmap-rand the same, MADV_RANDOM
 *   seq-zap   mmap-seq, each piece zapped (MADV_DONTNEED) after its copy by
 *             its reader, so munmap finds nothing left to do
 *   rand-zap  the same with MADV_RANDOM
 *   populate  madvise(MADV_POPULATE_READ) of each piece, then memcpy
 *   pread-1   pread on one thread (against `threads`: contention or not)
 * and what the kernel says of its LRU and of tmpfs huge pages. */
#include "autoconf.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

#define FILES 4
#define PIECE (2u << 20)
#define THREADS_MAX 64

enum how { HOW_PREAD, HOW_NOREUSE, HOW_MMAP, HOW_MMAP_SEQ, HOW_MMAP_RAND, HOW_POPULATE };

struct run {
	int fds[FILES];
	char *maps[FILES];
	size_t file_size;
	size_t pieces;          /* over all files */
	enum how how;
	bool zap;
	unsigned threads;
	_Atomic size_t next;
	_Atomic int failed;
};

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *reader(void *arg)
{
	struct run *r = arg;
	char *buf = aligned_alloc(4096, PIECE);
	size_t per_file = r->file_size / PIECE;

	if (!buf) {
		r->failed = 1;
		return NULL;
	}
	memset(buf, 0, PIECE); /* faulted in before the clock matters */
	for (;;) {
		size_t i = atomic_fetch_add(&r->next, 1);
		if (i >= r->pieces)
			break;
		unsigned f = (unsigned)(i / per_file);
		off_t off = (off_t)(i % per_file) * PIECE;
		if (r->how >= HOW_MMAP) {
			char *src = r->maps[f] + off;
			if (r->how == HOW_POPULATE && madvise(src, PIECE, MADV_POPULATE_READ) != 0)
				r->failed = errno;
			memcpy(buf, src, PIECE);
			if (r->zap && madvise(src, PIECE, MADV_DONTNEED) != 0)
				r->failed = errno;
		} else if (pread(r->fds[f], buf, PIECE, off) != (ssize_t)PIECE) {
			r->failed = errno ? errno : EIO;
		}
	}
	free(buf);
	return NULL;
}

/* GB/s of one read of every file; *unmap_s: the munmap of a mapped read. */
static double read_all(struct run *r, enum how how, unsigned threads, double *unmap_s)
{
	pthread_t ts[THREADS_MAX];
	double t0, t1;
	static const int advice[] = { [HOW_MMAP_SEQ] = MADV_SEQUENTIAL, [HOW_MMAP_RAND] = MADV_RANDOM };

	r->how = how;
	atomic_store(&r->next, 0);
	t0 = now();
	for (unsigned f = 0; f < FILES && how >= HOW_MMAP; f++) {
		r->maps[f] = mmap(NULL, r->file_size, PROT_READ, MAP_SHARED, r->fds[f], 0);
		if (r->maps[f] == MAP_FAILED) {
			r->maps[f] = NULL;
			r->failed = errno;
			return 0;
		}
		if ((how == HOW_MMAP_SEQ || how == HOW_MMAP_RAND) &&
		    madvise(r->maps[f], r->file_size, advice[how]) != 0)
			r->failed = errno;
	}
	for (unsigned k = 0; k < threads; k++)
		pthread_create(&ts[k], NULL, reader, r);
	for (unsigned k = 0; k < threads; k++)
		pthread_join(ts[k], NULL);
	t1 = now();
	for (unsigned f = 0; f < FILES && how >= HOW_MMAP; f++) {
		munmap(r->maps[f], r->file_size);
		r->maps[f] = NULL;
	}
	*unmap_s = now() - t1;
	return (double)(r->file_size * FILES) / (now() - t0) / 1e9;
}

struct writer_arg {
	struct run *r;
	unsigned id;
};

static void *writer(void *arg)
{
	struct writer_arg *w = arg;
	struct run *r = w->r;
	char *buf = aligned_alloc(4096, PIECE);
	size_t per_file = r->file_size / PIECE;

	if (!buf) {
		r->failed = 1;
		return NULL;
	}
	memset(buf, 0x5a + (int)w->id, PIECE);
	for (size_t i = w->id; i < r->pieces; i += 8) {
		unsigned f = (unsigned)(i / per_file);
		if (pwrite(r->fds[f], buf, PIECE, (off_t)(i % per_file) * PIECE) != (ssize_t)PIECE)
			r->failed = errno ? errno : EIO;
	}
	free(buf);
	return NULL;
}

/* The files anew: removed, made and written by 8 threads. */
static int write_files(struct run *r, const char *dir)
{
	pthread_t ts[8];
	struct writer_arg ws[8];
	char path[4096];

	for (unsigned f = 0; f < FILES; f++) {
		if (r->fds[f] >= 0)
			close(r->fds[f]);
		snprintf(path, sizeof(path), "%s/part-%u", dir, f);
		unlink(path);
		r->fds[f] = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
		if (r->fds[f] < 0)
			return -errno;
	}
	for (unsigned k = 0; k < 8; k++) {
		ws[k] = (struct writer_arg){ r, k };
		pthread_create(&ts[k], NULL, writer, &ws[k]);
	}
	for (unsigned k = 0; k < 8; k++)
		pthread_join(ts[k], NULL);
	return r->failed ? -r->failed : 0;
}

static void show_file(const char *path)
{
	char line[512];
	FILE *f = fopen(path, "r");

	if (!f) {
		printf("%s: (absent)\n", path);
		return;
	}
	if (fgets(line, sizeof(line), f))
		printf("%s: %s", path, line);
	fclose(f);
}

static void show_mount(const char *dir)
{
	char line[1024];
	FILE *f = fopen("/proc/mounts", "r");

	if (!f)
		return;
	while (fgets(line, sizeof(line), f))
		if (strstr(line, " tmpfs ") && strstr(line, "/dev/shm"))
			printf("mount: %s", line);
	fclose(f);
	(void)dir;
}

int main(int argc, char **argv)
{
	const char *dir = argc > 1 ? argv[1] : "/dev/shm/artfs-read-bench";
	double gib = argc > 2 ? atof(argv[2]) : 8;
	unsigned threads = argc > 3 ? (unsigned)atoi(argv[3]) : 16;
	static const struct {
		const char *name;
		enum how how;
		int one_thread;
		bool zap;
	} variants[] = {
		{ "pread", HOW_PREAD, 0, false },         { "noreuse", HOW_NOREUSE, 0, false },
		{ "mmap", HOW_MMAP, 0, false },           { "mmap-seq", HOW_MMAP_SEQ, 0, false },
		{ "mmap-rand", HOW_MMAP_RAND, 0, false }, { "populate", HOW_POPULATE, 0, false },
		{ "seq-zap", HOW_MMAP_SEQ, 0, true }, { "rand-zap", HOW_MMAP_RAND, 0, true },
		{ "pread-1", HOW_PREAD, 1, false },       { "mmap", HOW_MMAP, 0, false },
	};
	struct run r = { .fds = { -1, -1, -1, -1 } };

	if (threads < 1 || threads > THREADS_MAX || gib <= 0) {
		fprintf(stderr, "usage: %s [dir] [GiB] [threads 1-%d]\n", argv[0], THREADS_MAX);
		return 2;
	}
	r.file_size = (size_t)(gib * (double)(1u << 30) / FILES) / PIECE * PIECE;
	r.pieces = r.file_size / PIECE * FILES;
	if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
		perror(dir);
		return 1;
	}
	show_file("/sys/kernel/mm/lru_gen/enabled");
	show_file("/sys/kernel/mm/transparent_hugepage/shmem_enabled");
	show_mount(dir);
	printf("%.1f GiB in %d files, %u readers, %u KiB reads\n", gib, FILES, threads, PIECE >> 10);
	for (size_t v = 0; v < sizeof(variants) / sizeof(variants[0]); v++) {
		unsigned n = variants[v].one_thread ? 1 : threads;
		if (write_files(&r, dir) < 0) {
			perror("write");
			return 1;
		}
		if (variants[v].how == HOW_NOREUSE)
			for (unsigned f = 0; f < FILES; f++)
				posix_fadvise(r.fds[f], 0, 0, POSIX_FADV_NOREUSE);
		double u1, u2, u3;
		r.zap = variants[v].zap;
		double first = read_all(&r, variants[v].how, n, &u1);
		double second = read_all(&r, variants[v].how, n, &u2);
		r.zap = false;
		double third = read_all(&r, HOW_PREAD, n, &u3);
		printf("%-9s first %6.1f GB/s (munmap %5.3f s), second %6.1f GB/s (munmap %5.3f s), "
		       "then pread %6.1f GB/s%s\n", variants[v].name, first, u1, second, u2, third,
		       r.failed ? "  FAILED" : "");
	}
	for (unsigned f = 0; f < FILES; f++) {
		char path[4096];
		close(r.fds[f]);
		snprintf(path, sizeof(path), "%s/part-%u", dir, f);
		unlink(path);
	}
	rmdir(dir);
	return r.failed ? 1 : 0;
}
