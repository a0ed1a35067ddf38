/* The load pipeline. A checkpoint already in host memory (tmpfs, page cache)
 * takes the registered path below: its pages are pinned in place and copied
 * by the GPU, no CPU copy. Otherwise reader threads pread checkpoint chunks
 * into pinned host buffers (several reads in flight), copy each tensor's
 * part to its slab offset with cudaMemcpyAsync. From the page cache or tmpfs one thread
 * copies at a fraction of the host->device rate, so there is one reader per
 * core (up to READERS_MAX), each with its own pinned buffers; the buffers
 * stay pinned between loads (pinning a GiB costs tens of ms). Weights replicated on several GPUs are read
 * into rank 0 only; a broadcaster thread sends each range on to the others
 * over NCCL while the disk is read, so every byte is read from disk once. */
#include "autoconf.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "gpu.h"
#include "nccl.h"
#include "slab.h"

#define CHUNK (16u << 20)       /* bytes of one read */
#define READERS_MIN 4
#define READERS_MAX 32
#define BUFS_PER_READER 3
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

/* The registered path (host memory sources): one window of a file, pinned
 * in place with cudaHostRegister and copied straight to the slabs. */
struct wcopy {
	size_t win;                /* the window it copies from */
	int rank;                  /* whose slab */
	uint64_t off;              /* file offset */
	uint64_t len;
	uint64_t slab_offset;
};

struct window {
	uint32_t file;
	uint64_t off, len;         /* the file range registered */
	size_t first, ncopies;     /* its copies in wcopies */
};

