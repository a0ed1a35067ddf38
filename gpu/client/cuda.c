/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "gpu/client/client_i.h"
#include "gpu/vmm.h"

int client_gpu_describe(int device, uint32_t *cc_major, uint32_t *cc_minor, uint32_t *driver,
			char *err, size_t errlen)
{
	struct cudaDeviceProp p;
	int version = 0;
	cudaError_t e = cudaGetDeviceProperties(&p, device);

	if (e == cudaSuccess)
		e = cudaDriverGetVersion(&version);
	if (e != cudaSuccess) {
		snprintf(err, errlen, "GPU %d: %s", device, cudaGetErrorString(e));
		return -ENODEV;
	}
	*cc_major = (uint32_t)p.major;
	*cc_minor = (uint32_t)p.minor;
	*driver = (uint32_t)version;
	return 0;
}

int client_gpu_current(void)
{
	int device = 0;

	cudaGetDevice(&device);
	return device;
}

int client_gpu_import(int fd, uint64_t size, void **ptr, char *err, size_t errlen)
{
	return vmm_import(fd, size, ptr, err, errlen);
}

void client_gpu_unmap(void *ptr, uint64_t size)
{
	vmm_unmap(ptr, size);
}

int client_gpu_sync(char *err, size_t errlen)
{
	cudaError_t e = cudaDeviceSynchronize();

	if (e == cudaSuccess)
		return 0;
	snprintf(err, errlen, "cudaDeviceSynchronize: %s", cudaGetErrorString(e));
	return -EIO;
}

static const struct range_driver cuda_range = {
	.import = vmm_handle_import,
	.release = vmm_handle_release,
	.reserve = vmm_reserve,
	.free = vmm_reserve_free,
	.map = vmm_map_at,
	.unmap = vmm_unmap_at,
};

const struct range_driver *client_gpu_range_driver(void)
{
	return &cuda_range;
}
