/* The load pipeline: reader threads pread checkpoint chunks into pinned host
 * buffers (several reads in flight), copy each tensor's part to its slab
 * offset with cudaMemcpyAsync. Weights replicated on several GPUs are read
 * into rank 0 only and then broadcast to the others over NCCL (made while
 * the disk is read), so every byte is read from disk once. */
#include "autoconf.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "gpu.h"
#include "nccl.h"
#include "slab.h"

#define CHUNK (64u << 20)       /* bytes of one read */
#define READERS_MAX 4
#define BUFS_PER_READER 2
#define RANKS_MAX 64

struct chunk {
	uint32_t file;
	int rank;                  /* whose pieces (rank 0 when replicated) */
	uint64_t off, len;         /* the file range */
	size_t first;              /* first of rank's pieces it overlaps */
};

struct loader {
	struct gpu_load *l;
	struct chunk *chunks;
	size_t nchunks;
	_Atomic size_t next;
	int *fds;
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
	pthread_t thread;
	bool started;
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

/* Splits every source rank's pieces into file ranges of at most CHUNK. */
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
			uint64_t pos = p->file_offset, left = p->size;
			while (left) {
				if (!cur || cur->file != p->file || cur->off + cur->len != pos || cur->len == CHUNK) {
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
				uint64_t take = CHUNK - cur->len < left ? CHUNK - cur->len : left;
				cur->len += take;
				pos += take;
				left -= take;
			}
		}
	}
	return 0;
}