struct loader {
	struct gpu_load *l;
	struct chunk *chunks;
	size_t nchunks;
	_Atomic size_t next;
	_Atomic size_t wnext;      /* the registered path's next window */
	int *fds;
	/* Replicated weights: ranges of rank 0's slab waiting to be broadcast. */
	pthread_mutex_t q_mu;
	pthread_cond_t q_cv;
	struct range { uint64_t lo, hi; } *q;
	size_t q_len, q_cap, q_head;
	bool readers_done;
	struct nccl_group *nccl;
	cudaStream_t bstreams[RANKS_MAX];
	void *slabs[RANKS_MAX];
	/* The registered path: each file mapped, windows of it registered. */
	void **maps;
	uint64_t *map_len;
	struct window *wins;
	size_t nwins;
	struct wcopy *wcopies;
	size_t nwcopies;
	unsigned cudareg_flags;
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

/* Hands a range of rank 0's slab, copied from buffer b, to the broadcaster. */
static bool enqueue_range(struct loader *ld, uint64_t lo, uint64_t hi)
{
	pthread_mutex_lock(&ld->q_mu);
	if (ld->q_len == ld->q_cap) {
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
	ld->q[ld->q_len++] = (struct range){ lo, hi };
	pthread_cond_signal(&ld->q_cv);
	pthread_mutex_unlock(&ld->q_mu);
	return true;
}

static bool enqueue(struct loader *ld, struct reader *rd, int b, uint64_t lo, uint64_t hi)
{
	if (!cuda_ok(ld, cudaEventSynchronize(rd->events[b][0]), "cudaEventSynchronize"))
		return false;
	rd->used[b] &= ~1ULL;
	return enqueue_range(ld, lo, hi);
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
		/* Replicated weights go to rank 0 here; the broadcaster sends
		 * each range on to the other GPUs as soon as it is in. */
		if (!copy_chunk(ld, rd, c, b, l->replicated ? 0 : c->rank, &lo, &hi))
			break;
		if (l->replicated && l->nranks > 1 && hi > lo && !enqueue(ld, rd, b, lo, hi))
			break;
		b = (b + 1) % BUFS_PER_READER;
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
		if (!cuda_ok(ld, cudaHostAlloc(&rd->buf[k], CHUNK, cudaHostAllocPortable), "cudaHostAlloc"))
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

/* ---- the registered path ------------------------------------------------------- */

/* A checkpoint already in host memory (tmpfs, or the page cache) is not
 * copied by the CPU at all: each window of the file's mapping is pinned in
 * place with cudaHostRegister and the GPU copies from it, several workers
 * registering windows while the copies of earlier ones run. */
#define WINDOW_DEFAULT (512ull << 20)
#define REG_WORKERS_DEFAULT 8
#define REG_WORKERS_MAX 32
#define REG_DEPTH 2            /* windows a worker has registered at once */
#define RESIDENT_SAMPLE 256    /* pages mincore looks at per file */
#ifndef TMPFS_MAGIC
#define TMPFS_MAGIC 0x01021994
#endif

static uint64_t env_u64(const char *name, uint64_t dflt, uint64_t lo, uint64_t hi)
{
	const char *v = getenv(name);
	char *end;

	if (!v || !*v)
		return dflt;
	unsigned long long x = strtoull(v, &end, 10);
	return *end || x < lo || x > hi ? dflt : (uint64_t)x;
}

/* Maps every file; returns whether all of them are in host memory: on
 * tmpfs, or a sample of their pages resident in the page cache. */
static bool map_files(struct loader *ld, bool *resident)
{
	struct gpu_load *l = ld->l;
	long page = sysconf(_SC_PAGESIZE);

	*resident = true;
	ld->maps = calloc(l->nfiles ? l->nfiles : 1, sizeof(*ld->maps));
	ld->map_len = calloc(l->nfiles ? l->nfiles : 1, sizeof(*ld->map_len));
	if (!ld->maps || !ld->map_len)
		return false;
	for (size_t f = 0; f < l->nfiles; f++) {
		struct stat st;
		if (fstat(ld->fds[f], &st) < 0)
			return false;
		if (st.st_size == 0)
			continue;
		void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, ld->fds[f], 0);
		if (m == MAP_FAILED)
			return false;
		ld->maps[f] = m;
		ld->map_len[f] = (uint64_t)st.st_size;
		struct statfs sf;
		if (!*resident || (fstatfs(ld->fds[f], &sf) == 0 && sf.f_type == TMPFS_MAGIC))
			continue;
		uint64_t npages = ((uint64_t)st.st_size + (uint64_t)page - 1) / (uint64_t)page;
		for (unsigned i = 0; i < RESIDENT_SAMPLE && *resident; i++) {
			unsigned char vec = 0;
			uint64_t pg = npages * i / RESIDENT_SAMPLE;
			if (mincore((char *)m + pg * (uint64_t)page, (size_t)page, &vec) < 0 || !(vec & 1))
				*resident = false;
		}
	}
	return true;
}

static void unmap_files(struct loader *ld)
{
	if (ld->maps)
		for (size_t f = 0; f < ld->l->nfiles; f++)
			if (ld->maps[f])
				munmap(ld->maps[f], (size_t)ld->map_len[f]);
	free(ld->maps);
	free(ld->map_len);
	ld->maps = NULL;
	ld->map_len = NULL;
}

static int wcopy_cmp(const void *a, const void *b)
{
	const struct wcopy *x = a, *y = b;

	if (x->win != y->win)
		return x->win < y->win ? -1 : 1;
	if (x->rank != y->rank)
		return x->rank < y->rank ? -1 : 1;
	return x->off < y->off ? -1 : x->off > y->off;
}

/* Cuts the files into windows of wsize bytes (at multiples of wsize, so no
 * two windows share a page) and every source rank's pieces into copies, one
 * window each; keeps the windows that something is copied from. */
static int plan_windows(struct loader *ld, uint64_t wsize)
{
	struct gpu_load *l = ld->l;
	int sources = l->replicated ? 1 : l->nranks;
	size_t cap = 0, *base = calloc(l->nfiles + 1, sizeof(*base));

	if (!base)
		return -ENOMEM;
	for (size_t f = 0; f < l->nfiles; f++)
		base[f + 1] = base[f] + (size_t)((ld->map_len[f] + wsize - 1) / wsize);
	for (int r = 0; r < sources; r++) {
		const struct gpu_rank *rk = &l->ranks[r];
		for (size_t i = 0; i < rk->npieces; i++) {
			const struct gpu_piece *p = &rk->pieces[i];
			uint64_t pos = p->file_offset, left = p->size;
			if (p->file >= l->nfiles || p->file_offset + p->size > ld->map_len[p->file]) {
				free(base);
				return -EINVAL;
			}
			while (left) {
				uint64_t k = pos / wsize, take = (k + 1) * wsize - pos;
				if (take > left)
					take = left;
				if (ld->nwcopies == cap) {
					cap = cap ? cap * 2 : 256;
					struct wcopy *c = realloc(ld->wcopies, cap * sizeof(*c));
					if (!c) {
						free(base);
						return -ENOMEM;
					}
					ld->wcopies = c;
				}
				ld->wcopies[ld->nwcopies++] = (struct wcopy){
					.win = base[p->file] + (size_t)k, .rank = r, .off = pos, .len = take,
					.slab_offset = p->slab_offset + (pos - p->file_offset) };
				pos += take;
				left -= take;
			}
		}
	}
	qsort(ld->wcopies, ld->nwcopies, sizeof(*ld->wcopies), wcopy_cmp);
	ld->wins = calloc(ld->nwcopies ? ld->nwcopies : 1, sizeof(*ld->wins));
	if (!ld->wins) {
		free(base);
		return -ENOMEM;
	}
	size_t f = 0;
	for (size_t i = 0; i < ld->nwcopies; i++) {
		struct wcopy *c = &ld->wcopies[i];
		if (i == 0 || c->win != ld->wcopies[i - 1].win) {
			while (base[f + 1] <= c->win)
				f++;
			uint64_t off = (uint64_t)(c->win - base[f]) * wsize;
			uint64_t len = ld->map_len[f] - off < wsize ? ld->map_len[f] - off : wsize;
			ld->wins[ld->nwins++] = (struct window){ .file = (uint32_t)f, .off = off, .len = len,
								 .first = i };
		}
		ld->wins[ld->nwins - 1].ncopies++;
	}
	for (size_t i = 0; i < ld->nwins; i++)
		for (size_t k = 0; k < ld->wins[i].ncopies; k++)
			ld->wcopies[ld->wins[i].first + k].win = i;
	free(base);
	return 0;
}

struct held {
	void *ptr;                 /* registered (or, when that failed, plain) */
	uint64_t len;
	bool registered;
	uint64_t bytes;
	uint64_t used;             /* bit r: copies to rank r pending */
	uint64_t lo, hi;           /* rank 0's slab range, for the broadcast */
	cudaEvent_t ev[RANKS_MAX];
};

struct regworker {
	struct loader *ld;
	cudaStream_t streams[RANKS_MAX];
	struct held held[REG_DEPTH];
	pthread_t thread;
	bool started;
};

static _Atomic int reg_fallback_said;

static bool held_finish(struct loader *ld, struct held *h)
{
	struct gpu_load *l = ld->l;
	bool ok = true;

	for (int r = 0; r < l->nranks; r++)
		if (h->used & (1ULL << r))
			ok = cuda_ok(ld, cudaEventSynchronize(h->ev[r]), "cudaEventSynchronize") && ok;
	h->used = 0;
	if (h->ptr && h->registered)
		cudaHostUnregister(h->ptr);
	h->ptr = NULL;
	atomic_fetch_add(&l->bytes_read, h->bytes);
	h->bytes = 0;
	if (ok && l->replicated && l->nranks > 1 && h->hi > h->lo)
		ok = enqueue_range(ld, h->lo, h->hi);
	return ok;
}

static bool window_copy(struct loader *ld, struct regworker *wk, const struct window *win,
			struct held *h)
{
	struct gpu_load *l = ld->l;
	long page = sysconf(_SC_PAGESIZE);

	h->ptr = (char *)ld->maps[win->file] + win->off;
	h->len = (win->len + (uint64_t)page - 1) / (uint64_t)page * (uint64_t)page;
	cudaError_t e = cudaHostRegister(h->ptr, h->len, ld->cudareg_flags);
	h->registered = e == cudaSuccess;
	if (!h->registered) {
		/* Copied from pageable memory instead: slower, still right. */
		cudaGetLastError();
		if (!atomic_exchange(&reg_fallback_said, 1))
			fprintf(stderr, "artfs: cudaHostRegister of %s: %s; copying from pageable memory\n",
				l->paths[win->file], cudaGetErrorString(e));
	}
	h->lo = UINT64_MAX;
	h->hi = 0;
	for (size_t k = 0; k < win->ncopies; k++) {
		const struct wcopy *c = &ld->wcopies[win->first + k];
		int dst = l->replicated ? 0 : c->rank;
		if (!cuda_ok(ld, cudaSetDevice(l->ranks[dst].device), "cudaSetDevice") ||
		    !cuda_ok(ld, cudaMemcpyAsync((char *)ld->slabs[dst] + c->slab_offset,
						 (char *)ld->maps[win->file] + c->off, c->len,
						 cudaMemcpyHostToDevice, wk->streams[dst]), "cudaMemcpyAsync"))
			return false;
		h->used |= 1ULL << dst;
		h->bytes += c->len;
		if (dst == 0) {
			if (c->slab_offset < h->lo)
				h->lo = c->slab_offset;
			if (c->slab_offset + c->len > h->hi)
				h->hi = c->slab_offset + c->len;
		}
	}
	for (int r = 0; r < l->nranks; r++)
		if (h->used & (1ULL << r)) {
			cudaSetDevice(l->ranks[r].device);
			if (!cuda_ok(ld, cudaEventRecord(h->ev[r], wk->streams[r]), "cudaEventRecord"))
				return false;
		}
	return true;
}

static void *regworker_main(void *arg)
{
	struct regworker *wk = arg;
	struct loader *ld = wk->ld;
	int s = 0;

	for (;;) {
		size_t i = atomic_fetch_add(&ld->wnext, 1);
		if (i >= ld->nwins || ld->failed || ld->l->cancel)
			break;
		struct held *h = &wk->held[s];
		if ((h->ptr && !held_finish(ld, h)) || !window_copy(ld, wk, &ld->wins[i], h))
			break;
		s = (s + 1) % REG_DEPTH;
	}
	for (int k = 0; k < REG_DEPTH; k++)
		if (wk->held[k].ptr)
			held_finish(ld, &wk->held[k]);
	return NULL;
}

static bool regworker_init(struct loader *ld, struct regworker *wk)
{
	struct gpu_load *l = ld->l;

	wk->ld = ld;
	for (int r = 0; r < l->nranks; r++) {
		if (!cuda_ok(ld, cudaSetDevice(l->ranks[r].device), "cudaSetDevice") ||
		    !cuda_ok(ld, cudaStreamCreateWithFlags(&wk->streams[r], cudaStreamNonBlocking),
			     "cudaStreamCreate"))
			return false;
		for (int k = 0; k < REG_DEPTH; k++)
			if (!cuda_ok(ld, cudaEventCreateWithFlags(&wk->held[k].ev[r], cudaEventDisableTiming),
				     "cudaEventCreate"))
				return false;
	}
	return true;
}

static void regworker_fini(struct loader *ld, struct regworker *wk)
{
	for (int r = 0; r < ld->l->nranks; r++) {
		cudaSetDevice(ld->l->ranks[r].device);
		if (wk->streams[r])
			cudaStreamDestroy(wk->streams[r]);
		for (int k = 0; k < REG_DEPTH; k++)
			if (wk->held[k].ev[r])
				cudaEventDestroy(wk->held[k].ev[r]);
	}
}

/* Whether the registered path applies: ARTFS_LOAD_PATH=read never,
 * =register always (where the GPUs can register read-only memory),
 * otherwise when every file is in host memory. Maps the files when it does. */
static bool use_registered(struct loader *ld)
{
	struct gpu_load *l = ld->l;
	const char *mode = getenv("ARTFS_LOAD_PATH");
	bool resident;

	if (mode && strcmp(mode, "read") == 0)
		return false;
	for (int r = 0; r < l->nranks; r++) {
		int ro = 0;
		if (cudaDeviceGetAttribute(&ro, cudaDevAttrHostRegisterReadOnlySupported,
					   l->ranks[r].device) != cudaSuccess || !ro) {
			cudaGetLastError();
			return false;
		}
	}
	if (!map_files(ld, &resident) || !(resident || (mode && strcmp(mode, "register") == 0))) {
		unmap_files(ld);
		return false;
	}
	ld->cudareg_flags = cudaHostRegisterPortable | cudaHostRegisterReadOnly;
	return true;
}

/* Runs the registered path's workers to the end of the load. */
static void load_registered(struct loader *ld)
{
	struct gpu_load *l = ld->l;
	uint64_t wsize = env_u64("ARTFS_REG_WINDOW_MB", WINDOW_DEFAULT >> 20, 2, 1 << 16) << 20;
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	uint64_t n = env_u64("ARTFS_REG_WORKERS", REG_WORKERS_DEFAULT, 1, REG_WORKERS_MAX);
	struct regworker *wk;

	wsize = (wsize + ARTFS_SLAB_ALIGN - 1) / ARTFS_SLAB_ALIGN * ARTFS_SLAB_ALIGN;
	int rc = plan_windows(ld, wsize);
	if (rc < 0) {
		fail(ld, rc, rc == -ENOMEM ? "out of memory" : "a tensor lies beyond its file");
		return;
	}
	if (cpus > 0 && n > (uint64_t)cpus)
		n = (uint64_t)cpus;
	if (n > ld->nwins)
		n = ld->nwins ? ld->nwins : 1;
	l->readers = (unsigned)n;
	wk = calloc(n, sizeof(*wk));
	if (!wk) {
		fail(ld, -ENOMEM, "out of memory");
		return;
	}
	for (uint64_t i = 0; i < n; i++) {
		if (!regworker_init(ld, &wk[i]))
			break;
		if (pthread_create(&wk[i].thread, NULL, regworker_main, &wk[i]) != 0) {
			fail(ld, -EAGAIN, "cannot start a load thread");
			break;
		}
		wk[i].started = true;
	}
	for (uint64_t i = 0; i < n; i++)
		if (wk[i].started)
			pthread_join(wk[i].thread, NULL);
	for (uint64_t i = 0; i < n; i++)
		regworker_fini(ld, &wk[i]);
	free(wk);
}

void gpu_unload(struct gpu_load *l)
{
	for (int r = 0; r < l->nranks; r++) {
		slab_free(l->ranks[r].device, l->ranks[r].slab);
		l->ranks[r].slab = NULL;
	}
}

int gpu_alloc(struct gpu_load *l, char *err, size_t errlen)
{
	if (l->nranks < 1 || l->nranks > RANKS_MAX) {
		snprintf(err, errlen, "%d ranks: between 1 and %d are supported", l->nranks, RANKS_MAX);
		return -EINVAL;
	}
	for (int r = 0; r < l->nranks; r++) {
		int rc = slab_alloc(l->ranks[r].device, l->ranks[r].slab_size, &l->ranks[r].slab,
				    l->ranks[r].ipc, err, errlen);
		if (rc < 0) {
			gpu_unload(l);
			return rc;
		}
	}
	return 0;
}

static unsigned readers_for(size_t nchunks)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	size_t n = cpus < READERS_MIN ? READERS_MIN : cpus > READERS_MAX ? READERS_MAX : (size_t)cpus;

	return (unsigned)(nchunks < n ? nchunks : n);
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
	pthread_mutex_init(&ld.q_mu, NULL);
	pthread_cond_init(&ld.q_cv, NULL);
	atomic_store(&l->bytes_read, 0);
	l->used_nccl = false;

	if (!l->ranks[0].slab) {
		rc = gpu_alloc(l, err, errlen);
		if (rc < 0)
			goto out;
	}
	for (int r = 0; r < l->nranks; r++)
		ld.slabs[r] = l->ranks[r].slab;
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
		struct stat st;
		if (l->sizes && (fstat(ld.fds[f], &st) < 0 || (uint64_t)st.st_size != l->sizes[f])) {
			rc = -EINVAL;
			snprintf(err, errlen, "%s changed since its header was checked", l->paths[f]);
			goto out;
		}
		posix_fadvise(ld.fds[f], 0, 0, POSIX_FADV_SEQUENTIAL);
	}
	rc = plan_chunks(&ld);
	if (rc < 0) {
		snprintf(err, errlen, "out of memory");
		goto out;
	}
	pthread_t bthread;
	bool broadcasting = false;
	if (l->replicated && l->nranks > 1) {
		broadcasting = pthread_create(&bthread, NULL, broadcaster, &ld) == 0;
		if (!broadcasting)
			fail(&ld, -EAGAIN, "cannot start the broadcast thread");
	}

