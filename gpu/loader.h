/* SPDX-License-Identifier: Apache-2.0 */
/* The loader's side of the GPU warm-up (gpu/device.c). */
#ifndef ARTFS_GPU_LOADER_H
#define ARTFS_GPU_LOADER_H

/* Pins the loader's host buffers (READERS x 3 x 16 MiB) ahead of the first
 * load; returns at once if a load holds them. */
void loader_pool_fill(void);

#endif
