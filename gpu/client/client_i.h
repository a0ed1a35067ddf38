/* SPDX-License-Identifier: Apache-2.0 */
/* What libartfs (gpu/client.c) asks of the GPU: gpu/client_cuda.c with the
 * CUDA runtime, gpu/client_none.c in a build without CUDA (every call says
 * ENODEV, as the daemon's weights do), so that the library and its API are
 * the same in both. Internal: libartfs exports artfs_* only. */
#ifndef ARTFS_CLIENT_GPU_H
#define ARTFS_CLIENT_GPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "artfs/artfs.h"

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
/* Waits for all work on the current device (before a flip unmaps). */
int client_gpu_sync(char *err, size_t errlen);

/* ---- in place: slabs mapped in a range of addresses (range.c) ---------------------
 *
 * What the driver does for a range: cuda.c gives CUDA's VMM calls, the unit
 * tests a fake. A handle is an imported allocation (a mapping of it can
 * come and go while the handle is kept). Each call returns 0 or -errno with
 * why in err. */
struct range_driver {
	int (*import)(int fd, uint64_t *handle, char *err, size_t errlen);
	void (*release)(uint64_t handle);
	int (*reserve)(uint64_t size, uint64_t *va, char *err, size_t errlen);
	void (*free)(uint64_t va, uint64_t size);
	/* maps and grants access; nothing stays mapped on failure */
	int (*map)(uint64_t va, uint64_t size, uint64_t handle, char *err, size_t errlen);
	void (*unmap)(uint64_t va, uint64_t size);
};

const struct range_driver *client_gpu_range_driver(void);

/* A range of device addresses that holds a rank's slabs, one after the
 * other, each mapped to the handle of one version's slab. */
struct client_range {
	uint64_t base, len;
	bool owned;                  /* reserved by libartfs: freed with it */
	uint32_t count;
	uint64_t at[ARTFS_SLABS_MAX];     /* each slab's address */
	uint64_t size[ARTFS_SLABS_MAX];
	uint64_t handle[ARTFS_SLABS_MAX]; /* what is mapped there, kept until replaced */
	bool holding;                /* handle[] are held (a version was mapped) */
	bool mapped[ARTFS_SLABS_MAX];
};

/* Places count slabs of these sizes in [base, base + len), or in a range
 * reserved here when base is 0: -EINVAL (base not 2 MiB aligned, a size
 * not a multiple of 2 MiB), -ENOSPC (len too short: err says what it
 * needs), or the driver's. Nothing is mapped yet. */
int range_open(struct client_range *r, const struct range_driver *d, uint64_t base, uint64_t len,
	       const uint64_t *sizes, uint32_t count, char *err, size_t errlen);
/* Maps the slabs of the descriptors (not taken), one per slab, in place:
 * the first version, or another one (a flip): the same count and sizes,
 * else -EXDEV. A flip imports every descriptor first, then unmaps each
 * old slab and maps the new one; on any failure the old mappings are
 * restored and the old handles kept. On success the old handles are
 * released. */
int range_map(struct client_range *r, const struct range_driver *d, const int *fds,
	      const uint64_t *sizes, uint32_t count, char *err, size_t errlen);
/* Unmaps, releases the handles, frees the range if it was reserved here. */
void range_close(struct client_range *r, const struct range_driver *d);

/* ---- an attachment (client.c, flip.c) --------------------------------------------- */

struct artfs_tensor;

struct artfs_weights {
	int fd;                   /* the open rank<k> of the version mapped */
	int device;
	uint32_t slab_count;
	void *slabs[ARTFS_SLABS_MAX];
	uint64_t slab_size[ARTFS_SLABS_MAX];
	uint8_t layout[ARTFS_LAYOUT_SIZE];
	size_t count;
	struct artfs_tensor *tensors;
	char *strings;            /* names and dtypes */
	/* in place (flip.c): the slabs in w->range, and where to find versions */
	bool in_place;
	struct client_range range;
	char *mount;
	int rank;
};

/* The attach ioctl on the open rank file fd, then the slabs its token
 * grants (fds, sizes; their count returned), again while the daemon that
 * answered went before the slabs were fetched (it restarted). With
 * want_layout, a reply of another layout is -EXDEV before any descriptor
 * is fetched. */
int client_attach_fetch(int fd, const char *mount, const char *path,
			const struct artfs_fingerprint *expect, const uint8_t *want_layout,
			int fds[ARTFS_SLABS_MAX], uint64_t slab_size[ARTFS_SLABS_MAX],
			uint8_t layout[ARTFS_LAYOUT_SIZE], char *err, size_t errlen);
/* w's tensors from <mount>/<wv>/weights/manifest.json, rank's entry,
 * bounded by w's slabs. */
int client_load_manifest(struct artfs_weights *w, const char *mount, const char *wv, int rank,
			 char *err, size_t errlen);

#endif
