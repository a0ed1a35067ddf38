/* SPDX-License-Identifier: Apache-2.0 */
/* The load pipeline: reader threads read checkpoint chunks into pinned host
 * buffers (pread from a disk; where the file is in memory, a copy out of
 * its mapping: gpu/source.h), several reads in flight, and copy each
 * tensor's part to its slab offset with cudaMemcpyAsync. From the page
 * cache or tmpfs one thread copies at a fraction of the host->device rate,
 * so there are several readers (readers_for), each with its own pinned
 * buffers; the buffers stay pinned between loads, and the daemon pins them
 * once it has mounted (loader_pool_fill), so that even its first load runs
 * at full rate (pinning them took 0.3 s of the first 8 GiB load). Weights
 * replicated on several GPUs are read into rank 0 only; a broadcaster
 * thread sends each range on to the others over NCCL while the disk is
 * read, so every byte is read from disk once. */
#include "autoconf.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "gpu/gpu.h"
#include "gpu/loader.h"
#include "gpu/nccl.h"
#include "gpu/slab.h"
#include "gpu/source.h"

/* Bytes of one read. From memory (tmpfs, the page cache) small enough that
 * a reader's buffer is still in the CPU's cache when the GPU reads it: from
 * tmpfs on a 16-core H200 host, 8 GiB loaded at 23-27 GB/s with 16 MiB
 * reads, 33-39 with 8, 45-49 with 4, 47-51 with 2 and 45-48 with 1
 * (bench/RESULTS, 2026-12-01). From a disk, large: cold, 8 readers of
 * 64 MiB reads were at or above the disk's own rate in every run where the
 * 16 readers of 16 MiB before were 0.85-1.15x of it (2026-12-03). A disk
 * read is gathered into all of a reader's pinned buffers (CHUNK_BUFFER
 * bytes each); replicated weights, broadcast chunk by chunk, read one
 * buffer at a time. */
#define CHUNK_MEMORY (2u << 20)
#define CHUNK_BUFFER (16u << 20)
#define CHUNK_DISK ((uint64_t)CHUNK_BUFFER * BUFS_PER_READER)
#define CHUNK_MIB_MAX 64
_Static_assert(CHUNK_MEMORY <= CHUNK_BUFFER, "a pinned buffer holds a read from memory");
#define READERS_DISK 8
#define READERS_MIN 4
#define READERS_MAX 32
#define BUFS_PER_READER 4
#define RANKS_MAX 64

/* Pinned buffers kept from one load to the next; one load at a time uses
 * them, another running at once pins its own. */
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static bool pool_busy;
static void *pool[READERS_MAX][BUFS_PER_READER];

struct chunk {
	uint32_t file;
	int rank;                  /* whose pieces (rank 0 when replicated) */
	uint64_t off, len;         /* the file range */
	size_t first;              /* first of rank's pieces it overlaps */
};

/* A range of a slab: [lo, hi). */
struct range {
	uint64_t lo, hi;
};

struct loader {
	struct gpu_load *l;
	struct chunk *chunks;
	size_t nchunks;
	_Atomic size_t next;
	int *fds;
	struct source_map *maps;   /* each file's mapping, where in memory */
	uint64_t *chunk;           /* each file's read size */
	/* Replicated weights: ranges of rank 0's slab waiting to be broadcast. */
	pthread_mutex_t q_mu;
	pthread_cond_t q_cv;
	struct range *q;
	size_t q_len, q_cap, q_head;
	bool readers_done;
	struct nccl_group *nccl;
	cudaStream_t bstreams[RANKS_MAX];
	void *slabs[RANKS_MAX];
	pthread_mutex_t err_mu;
	_Atomic int failed;
	int error;
	char err[256];
};

