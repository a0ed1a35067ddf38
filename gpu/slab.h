/* SPDX-License-Identifier: Apache-2.0 */
/* Device slabs: one CUDA VMM allocation each (gpu/vmm.c), sized in 2 MiB
 * units, mapped here and shared by its POSIX descriptor. */
#ifndef ARTFS_GPU_SLAB_H
#define ARTFS_GPU_SLAB_H

#include <stddef.h>
#include <stdint.h>

#include "artfs/artfs.h"

/* A slab of size bytes on device: mapped at *ptr, its descriptor in *fd.
 * 0, -EINVAL (size not a multiple of 2 MiB), -ENOMEM, -ENODEV, -EIO. */
int slab_alloc(int device, uint64_t size, void **ptr, int *fd, char *err, size_t errlen);
/* Unmaps the slab (ptr may be NULL: a slab known by its descriptor only)
 * and closes its descriptor (fd may be -1). */
void slab_free(void *ptr, uint64_t size, int fd);

#endif
