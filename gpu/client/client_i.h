/* SPDX-License-Identifier: Apache-2.0 */
/* What libartfs (gpu/client.c) asks of the GPU: gpu/client_cuda.c with the
 * CUDA runtime, gpu/client_none.c in a build without CUDA (every call says
 * ENODEV, as the daemon's weights do), so that the library and its API are
 * the same in both. Internal: libartfs exports artfs_* only. */
#ifndef ARTFS_CLIENT_GPU_H
#define ARTFS_CLIENT_GPU_H

#include <stddef.h>
#include <stdint.h>

/* Compute capability and driver version of device: 0, or -ENODEV (why in
 * err). */
int client_gpu_describe(int device, uint32_t *cc_major, uint32_t *cc_minor, uint32_t *driver,
			char *err, size_t errlen);
/* The calling thread's current device. */
int client_gpu_current(void);
/* Maps the slab of a descriptor (not taken) of size bytes on the current
 * device: 0, -EBADF, -EIO or -ENODEV (why in err). */
int client_gpu_import(int fd, uint64_t size, void **ptr, char *err, size_t errlen);
void client_gpu_unmap(void *ptr, uint64_t size);

#endif