struct reader {
	struct loader *ld;
	void *buf[BUFS_PER_READER];
	cudaStream_t streams[RANKS_MAX];
	cudaEvent_t events[BUFS_PER_READER][RANKS_MAX];
	uint64_t used[BUFS_PER_READER];  /* bit r: buffer copied to rank r, event pending */
	/* The slab ranges the last chunk filled: a chunk's consecutive file
	 * bytes may lie apart in the slab (the layout is by name). */
	struct range *runs;
	size_t nruns, runs_cap;
	pthread_t thread;
	bool started;
	bool pooled;               /* buf[] belong to the pool */
};

static void fail(struct loader *ld, int error, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void fail(struct loader *ld, int error, const char *fmt, ...)
{
	va_list ap;

	pthread_mutex_lock(&ld->err_mu);
	if (!ld->failed) {
		va_start(ap, fmt);
		vsnprintf(ld->err, sizeof(ld->err), fmt, ap);
		va_end(ap);
		ld->error = error;
		ld->failed = 1;
	}
	pthread_mutex_unlock(&ld->err_mu);
}

static bool cuda_ok(struct loader *ld, cudaError_t e, const char *what)
{
	if (e == cudaSuccess)
		return true;
	fail(ld, -EIO, "%s: %s", what, cudaGetErrorString(e));
	return false;
}

/* The whole number 1..max in the environment variable name; 0 when it is
 * unset or anything else. */
static unsigned long env_number(const char *name, unsigned long max)
{
	const char *v = getenv(name);
	char *end;

	if (!v || !*v)
		return 0;
	unsigned long x = strtoul(v, &end, 10);
	return !*end && x >= 1 && x <= max ? x : 0;
}

/* ARTFS_LOAD_CHUNK_MIB (1..64) sets the size of every read, for
 * measuring; 0 when unset. Read once: the pool's buffers are sized by it. */
static size_t chunk_override(void)
{
	static _Atomic int looked;
	static _Atomic size_t chunk;

	if (atomic_load(&looked))
		return atomic_load(&chunk);
	atomic_store(&chunk, (size_t)env_number("ARTFS_LOAD_CHUNK_MIB", CHUNK_MIB_MAX) << 20);
	atomic_store(&looked, 1);
	return atomic_load(&chunk);
}

/* Bytes of each pinned buffer: the largest read. */
static size_t buffer_bytes(void)
{
	size_t o = chunk_override();

	return o ? o : CHUNK_BUFFER;
}

/* Splits every source rank's pieces into file ranges of at most a chunk. */
static int plan_chunks(struct loader *ld)
{
	struct gpu_load *l = ld->l;
	size_t cap = 0;
	int sources = l->replicated ? 1 : l->nranks;

	for (int r = 0; r < sources; r++) {
		const struct gpu_rank *rk = &l->ranks[r];
		struct chunk *cur = NULL;
		for (size_t i = 0; i < rk->npieces; i++) {
			const struct gpu_piece *p = &rk->pieces[i];
			const uint64_t chunk = ld->chunk[p->file];
			uint64_t pos = p->file_offset, left = p->size;
			while (left) {
				if (!cur || cur->file != p->file || cur->off + cur->len != pos || cur->len == chunk) {
					if (ld->nchunks == cap) {
						cap = cap ? cap * 2 : 256;
						struct chunk *c = realloc(ld->chunks, cap * sizeof(*c));
						if (!c)
							return -ENOMEM;
						ld->chunks = c;
					}
					cur = &ld->chunks[ld->nchunks++];
					*cur = (struct chunk){ .file = p->file, .rank = r, .off = pos, .first = i };
				}
				uint64_t take = chunk - cur->len < left ? chunk - cur->len : left;
				cur->len += take;
				pos += take;
				left -= take;
			}
		}
	}
	return 0;
}

/* Copies n bytes at off of a mapped file into dst. */
static bool copy_mapped(struct loader *ld, const struct chunk *c, void *dst, uint64_t off, size_t n)
{
	int rc = source_copy(&ld->maps[c->file], dst, off, n);

	if (rc < 0) {
		fail(ld, -EIO, "reading %s at %llu: %s", ld->l->paths[c->file], (unsigned long long)off,
		     rc == -EIO ? "the file shrank while it was loaded" : "outside the file");
		return false;
	}
	return true;
}

/* Reads the chunk into the reader's buffers from b on: one buffer, or (a
 * chunk larger than a buffer, from b = 0) as many as it fills, in one
 * gathered read (or copies out of its file's mapping). */
static bool read_chunk(struct loader *ld, const struct chunk *c, struct reader *rd, int b)
{
	const size_t bb = buffer_bytes();
	uint64_t done = 0;

	if (c->len > (uint64_t)bb * (uint64_t)(BUFS_PER_READER - b)) { /* never: plan_chunks */
		fail(ld, -EIO, "a read of %llu bytes exceeds its buffers", (unsigned long long)c->len);
		return false;
	}
	while (done < c->len) {
		struct iovec iov[BUFS_PER_READER];
		int niov = 0;
		for (uint64_t at = done; at < c->len && niov < BUFS_PER_READER; niov++) {
			size_t k = (size_t)(at / bb), in = (size_t)(at % bb);
			size_t take = bb - in < c->len - at ? bb - in : (size_t)(c->len - at);
			iov[niov] = (struct iovec){ (char *)rd->buf[b + (int)k] + in, take };
			at += take;
		}
		if (ld->maps[c->file].base) {
			for (int k = 0; k < niov; k++) {
				if (!copy_mapped(ld, c, iov[k].iov_base, c->off + done, iov[k].iov_len))
					return false;
				done += iov[k].iov_len;
				atomic_fetch_add(&ld->l->bytes_read, (uint64_t)iov[k].iov_len);
			}
			continue;
		}
		ssize_t n = preadv(ld->fds[c->file], iov, niov, (off_t)(c->off + done));
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			fail(ld, -EIO, "reading %s at %llu: %s", ld->l->paths[c->file],
			     (unsigned long long)(c->off + done), n < 0 ? strerror(errno) : "file shorter than its header says");
			return false;
		}
		done += (uint64_t)n;
		atomic_fetch_add(&ld->l->bytes_read, (uint64_t)n);
	}
	return true;
}

