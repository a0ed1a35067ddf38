/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "gpu/gpu.h"
#include "gpu/loader.h"

/* The devices do not change while the daemon runs: listed once (each
 * cudaGetDeviceProperties costs a while), then from this copy. */
#define CACHE_MAX 64
static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static struct gpu_device cache[CACHE_MAX];
static int cached = -1;

static int list_devices(struct gpu_device *out, int cap, char *err, size_t errlen);

int gpu_devices(struct gpu_device *out, int cap, char *err, size_t errlen)
{
	int n;

	pthread_mutex_lock(&cache_mu);
	if (cached < 0) {
		n = list_devices(cache, CACHE_MAX, err, errlen);
		if (n > 0)
			cached = n;
	}
	n = cached;
	pthread_mutex_unlock(&cache_mu);
	if (n < 0)
		return list_devices(out, cap, err, errlen);
	if (n > cap)
		n = cap;
	memcpy(out, cache, (size_t)n * sizeof(*out));
	return n;
}

/* Readies every GPU before the first load or publish needs it: its primary
 * context made, peer access enabled between every pair that can (a
 * context takes a tenth of a second or more per GPU), and the loader's
 * pinned buffers. In the background:
 * the mount does not wait for it. */
static pthread_t warm_thread;
static bool warm_started;
static _Atomic int warm_stop;
static unsigned warm_delay_ms;

static void *warmup_main(void *arg)
{
	struct gpu_device devs[CACHE_MAX];
	char err[256];

	(void)arg;
	/* Not even the driver before the delay: a process that opened it takes
	 * tens of milliseconds more to end (the GPU host: 55 ms with the driver
	 * open, 270 ms with a context and the pinned buffers), and its holder
	 * learns of its death only then. */
	for (unsigned waited = 0; waited < warm_delay_ms && !warm_stop; waited += 10)
		nanosleep(&(struct timespec){ .tv_nsec = 10 * 1000 * 1000 }, NULL);
	int n = warm_stop ? 0 : gpu_devices(devs, CACHE_MAX, err, sizeof(err));
	for (int i = 0; i < n && !warm_stop; i++)
		if (cudaSetDevice(devs[i].index) != cudaSuccess || cudaFree(NULL) != cudaSuccess)
			cudaGetLastError();
	for (int i = 0; i < n && !warm_stop; i++)
		for (int j = 0; j < n; j++) {
			int can = 0;
			if (i == j || cudaDeviceCanAccessPeer(&can, devs[i].index, devs[j].index) != cudaSuccess ||
			    !can)
				continue;
			cudaSetDevice(devs[i].index);
			if (cudaDeviceEnablePeerAccess(devs[j].index, 0) != cudaSuccess)
				cudaGetLastError(); /* already enabled */
		}
	if (n > 0 && !warm_stop)
		loader_pool_fill();
	return NULL;
}

void gpu_warmup_start(unsigned delay_ms)
{
	warm_delay_ms = delay_ms;
	if (!warm_started)
		warm_started = pthread_create(&warm_thread, NULL, warmup_main, NULL) == 0;
}

void gpu_warmup_stop(void)
{
	if (!warm_started)
		return;
	warm_stop = 1;
	pthread_join(warm_thread, NULL);
	warm_started = false;
}

static int list_devices(struct gpu_device *out, int cap, char *err, size_t errlen)
{
	int count = 0, driver = 0;
	cudaError_t e = cudaGetDeviceCount(&count);

	if (e != cudaSuccess || count == 0) {
		snprintf(err, errlen, "no CUDA device: %s",
			 e != cudaSuccess ? cudaGetErrorString(e) : "none found");
		return -ENODEV;
	}
	cudaDriverGetVersion(&driver);
	int n = 0;
	for (int i = 0; i < count && n < cap; i++) {
		struct cudaDeviceProp p;
		if (cudaGetDeviceProperties(&p, i) != cudaSuccess)
			continue;
		struct gpu_device *d = &out[n++];
		memset(d, 0, sizeof(*d));
		d->index = i;
		memcpy(d->uuid, p.uuid.bytes, 16);
		d->cc_major = p.major;
		d->cc_minor = p.minor;
		d->driver_version = driver;
		d->total_mem = p.totalGlobalMem;
		snprintf(d->name, sizeof(d->name), "%.95s", p.name);
	}
	return n;
}
