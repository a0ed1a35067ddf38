/* SPDX-License-Identifier: Apache-2.0 */
/* GPU-direct publish (DESIGN.md §4.3): another process's tensors, handed over
 * as CUDA IPC handles, copied device to device into a slab of the daemon's
 * own: on the same GPU, or peer to peer over NVLink when the target is
 * another one. The handles are open only for the copy. */
#include "autoconf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "gpu/gpu.h"
#include "gpu/slab.h"

#define STREAMS 4
#define PIECE (256ull << 20)   /* copies are cut into pieces spread over the streams */
#define DEVICES_MAX 64

/* cuMemGetAddressRange (driver API, v2), reached through the runtime so that
 * the daemon needs no link to libcuda. */
typedef int (*range_fn)(unsigned long long *base, size_t *size, unsigned long long ptr);

static range_fn address_range(void)
{
	static range_fn fn;
	static int tried;
	enum cudaDriverEntryPointQueryResult q;
	void *f = NULL;

	if (!tried) {
		tried = 1;
		if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &f, 12000, cudaEnableDefault,
						     &q) == cudaSuccess && q == cudaDriverEntryPointSuccess)
			fn = (range_fn)f;
	}
	return fn;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

struct opened {
	void *ptr;
	size_t size;
};

static void close_all(int device, struct opened *o, size_t n)
{
	cudaSetDevice(device);
	for (size_t i = 0; i < n; i++)
		if (o[i].ptr)
			cudaIpcCloseMemHandle(o[i].ptr);
}

/* The source GPU, by its UUID, and the target, by its index (-1: the
 * source), among this daemon's GPUs. */
static int find_gpus(const struct gpu_publish *p, int *src, int *dst, char *err, size_t errlen)
{
	struct gpu_device devs[DEVICES_MAX];
	char e2[256];
	int n = gpu_devices(devs, DEVICES_MAX, e2, sizeof(e2));

	*src = *dst = -1;
	if (n < 0) {
		snprintf(err, errlen, "%s", e2);
		return -ENODEV;
	}
	for (int i = 0; i < n; i++) {
		if (memcmp(devs[i].uuid, p->source_uuid, 16) == 0)
			*src = devs[i].index;
		if (devs[i].index == p->target_device)
			*dst = devs[i].index;
	}
	if (*src < 0) {
		snprintf(err, errlen, "the source GPU is not one of this daemon's %d GPUs", n);
		return -ENODEV;
	}
	if (p->target_device < 0)
		*dst = *src;
	if (*dst < 0) {
		snprintf(err, errlen, "no GPU %d", p->target_device);
		return -EINVAL;
	}
	return 0;
}

/* Opens every handle on the target GPU and learns the size of each
 * allocation (range: cuMemGetAddressRange). */
static int open_handles(const struct gpu_publish *p, struct opened *o, range_fn range, char *err,
			size_t errlen)
{
	const int src = p->source_device, dst = p->dst->device;

	/* The handles are opened in the target's context, with peer access to
	 * the source enabled first: the copies then run over NVLink from the
	 * target's own streams (opened in the source's context they ran at a
	 * tenth of the peer rate). */
	if (src != dst) {
		int can = 0;
		cudaDeviceCanAccessPeer(&can, dst, src);
		cudaSetDevice(dst);
		if (can && cudaDeviceEnablePeerAccess(src, 0) != cudaSuccess)
			cudaGetLastError(); /* already enabled */
	}
	cudaError_t e = cudaSetDevice(dst);
	for (size_t i = 0; i < p->nhandles && e == cudaSuccess; i++) {
		cudaIpcMemHandle_t h;
		memcpy(&h, p->handles[i].ipc_handle, sizeof(h));
		e = cudaIpcOpenMemHandle(&o[i].ptr, h, cudaIpcMemLazyEnablePeerAccess);
		if (e != cudaSuccess) {
			o[i].ptr = NULL;
			cudaGetLastError();
			snprintf(err, errlen, "IPC handle %zu does not open on GPU %d: %s", i, dst,
				 cudaGetErrorString(e));
			return -EBADMSG;
		}
		unsigned long long base = 0;
		if (range(&base, &o[i].size, (unsigned long long)(uintptr_t)o[i].ptr) != 0 ||
		    base != (unsigned long long)(uintptr_t)o[i].ptr) {
			snprintf(err, errlen, "IPC handle %zu: its allocation's size is unknown", i);
			return -EBADMSG;
		}
	}
	if (e != cudaSuccess) {
		snprintf(err, errlen, "GPU %d: %s", src, cudaGetErrorString(e));
		return -ENODEV;
	}
	return 0;
}