/* Notes [lo, hi) of the slab as filled by the chunk: the last run grows
 * when it ends there. */
static bool run_add(struct loader *ld, struct reader *rd, uint64_t lo, uint64_t hi)
{
	if (rd->nruns && rd->runs[rd->nruns - 1].hi == lo) {
		rd->runs[rd->nruns - 1].hi = hi;
		return true;
	}
	if (rd->nruns == rd->runs_cap) {
		size_t cap = rd->runs_cap ? rd->runs_cap * 2 : 64;
		struct range *r = realloc(rd->runs, cap * sizeof(*r));
		if (!r) {
			fail(ld, -ENOMEM, "out of memory");
			return false;
		}
		rd->runs = r;
		rd->runs_cap = cap;
	}
	rd->runs[rd->nruns++] = (struct range){ lo, hi };
	return true;
}

/* Copies the chunk's parts of the source rank's pieces to rank dst's slab;
 * rd->runs: the slab ranges the chunk filled. */
static bool copy_chunk(struct loader *ld, struct reader *rd, const struct chunk *c, int b, int dst)
{
	const struct gpu_rank *src = &ld->l->ranks[c->rank];
	const struct gpu_rank *to = &ld->l->ranks[dst];
	const uint64_t bb = buffer_bytes();
	uint64_t end = c->off + c->len;

	if (!cuda_ok(ld, cudaSetDevice(to->device), "cudaSetDevice"))
		return false;
	rd->nruns = 0;
	for (size_t i = c->first; i < src->npieces; i++) {
		const struct gpu_piece *p = &src->pieces[i];
		if (p->file != c->file || p->file_offset >= end)
			break;
		uint64_t a = p->file_offset > c->off ? p->file_offset : c->off;
		uint64_t z = p->file_offset + p->size < end ? p->file_offset + p->size : end;
		if (z <= a)
			continue;
		uint64_t at = p->slab_offset + (a - p->file_offset);
		if (!run_add(ld, rd, at, at + (z - a)))
			return false;
		/* In the buffer that holds each part (a gathered read spans several). */
		for (uint64_t rel = a - c->off; a < z;) {
			uint64_t in = rel % bb, n = bb - in < z - a ? bb - in : z - a;
			if (!cuda_ok(ld, cudaMemcpyAsync((char *)ld->slabs[dst] + at,
							 (char *)rd->buf[b + (int)(rel / bb)] + in, n,
							 cudaMemcpyHostToDevice, rd->streams[dst]),
				     "cudaMemcpyAsync"))
				return false;
			a += n;
			at += n;
			rel += n;
		}
	}
	for (int k = b; k <= b + (int)((c->len - 1) / bb); k++) {
		if (!cuda_ok(ld, cudaEventRecord(rd->events[k][dst], rd->streams[dst]), "cudaEventRecord"))
			return false;
		rd->used[k] |= 1ULL << dst;
	}
	return true;
}

