/* SPDX-License-Identifier: Apache-2.0 */
/* The CUDA side of the weight cache (DESIGN.md §4): devices, slabs (CUDA
 * VMM allocations with a POSIX descriptor each, DESIGN.md §8), and the loader that streams checkpoint bytes
 * disk -> pinned host buffers -> GPU. Built only when CUDA is found;
 * callers see plain C types and negative errnos. */
#ifndef ARTFS_GPU_H
#define ARTFS_GPU_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "artfs/artfs.h"

struct gpu_device {
	int index;
	uint8_t uuid[16];
	int cc_major, cc_minor;
	int driver_version;
	uint64_t total_mem;
	char name[96];
};

/* Fills up to cap devices; returns how many, or -ENODEV (no driver, no
 * device) with the reason in err. */
int gpu_devices(struct gpu_device *out, int cap, char *err, size_t errlen);

/* Starts readying every GPU in the background (contexts, peer access) so
 * that the first load or publish does not pay for it, after delay_ms (a
 * daemon that takes over waits, so that engines attaching just after a
 * restart do not make their contexts beside it); stop waits for it.
 * Called once the daemon has daemonized. */
void gpu_warmup_start(unsigned delay_ms);
void gpu_warmup_stop(void);

/* One tensor's bytes: where they are in which file, where they go in the slab. */
struct gpu_piece {
	uint32_t file;
	uint64_t file_offset;
	uint64_t size;
	uint64_t slab_offset;
};

struct gpu_rank {
	int device;
	uint64_t slab_size;          /* a multiple of ARTFS_SLAB_ALIGN */
	const struct gpu_piece *pieces;  /* in file order; with replicated, rank 0's serve all */
	size_t npieces;
	/* filled by gpu_alloc (or a publish): the slab mapped in this process,
	 * and its descriptor (cuMemExportToShareableHandle), which engines
	 * import and the holder keeps. A slab taken over from a daemon before
	 * has the descriptor alone (slab NULL). -1: none. */
	void *slab;
	int fd;
};

struct gpu_load {
	const char *const *paths;    /* the files pieces refer to */
	const uint64_t *sizes;       /* their sizes when their headers were checked */
	size_t nfiles;
	struct gpu_rank *ranks;
	int nranks;
	bool replicated;             /* every rank gets rank 0's pieces: read once, then broadcast */
	_Atomic uint64_t bytes_read; /* progress: bytes read from disk so far */
	_Atomic int cancel;          /* set to stop a load early */
	/* what the load did, for status and tests */
	bool used_nccl;
	unsigned readers;
};

/* Allocates every rank's slab and exports its descriptor, at once, so that
 * a load that does not fit fails before it starts: -ENOMEM with the room
 * needed and free in err. Nothing stays allocated on failure. */
int gpu_alloc(struct gpu_load *l, char *err, size_t errlen);
/* Loads all pieces into the slabs (allocating them first unless gpu_alloc
 * did). Blocking; meant for a loader thread. On failure nothing stays
 * allocated. */
int gpu_load(struct gpu_load *l, char *err, size_t errlen);
/* Lets go of the slabs of a finished load (unmaps them, closes their
 * descriptors; the memory goes once no process maps it or holds one). */
void gpu_unload(struct gpu_load *l);

/* ---- GPU-direct publish (DESIGN.md §4.3) ---- */

/* One device-to-device copy: bytes of a source allocation to a slab offset. */
struct gpu_copy {
	uint32_t handle;             /* index into gpu_publish.handles */
	uint64_t src_offset;         /* into that allocation */
	uint64_t size;
	uint64_t slab_offset;
};

struct gpu_publish {
	const struct artfs_publish_handle *handles;
	size_t nhandles;
	uint8_t source_uuid[16];
	int target_device;           /* the daemon's GPU index, or -1: the source's */
	const struct gpu_copy *copies;
	size_t ncopies;
	struct gpu_rank *dst;        /* slab_size set; device, slab and fd filled */
	/* filled by gpu_publish */
	int source_device;
	bool peer;                   /* copied from another GPU */
	double open_seconds;         /* opening the IPC handles */
	double alloc_seconds;        /* the slab's cudaMalloc */
	double copy_seconds;         /* the copies alone (handles open, slab allocated) */
};

/* Opens the IPC handles on the source GPU, checks every copy against its
 * allocation's size, allocates the slab on the target GPU and copies; returns
 * when every byte is in the slab, with the handles closed again. -ENODEV (no
 * GPU support, source GPU unknown), -EINVAL (no such target GPU), -EBADMSG (a
 * handle that does not open, a range beyond its allocation), -ENOMEM (no
 * room on the target), -EIO (a copy failed). On failure nothing stays
 * allocated. */
int gpu_publish(struct gpu_publish *p, char *err, size_t errlen);

#endif
