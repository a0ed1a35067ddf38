/* SPDX-License-Identifier: Apache-2.0 */
/* GPU memory that outlives the process that allocated it (DESIGN.md §8):
 * CUDA VMM allocations (cuMemCreate) shared by POSIX file descriptors. A
 * descriptor alone keeps the memory (the holder keeps one per slab), a
 * process that receives it maps the same memory (vmm_import), and the
 * memory goes when the last descriptor and the last mapping are gone.
 * The driver API is reached through the runtime's entry points, so that
 * neither the daemon nor libartfs links libcuda. */
#ifndef ARTFS_GPU_VMM_H
#define ARTFS_GPU_VMM_H

#include <stddef.h>
#include <stdint.h>

/* size bytes (a multiple of the allocation granularity, 2 MiB here) on
 * device, mapped read-write at *ptr for device and every GPU that can reach
 * it as a peer, and its descriptor in *fd. 0, -ENOMEM (no room: why in err
 * with the room needed and free), -ENODEV (no VMM on this driver or
 * device), -EIO. Nothing stays allocated on failure. */
int vmm_create(int device, uint64_t size, void **ptr, int *fd, char *err, size_t errlen);
/* Unmaps what vmm_create or vmm_import mapped (ptr NULL: nothing). */
void vmm_unmap(void *ptr, uint64_t size);
/* Maps the allocation of a descriptor (not taken: the caller closes it,
 * the mapping keeps the memory) read-write on the calling thread's
 * current device, and on the allocation's own when that is another. size
 * is the allocation's, as its exporter said. 0, -EBADF (not such a
 * descriptor), -ENODEV, -EIO (why in err). */
int vmm_import(int fd, uint64_t size, void **ptr, char *err, size_t errlen);

/* The steps of an attachment that keeps its addresses across versions
 * (libartfs's flip in place): an allocation imported and kept as a handle
 * (a mapping of it can come and go), a range of addresses reserved, a
 * handle mapped at an address of such a range (read-write on the calling
 * thread's device and the allocation's own; nothing stays mapped on
 * failure), and the reverse of each. 0, -EBADF, -ENODEV or -EIO (why in
 * err). */
int vmm_handle_import(int fd, uint64_t *handle, char *err, size_t errlen);
void vmm_handle_release(uint64_t handle);
int vmm_reserve(uint64_t size, uint64_t *va, char *err, size_t errlen);
void vmm_reserve_free(uint64_t va, uint64_t size);
int vmm_map_at(uint64_t va, uint64_t size, uint64_t handle, char *err, size_t errlen);
void vmm_unmap_at(uint64_t va, uint64_t size);

#endif