/* Hands the ranges of rank 0's slab copied from buffer b (rd->runs) to
 * the broadcaster. */
static bool enqueue(struct loader *ld, struct reader *rd, int b)
{
	if (!cuda_ok(ld, cudaEventSynchronize(rd->events[b][0]), "cudaEventSynchronize"))
		return false;
	rd->used[b] &= ~1ULL;
	pthread_mutex_lock(&ld->q_mu);
	while (ld->q_len + rd->nruns > ld->q_cap) {
		size_t cap = ld->q_cap ? ld->q_cap * 2 : 256;
		struct range *q = realloc(ld->q, cap * sizeof(*q));
		if (!q) {
			pthread_mutex_unlock(&ld->q_mu);
			fail(ld, -ENOMEM, "out of memory");
			return false;
		}
		ld->q = q;
		ld->q_cap = cap;
	}
	memcpy(ld->q + ld->q_len, rd->runs, rd->nruns * sizeof(*rd->runs));
	ld->q_len += rd->nruns;
	pthread_cond_signal(&ld->q_cv);
	pthread_mutex_unlock(&ld->q_mu);
	return true;
}

static bool buffer_free(struct loader *ld, struct reader *rd, int b)
{
	for (int r = 0; r < ld->l->nranks; r++)
		if (rd->used[b] & (1ULL << r)) {
			if (!cuda_ok(ld, cudaEventSynchronize(rd->events[b][r]), "cudaEventSynchronize"))
				return false;
		}
	rd->used[b] = 0;
	return true;
}

static void *reader_main(void *arg)
{
	struct reader *rd = arg;
	struct loader *ld = rd->ld;
	struct gpu_load *l = ld->l;
	int b = 0;

	for (;;) {
		size_t i = atomic_fetch_add(&ld->next, 1);
		if (i >= ld->nchunks || ld->failed || l->cancel)
			break;
		const struct chunk *c = &ld->chunks[i];
		/* A chunk larger than a buffer takes them all, from the first. */
		int last = (int)((c->len - 1) / buffer_bytes());
		if (last > 0)
			b = 0;
		bool freed = true;
		for (int k = b; k <= b + last && freed; k++)
			freed = buffer_free(ld, rd, k);
		if (!freed || !read_chunk(ld, c, rd, b))
			break;
		/* Replicated weights go to rank 0 here; the broadcaster sends
		 * each range on to the other GPUs as soon as it is in. */
		if (!copy_chunk(ld, rd, c, b, l->replicated ? 0 : c->rank))
			break;
		if (l->replicated && l->nranks > 1 && rd->nruns && !enqueue(ld, rd, b))
			break;
		b = (b + 1 + last) % BUFS_PER_READER;
	}
	for (int k = 0; k < BUFS_PER_READER; k++)
		buffer_free(ld, rd, k);
	return NULL;
}