/* Every copy reads inside its handle's allocation and writes inside the slab. */
static int check_copies(const struct gpu_publish *p, const struct opened *o, char *err, size_t errlen)
{
	for (size_t i = 0; i < p->ncopies; i++) {
		const struct gpu_copy *c = &p->copies[i];
		if (c->handle >= p->nhandles || c->size > o[c->handle].size ||
		    c->src_offset > o[c->handle].size - c->size) {
			snprintf(err, errlen, "tensor copy %zu: %llu bytes at %llu are beyond its allocation "
				 "of %zu bytes", i, (unsigned long long)c->size,
				 (unsigned long long)c->src_offset,
				 c->handle < p->nhandles ? o[c->handle].size : (size_t)0);
			return -EBADMSG;
		}
		if (c->slab_offset + c->size > p->dst->slab_size) {
			snprintf(err, errlen, "tensor copy %zu lies beyond the slab", i);
			return -EINVAL;
		}
	}
	return 0;
}

/* Runs every copy into the slab, cut into PIECE bytes spread over the
 * target's streams, and waits for them all. */
static int copy_all(const struct gpu_publish *p, const struct opened *o, char *err, size_t errlen)
{
	cudaStream_t streams[STREAMS] = { 0 };
	cudaError_t e = cudaSetDevice(p->dst->device);
	unsigned k = 0;

	for (int s = 0; s < STREAMS && e == cudaSuccess; s++)
		e = cudaStreamCreateWithFlags(&streams[s], cudaStreamNonBlocking);
	for (size_t i = 0; i < p->ncopies && e == cudaSuccess; i++) {
		const struct gpu_copy *c = &p->copies[i];
		for (uint64_t at = 0; at < c->size && e == cudaSuccess; at += PIECE) {
			uint64_t len = c->size - at < PIECE ? c->size - at : PIECE;
			e = cudaMemcpyAsync((char *)p->dst->slab + c->slab_offset + at,
					    (char *)o[c->handle].ptr + c->src_offset + at, len,
					    cudaMemcpyDefault, streams[k++ % STREAMS]);
		}
	}
	for (int s = 0; s < STREAMS; s++)
		if (streams[s]) {
			cudaError_t e3 = cudaStreamSynchronize(streams[s]);
			if (e == cudaSuccess)
				e = e3;
			cudaStreamDestroy(streams[s]);
		}
	if (e != cudaSuccess) {
		snprintf(err, errlen, "copy GPU %d -> GPU %d: %s", p->source_device, p->dst->device,
			 cudaGetErrorString(e));
		return -EIO;
	}
	return 0;
}

int gpu_publish(struct gpu_publish *p, char *err, size_t errlen)
{
	int src, dst;
	int rc = find_gpus(p, &src, &dst, err, errlen);

	if (rc < 0)
		return rc;
	p->source_device = src;
	p->peer = src != dst;
	p->dst->device = dst;
	p->dst->slab = NULL;
	p->dst->fd = -1;
	range_fn range = address_range();
	if (!range) {
		snprintf(err, errlen, "the driver has no cuMemGetAddressRange");
		return -EIO;
	}
	struct opened *o = calloc(p->nhandles ? p->nhandles : 1, sizeof(*o));
	if (!o) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	double t_open = now_s();
	rc = open_handles(p, o, range, err, errlen);
	if (rc == 0)
		rc = check_copies(p, o, err, errlen);
	double t_alloc = now_s();
	p->open_seconds = t_alloc - t_open;
	if (rc == 0)
		rc = slab_alloc(dst, p->dst->slab_size, &p->dst->slab, &p->dst->fd, err, errlen);
	p->alloc_seconds = now_s() - t_alloc;
	double t0 = now_s();
	if (rc == 0)
		rc = copy_all(p, o, err, errlen);
	p->copy_seconds = now_s() - t0;
	close_all(dst, o, p->nhandles);
	free(o);
	if (rc < 0) {
		slab_free(p->dst->slab, p->dst->slab_size, p->dst->fd);
		p->dst->slab = NULL;
		p->dst->fd = -1;
	}
	return rc;
}
