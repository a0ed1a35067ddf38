/* Device slabs: one cudaMalloc each, sized in 2 MiB units, exported as a
 * CUDA IPC handle that other processes open with cudaIpcOpenMemHandle. */
#ifndef ARTFS_GPU_SLAB_H
#define ARTFS_GPU_SLAB_H

#include <stddef.h>
#include <stdint.h>

#include "artfs/artfs.h"

int slab_alloc(int device, uint64_t size, void **ptr, uint8_t ipc[ARTFS_IPC_HANDLE_SIZE],
	       char *err, size_t errlen);
void slab_free(int device, void *ptr);

#endif