static bool reader_init(struct loader *ld, struct reader *rd, int slot, bool pooled)
{
	struct gpu_load *l = ld->l;

	rd->ld = ld;
	rd->pooled = pooled;
	for (int k = 0; k < BUFS_PER_READER; k++) {
		if (pooled && pool[slot][k]) {
			rd->buf[k] = pool[slot][k];
			continue;
		}
		if (!cuda_ok(ld, cudaHostAlloc(&rd->buf[k], buffer_bytes(), cudaHostAllocPortable), "cudaHostAlloc"))
			return false;
		if (pooled)
			pool[slot][k] = rd->buf[k];
	}
	for (int r = 0; r < l->nranks; r++) {
		if (!cuda_ok(ld, cudaSetDevice(l->ranks[r].device), "cudaSetDevice") ||
		    !cuda_ok(ld, cudaStreamCreateWithFlags(&rd->streams[r], cudaStreamNonBlocking),
			     "cudaStreamCreate"))
			return false;
		for (int k = 0; k < BUFS_PER_READER; k++)
			if (!cuda_ok(ld, cudaEventCreateWithFlags(&rd->events[k][r], cudaEventDisableTiming),
				     "cudaEventCreate"))
				return false;
	}
	return true;
}

static void reader_fini(struct loader *ld, struct reader *rd)
{
	for (int r = 0; r < ld->l->nranks; r++) {
		cudaSetDevice(ld->l->ranks[r].device);
		if (rd->streams[r])
			cudaStreamDestroy(rd->streams[r]);
		for (int k = 0; k < BUFS_PER_READER; k++)
			if (rd->events[k][r])
				cudaEventDestroy(rd->events[k][r]);
	}
	for (int k = 0; k < BUFS_PER_READER; k++)
		if (rd->buf[k] && !rd->pooled)
			cudaFreeHost(rd->buf[k]);
	free(rd->runs);
}

/* Sends rank 0's ranges to the other GPUs while the readers go on: NCCL
 * (its communicators are made here, meanwhile), or peer copies without it. */
static void *broadcaster(void *arg)
{
	struct loader *ld = arg;
	struct gpu_load *l = ld->l;
	int devs[RANKS_MAX];
	char err[256];

	for (int r = 0; r < l->nranks; r++) {
		devs[r] = l->ranks[r].device;
		cudaSetDevice(devs[r]);
		if (!cuda_ok(ld, cudaStreamCreateWithFlags(&ld->bstreams[r], cudaStreamNonBlocking),
			     "cudaStreamCreate"))
			return NULL;
	}
	if (nccl_open(devs, l->nranks, &ld->nccl, err, sizeof(err)) < 0) {
		fprintf(stderr, "artfs: %s; copying GPU to GPU without NCCL instead\n", err);
		ld->nccl = NULL;
	}
	for (;;) {
		pthread_mutex_lock(&ld->q_mu);
		while (ld->q_head == ld->q_len && !ld->readers_done && !ld->failed)
			pthread_cond_wait(&ld->q_cv, &ld->q_mu);
		if (ld->q_head == ld->q_len || ld->failed) {
			pthread_mutex_unlock(&ld->q_mu);
			break;
		}
		struct range r = ld->q[ld->q_head++];
		pthread_mutex_unlock(&ld->q_mu);
		if (ld->nccl) {
			int rc = nccl_broadcast(ld->nccl, ld->slabs, r.lo, r.hi - r.lo, ld->bstreams, err,
						sizeof(err));
			if (rc < 0)
				fail(ld, rc, "%s", err);
			continue;
		}
		for (int k = 1; k < l->nranks; k++) {
			cudaSetDevice(devs[k]);
			cuda_ok(ld, cudaMemcpyPeerAsync((char *)ld->slabs[k] + r.lo, devs[k],
							(char *)ld->slabs[0] + r.lo, devs[0], r.hi - r.lo,
							ld->bstreams[k]), "cudaMemcpyPeerAsync");
		}
	}
	for (int r = 0; r < l->nranks; r++) {
		cudaSetDevice(devs[r]);
		cuda_ok(ld, cudaStreamSynchronize(ld->bstreams[r]), "cudaStreamSynchronize");
	}
	l->used_nccl = ld->nccl != NULL;
	return NULL;
}

