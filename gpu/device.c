#include "autoconf.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "gpu.h"

int gpu_devices(struct gpu_device *out, int cap, char *err, size_t errlen)
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