	bool registered = !ld.failed && use_registered(&ld);
	l->host_path = registered ? "register" : "read";
	if (registered)
		load_registered(&ld);
	unsigned n = registered ? 0 : readers_for(ld.nchunks);
	if (!registered)
		l->readers = n;
	bool pooled = false;
	if (n) {
		pthread_mutex_lock(&pool_mu);
		pooled = !pool_busy;
		pool_busy = true;
		pthread_mutex_unlock(&pool_mu);
	}
	for (unsigned i = 0; i < n; i++) {
		if (!reader_init(&ld, &readers[i], (int)i, pooled))
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
	if (broadcasting) {
		pthread_mutex_lock(&ld.q_mu);
		ld.readers_done = true;
		pthread_cond_signal(&ld.q_cv);
		pthread_mutex_unlock(&ld.q_mu);
		pthread_join(bthread, NULL);
	}
	for (int r = 0; r < l->nranks; r++) {
		cudaSetDevice(l->ranks[r].device);
		cuda_ok(&ld, cudaDeviceSynchronize(), "cudaDeviceSynchronize");
	}
	for (unsigned i = 0; i < READERS_MAX; i++)
		reader_fini(&ld, &readers[i]);
	if (pooled) {
		pthread_mutex_lock(&pool_mu);
		pool_busy = false;
		pthread_mutex_unlock(&pool_mu);
	}
	if (l->cancel && !ld.failed)
		fail(&ld, -ECANCELED, "load cancelled");
	rc = 0;
	if (ld.failed) {
		rc = ld.error;
		snprintf(err, errlen, "%s", ld.err);
	}
out:
	for (int r = 0; r < l->nranks; r++)
		if (ld.bstreams[r]) {
			cudaSetDevice(l->ranks[r].device);
			cudaStreamDestroy(ld.bstreams[r]);
		}
	nccl_close(ld.nccl);
	free(ld.q);
	if (ld.fds)
		for (size_t f = 0; f < l->nfiles; f++)
			if (ld.fds[f] >= 0)
				close(ld.fds[f]);
	free(ld.fds);
	free(ld.chunks);
	free(ld.wins);
	free(ld.wcopies);
	unmap_files(&ld);
	if (rc < 0)
		gpu_unload(l);
	pthread_mutex_destroy(&ld.err_mu);
	pthread_mutex_destroy(&ld.q_mu);
	pthread_cond_destroy(&ld.q_cv);
	return rc;
}