void gpu_unload(struct gpu_load *l)
{
	for (int r = 0; r < l->nranks; r++) {
		slab_free(l->ranks[r].slab, l->ranks[r].slab_size, l->ranks[r].fd);
		l->ranks[r].slab = NULL;
		l->ranks[r].fd = -1;
	}
}

/* A load has 1..RANKS_MAX ranks. */
static int ranks_check(const struct gpu_load *l, char *err, size_t errlen)
{
	if (l->nranks < 1 || l->nranks > RANKS_MAX) {
		snprintf(err, errlen, "%d ranks: between 1 and %d are supported", l->nranks, RANKS_MAX);
		return -EINVAL;
	}
	return 0;
}

int gpu_alloc(struct gpu_load *l, char *err, size_t errlen)
{
	int rc = ranks_check(l, err, errlen);

	if (rc < 0)
		return rc;
	for (int r = 0; r < l->nranks; r++)
		l->ranks[r].fd = -1;
	for (int r = 0; r < l->nranks; r++) {
		rc = slab_alloc(l->ranks[r].device, l->ranks[r].slab_size, &l->ranks[r].slab,
				&l->ranks[r].fd, err, errlen);
		if (rc < 0) {
			gpu_unload(l);
			return rc;
		}
	}
	return 0;
}

/* One reader per core, up to READERS_MAX. Fewer were measured and were not
 * better: from tmpfs on a 2 x H200 host (32 cores) 16 readers gave 43-44
 * GB/s on one machine and 34-35 on another, where 32 gave 38-39
 * (bench/RESULTS). ARTFS_LOAD_READERS sets it, for measuring. */
static unsigned readers_for(size_t nchunks)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	size_t n = cpus < READERS_MIN ? READERS_MIN : cpus > READERS_MAX ? READERS_MAX : (size_t)cpus;
	unsigned long x = env_number("ARTFS_LOAD_READERS", READERS_MAX);

	if (x)
		n = x;
	return (unsigned)(nchunks < n ? nchunks : n);
}

/* The pool, unless another load (or loader_pool_fill) has it. */
static bool pool_claim(void)
{
	pthread_mutex_lock(&pool_mu);
	bool mine = !pool_busy;
	pool_busy = true;
	pthread_mutex_unlock(&pool_mu);
	return mine;
}

static void pool_release(void)
{
	pthread_mutex_lock(&pool_mu);
	pool_busy = false;
	pthread_mutex_unlock(&pool_mu);
}

void loader_pool_fill(void)
{
	unsigned n = readers_for(SIZE_MAX);

	if (!pool_claim())
		return; /* a load has the pool: it pins what it lacks */
	for (unsigned i = 0; i < n; i++)
		for (int k = 0; k < BUFS_PER_READER; k++)
			if (!pool[i][k] && cudaHostAlloc(&pool[i][k], buffer_bytes(), cudaHostAllocPortable) != cudaSuccess) {
				pool[i][k] = NULL;
				cudaGetLastError(); /* not sticky; the load pins its own */
				goto done;
			}
done:
	pool_release();
}

/* Opens file f of the load, checks that it is the size its header was
 * checked at, and picks its read size (CHUNK_*): broadcast, the size of a
 * buffer; else small from memory, large from a disk. */
