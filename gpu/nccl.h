/* SPDX-License-Identifier: Apache-2.0 */
/* NCCL, loaded when a replicated load first needs it: a daemon that never
 * broadcasts runs where libnccl is absent. */
#ifndef ARTFS_GPU_NCCL_H
#define ARTFS_GPU_NCCL_H

#include <stddef.h>

#include <cuda_runtime_api.h>

/* One communicator per device of devs, all in this process. */
struct nccl_group;

int nccl_open(const int *devs, int n, struct nccl_group **out, char *err, size_t errlen);
/* Broadcasts bytes [off, off+len) of rank 0's buffer into every rank's
 * buffer at the same offset, on each rank's stream. */
int nccl_broadcast(struct nccl_group *g, void *const *bufs, size_t off, size_t len,
		   cudaStream_t *streams, char *err, size_t errlen);
void nccl_close(struct nccl_group *g);

#endif
