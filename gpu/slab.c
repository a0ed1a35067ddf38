#include "autoconf.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "slab.h"

int slab_alloc(int device, uint64_t size, void **ptr, uint8_t ipc[ARTFS_IPC_HANDLE_SIZE],
	       char *err, size_t errlen)
{
	cudaIpcMemHandle_t h;
	cudaError_t e;

	_Static_assert(sizeof(cudaIpcMemHandle_t) == ARTFS_IPC_HANDLE_SIZE, "IPC handle size");
	if (size % ARTFS_SLAB_ALIGN) {
		snprintf(err, errlen, "slab of %llu bytes is not a multiple of 2 MiB",
			 (unsigned long long)size);
		return -EINVAL;
	}
	*ptr = NULL;
	e = cudaSetDevice(device);
	if (e == cudaSuccess)
		e = cudaMalloc(ptr, size);
	if (e == cudaErrorMemoryAllocation) {
		size_t free_b = 0, total_b = 0;
		cudaGetLastError(); /* not sticky: clear it */
		cudaMemGetInfo(&free_b, &total_b);
		snprintf(err, errlen, "GPU %d lacks room: %.2f GiB needed, %.2f GiB free of %.2f GiB "
			 "(unload a version or wait for its engines to detach)", device,
			 (double)size / (1 << 30), (double)free_b / (1 << 30), (double)total_b / (1 << 30));
		*ptr = NULL;
		return -ENOMEM;
	}
	if (e != cudaSuccess) {
		snprintf(err, errlen, "GPU %d: cudaMalloc of %llu bytes: %s", device,
			 (unsigned long long)size, cudaGetErrorString(e));
		*ptr = NULL;
		return -ENODEV;
	}
	e = cudaIpcGetMemHandle(&h, *ptr);
	if (e != cudaSuccess) {
		snprintf(err, errlen, "GPU %d: cudaIpcGetMemHandle: %s", device, cudaGetErrorString(e));
		cudaFree(*ptr);
		*ptr = NULL;
		return -EIO;
	}
	memcpy(ipc, &h, ARTFS_IPC_HANDLE_SIZE);
	return 0;
}

void slab_free(int device, void *ptr)
{
	if (!ptr)
		return;
	cudaSetDevice(device);
	cudaFree(ptr);
}