static int open_file(struct loader *ld, size_t f, bool broadcast, char *err, size_t errlen)
{
	struct gpu_load *l = ld->l;
	struct stat st;

	ld->fds[f] = open(l->paths[f], O_RDONLY | O_CLOEXEC);
	if (ld->fds[f] < 0) {
		int rc = -errno;
		snprintf(err, errlen, "%s: %s", l->paths[f], strerror(errno));
		return rc;
	}
	bool known = fstat(ld->fds[f], &st) == 0;
	if (l->sizes && (!known || (uint64_t)st.st_size != l->sizes[f])) {
		snprintf(err, errlen, "%s changed since its header was checked", l->paths[f]);
		return -EINVAL;
	}
	bool in_memory = known && source_open(ld->fds[f], l->paths[f], &st, &ld->maps[f]);
	if (!ld->maps[f].base)
		posix_fadvise(ld->fds[f], 0, 0, POSIX_FADV_SEQUENTIAL);
	ld->chunk[f] = chunk_override();
	if (!ld->chunk[f])
		ld->chunk[f] = broadcast ? CHUNK_BUFFER : in_memory ? CHUNK_MEMORY : CHUNK_DISK;
	return 0;
}

/* Every file the pieces come from, open, with its read size. */
static int open_files(struct loader *ld, char *err, size_t errlen)
{
	struct gpu_load *l = ld->l;
	/* Replicated onto several GPUs, every chunk is also a broadcast: those
	 * keep the 16 MiB they were measured with (2 MiB reads were measured
	 * onto one GPU only). */
	const bool broadcast = l->replicated && l->nranks > 1;
	int rc = 0;

	ld->fds = calloc(l->nfiles ? l->nfiles : 1, sizeof(int));
	if (!ld->fds)
		return -ENOMEM;
	for (size_t f = 0; f < l->nfiles; f++)
		ld->fds[f] = -1;
	ld->chunk = calloc(l->nfiles ? l->nfiles : 1, sizeof(*ld->chunk));
	ld->maps = calloc(l->nfiles ? l->nfiles : 1, sizeof(*ld->maps));
	if (!ld->chunk || !ld->maps)
		return -ENOMEM;
	for (size_t f = 0; f < l->nfiles && rc == 0; f++)
		rc = open_file(ld, f, broadcast, err, errlen);
	return rc;
}

/* Replicated onto several GPUs: the broadcaster's thread, started. */
static bool broadcaster_start(struct loader *ld, pthread_t *thread)
{
	if (!ld->l->replicated || ld->l->nranks <= 1)
		return false;
	if (pthread_create(thread, NULL, broadcaster, ld) == 0)
		return true;
	fail(ld, -EAGAIN, "cannot start the broadcast thread");
	return false;
}

/* No more ranges come: the broadcaster sends what is queued and ends. */
static void broadcaster_stop(struct loader *ld, pthread_t thread)
{
	pthread_mutex_lock(&ld->q_mu);
	ld->readers_done = true;
	pthread_cond_signal(&ld->q_cv);
	pthread_mutex_unlock(&ld->q_mu);
	pthread_join(thread, NULL);
}

/* How many readers: readers_for the chunks, at most READERS_DISK when every
 * file is read from a disk (unless ARTFS_LOAD_READERS says). */
static unsigned count_readers(const struct loader *ld)
{
	const struct gpu_load *l = ld->l;
	unsigned n = readers_for(ld->nchunks);
	bool all_disk = l->nfiles > 0 && !getenv("ARTFS_LOAD_READERS");

	for (size_t f = 0; f < l->nfiles && all_disk; f++)
		all_disk = ld->chunk[f] == CHUNK_DISK;
	if (all_disk && n > READERS_DISK)
		n = READERS_DISK; /* more readers of large reads were slower */
	return n;
}