static bool read_chunk(struct loader *ld, const struct chunk *c, void *buf)
{
	char *p = buf;
	uint64_t done = 0;

	while (done < c->len) {
		ssize_t n = pread(ld->fds[c->file], p + done, c->len - done, (off_t)(c->off + done));
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

/* Copies the chunk's parts of the source rank's pieces to rank dst's slab;
 * returns the slab range the chunk covered. */
static bool copy_chunk(struct loader *ld, struct reader *rd, const struct chunk *c, int b, int dst,
		       uint64_t *lo, uint64_t *hi)
{
	const struct gpu_rank *src = &ld->l->ranks[c->rank];
	const struct gpu_rank *to = &ld->l->ranks[dst];
	uint64_t end = c->off + c->len;

	if (!cuda_ok(ld, cudaSetDevice(to->device), "cudaSetDevice"))
		return false;
	*lo = UINT64_MAX;
	*hi = 0;
	for (size_t i = c->first; i < src->npieces; i++) {
		const struct gpu_piece *p = &src->pieces[i];
		if (p->file != c->file || p->file_offset >= end)
			break;
		uint64_t a = p->file_offset > c->off ? p->file_offset : c->off;
		uint64_t z = p->file_offset + p->size < end ? p->file_offset + p->size : end;
		if (z <= a)
			continue;
		uint64_t at = p->slab_offset + (a - p->file_offset);
		if (!cuda_ok(ld, cudaMemcpyAsync((char *)ld->slabs[dst] + at, (char *)rd->buf[b] + (a - c->off),
						 z - a, cudaMemcpyHostToDevice, rd->streams[dst]),
			     "cudaMemcpyAsync"))
			return false;
		if (at < *lo)
			*lo = at;
		if (at + (z - a) > *hi)
			*hi = at + (z - a);
	}
	if (!cuda_ok(ld, cudaEventRecord(rd->events[b][dst], rd->streams[dst]), "cudaEventRecord"))
		return false;
	rd->used[b] |= 1ULL << dst;
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
		if (!buffer_free(ld, rd, b) || !read_chunk(ld, c, rd->buf[b]))
			break;
		uint64_t lo, hi;
		/* Replicated weights go to rank 0 here; the others get rank 0's
		 * slab over NCCL once everything is in (see spread). */
		if (!copy_chunk(ld, rd, c, b, l->replicated ? 0 : c->rank, &lo, &hi))
			break;
		b = (b + 1) % BUFS_PER_READER;
	}
	for (int k = 0; k < BUFS_PER_READER; k++)
		buffer_free(ld, rd, k);
	return NULL;
}

static bool reader_init(struct loader *ld, struct reader *rd)
{
	struct gpu_load *l = ld->l;

	rd->ld = ld;
	for (int k = 0; k < BUFS_PER_READER; k++)
		if (!cuda_ok(ld, cudaHostAlloc(&rd->buf[k], CHUNK, cudaHostAllocPortable), "cudaHostAlloc"))
			return false;
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
		if (rd->buf[k])
			cudaFreeHost(rd->buf[k]);
}

/* NCCL's communicators take a while to make: done while the readers read. */
static void *open_nccl(void *arg)
{
	struct loader *ld = arg;
	struct gpu_load *l = ld->l;
	int devs[RANKS_MAX];
	char err[256];

	for (int r = 0; r < l->nranks; r++)
		devs[r] = l->ranks[r].device;
	if (nccl_open(devs, l->nranks, &ld->nccl, err, sizeof(err)) < 0) {
		fprintf(stderr, "artfs: %s; copying GPU to GPU without NCCL instead\n", err);
		ld->nccl = NULL;
		return NULL;
	}
	for (int r = 0; r < l->nranks; r++) {
		cudaSetDevice(l->ranks[r].device);
		if (cudaStreamCreateWithFlags(&ld->bstreams[r], cudaStreamNonBlocking) != cudaSuccess) {
			nccl_close(ld->nccl);
			ld->nccl = NULL;
			return NULL;
		}
	}
	return NULL;
}

#define SPREAD_CHUNK (1ULL << 30)

/* Rank 0 holds every replicated byte: broadcast its slab to the other GPUs
 * (NCCL; peer copies where NCCL is missing). Disk is read once. */
static void spread(struct loader *ld)
{
	struct gpu_load *l = ld->l;
	uint64_t size = l->ranks[0].slab_size;
	char err[256];

	if (ld->nccl) {
		for (uint64_t off = 0; off < size && !ld->failed; off += SPREAD_CHUNK) {
			uint64_t len = size - off < SPREAD_CHUNK ? size - off : SPREAD_CHUNK;
			int rc = nccl_broadcast(ld->nccl, ld->slabs, off, len, ld->bstreams, err, sizeof(err));
			if (rc < 0)
				fail(ld, rc, "%s", err);
		}
		l->used_nccl = true;
	} else {
		for (int r = 1; r < l->nranks && !ld->failed; r++) {
			cudaSetDevice(l->ranks[r].device);
			cuda_ok(ld, cudaMemcpyPeer(ld->slabs[r], l->ranks[r].device, ld->slabs[0],
						   l->ranks[0].device, size), "cudaMemcpyPeer");
		}
	}
	for (int r = 0; r < l->nranks; r++) {
		cudaSetDevice(l->ranks[r].device);
		cuda_ok(ld, cudaDeviceSynchronize(), "cudaDeviceSynchronize");
	}
}

void gpu_unload(struct gpu_load *l)
{
	for (int r = 0; r < l->nranks; r++) {
		slab_free(l->ranks[r].device, l->ranks[r].slab);
		l->ranks[r].slab = NULL;
	}
}

int gpu_load(struct gpu_load *l, char *err, size_t errlen)
{
	struct loader ld = { .l = l };
	struct reader readers[READERS_MAX];
	int rc;

	memset(readers, 0, sizeof(readers));
	if (l->nranks < 1 || l->nranks > RANKS_MAX) {
		snprintf(err, errlen, "%d ranks: between 1 and %d are supported", l->nranks, RANKS_MAX);
		return -EINVAL;
	}
	pthread_mutex_init(&ld.err_mu, NULL);
	atomic_store(&l->bytes_read, 0);
	l->used_nccl = false;

	for (int r = 0; r < l->nranks; r++) {
		rc = slab_alloc(l->ranks[r].device, l->ranks[r].slab_size, &l->ranks[r].slab,
				l->ranks[r].ipc, err, errlen);
		if (rc < 0)
			goto out;
		ld.slabs[r] = l->ranks[r].slab;
	}
	ld.fds = calloc(l->nfiles ? l->nfiles : 1, sizeof(int));
	if (!ld.fds) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t f = 0; f < l->nfiles; f++)
		ld.fds[f] = -1;
	for (size_t f = 0; f < l->nfiles; f++) {
		ld.fds[f] = open(l->paths[f], O_RDONLY | O_CLOEXEC);
		if (ld.fds[f] < 0) {
			rc = -errno;
			snprintf(err, errlen, "%s: %s", l->paths[f], strerror(errno));
			goto out;
		}
		posix_fadvise(ld.fds[f], 0, 0, POSIX_FADV_SEQUENTIAL);
	}
	rc = plan_chunks(&ld);
	if (rc < 0) {
		snprintf(err, errlen, "out of memory");
		goto out;
	}
	pthread_t nccl_thread;
	bool nccl_started = l->replicated && l->nranks > 1 &&
			    pthread_create(&nccl_thread, NULL, open_nccl, &ld) == 0;

	unsigned n = ld.nchunks < READERS_MAX ? (unsigned)ld.nchunks : READERS_MAX;
	l->readers = n;
	for (unsigned i = 0; i < n; i++) {
		if (!reader_init(&ld, &readers[i]))
			break;
		if (pthread_create(&readers[i].thread, NULL, reader_main, &readers[i]) != 0) {
			fail(&ld, -EAGAIN, "cannot start a reader thread");
			break;
		}
		readers[i].started = true;
	}
	for (unsigned i = 0; i < n; i++)
		if (readers[i].started)
			pthread_join(readers[i].thread, NULL);
	for (int r = 0; r < l->nranks; r++) {
		cudaSetDevice(l->ranks[r].device);
		cuda_ok(&ld, cudaDeviceSynchronize(), "cudaDeviceSynchronize");
	}
	for (unsigned i = 0; i < READERS_MAX; i++)
		reader_fini(&ld, &readers[i]);
	if (nccl_started) {
		pthread_join(nccl_thread, NULL);
		if (!ld.failed && !l->cancel)
			spread(&ld);
	}
	if (l->cancel && !ld.failed)
		fail(&ld, -ECANCELED, "load cancelled");
	rc = 0;
	if (ld.failed) {
		rc = ld.error;
		snprintf(err, errlen, "%s", ld.err);
	}
out:
	if (ld.nccl) {
		for (int r = 0; r < l->nranks; r++)
			if (ld.bstreams[r]) {
				cudaSetDevice(l->ranks[r].device);
				cudaStreamDestroy(ld.bstreams[r]);
			}
		nccl_close(ld.nccl);
	}
	if (ld.fds)
		for (size_t f = 0; f < l->nfiles; f++)
			if (ld.fds[f] >= 0)
				close(ld.fds[f]);
	free(ld.fds);
	free(ld.chunks);
	if (rc < 0)
		gpu_unload(l);
	pthread_mutex_destroy(&ld.err_mu);
	return rc;
}