/* Starts n readers, until one cannot start, and waits for those that did. */
static void run_readers(struct loader *ld, struct reader *readers, unsigned n, bool pooled)
{
	for (unsigned i = 0; i < n; i++) {
		if (!reader_init(ld, &readers[i], (int)i, pooled))
			break;
		if (pthread_create(&readers[i].thread, NULL, reader_main, &readers[i]) != 0) {
			fail(ld, -EAGAIN, "cannot start a reader thread");
			break;
		}
		readers[i].started = true;
	}
	for (unsigned i = 0; i < n; i++)
		if (readers[i].started)
			pthread_join(readers[i].thread, NULL);
}

/* Streams every chunk into the slabs: the readers (and, replicated, the
 * broadcaster) run until all is read, one fails or the load is cancelled;
 * then every GPU finishes its copies. Returns the load's result. */
static int stream_files(struct loader *ld, char *err, size_t errlen)
{
	struct gpu_load *l = ld->l;
	struct reader readers[READERS_MAX];
	pthread_t bthread;

	memset(readers, 0, sizeof(readers));
	bool broadcasting = broadcaster_start(ld, &bthread);
	unsigned n = count_readers(ld);
	l->readers = n;
	bool pooled = pool_claim();
	run_readers(ld, readers, n, pooled);
	if (broadcasting)
		broadcaster_stop(ld, bthread);
	for (int r = 0; r < l->nranks; r++) {
		cudaSetDevice(l->ranks[r].device);
		cuda_ok(ld, cudaDeviceSynchronize(), "cudaDeviceSynchronize");
	}
	for (unsigned i = 0; i < READERS_MAX; i++)
		reader_fini(ld, &readers[i]);
	if (pooled)
		pool_release();
	if (l->cancel && !ld->failed)
		fail(ld, -ECANCELED, "load cancelled");
	if (!ld->failed)
		return 0;
	snprintf(err, errlen, "%s", ld->err);
	return ld->error;
}

/* Frees what the load used on the way: streams, NCCL, files, plans. */
static void loader_free(struct loader *ld)
{
	struct gpu_load *l = ld->l;

	for (int r = 0; r < l->nranks; r++)
		if (ld->bstreams[r]) {
			cudaSetDevice(l->ranks[r].device);
			cudaStreamDestroy(ld->bstreams[r]);
		}
	nccl_close(ld->nccl);
	free(ld->q);
	if (ld->fds)
		for (size_t f = 0; f < l->nfiles; f++)
			if (ld->fds[f] >= 0)
				close(ld->fds[f]);
	free(ld->fds);
	if (ld->maps)
		for (size_t f = 0; f < l->nfiles; f++)
			source_unmap(&ld->maps[f]);
	free(ld->maps);
	free(ld->chunk);
	free(ld->chunks);
	pthread_mutex_destroy(&ld->err_mu);
	pthread_mutex_destroy(&ld->q_mu);
	pthread_cond_destroy(&ld->q_cv);
}

int gpu_load(struct gpu_load *l, char *err, size_t errlen)
{
	struct loader ld = { .l = l };
	int rc = ranks_check(l, err, errlen);

	if (rc < 0)
		return rc;
	pthread_mutex_init(&ld.err_mu, NULL);
	pthread_mutex_init(&ld.q_mu, NULL);
	pthread_cond_init(&ld.q_cv, NULL);
	atomic_store(&l->bytes_read, 0);
	l->used_nccl = false;

	if (!l->ranks[0].slab)
		rc = gpu_alloc(l, err, errlen);
	for (int r = 0; r < l->nranks && rc == 0; r++)
		ld.slabs[r] = l->ranks[r].slab;
	if (rc == 0)
		rc = open_files(&ld, err, errlen);
	if (rc == 0 && (rc = plan_chunks(&ld)) < 0)
		snprintf(err, errlen, "out of memory");
	if (rc == 0)
		rc = stream_files(&ld, err, errlen);
	loader_free(&ld);
	if (rc < 0)
		gpu_unload(l); /* on failure nothing stays allocated */
	return rc;
}
