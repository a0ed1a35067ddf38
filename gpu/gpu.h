/* The CUDA side of the weight cache (DESIGN.md §4): devices, slabs with
 * their IPC handles, and the loader that streams checkpoint bytes
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
	/* filled by gpu_load */
	void *slab;
	uint8_t ipc[ARTFS_IPC_HANDLE_SIZE];
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

/* Allocates every rank's slab, loads all pieces, exports the IPC handles.
 * Blocking; meant for a loader thread. On failure nothing stays allocated. */
int gpu_load(struct gpu_load *l, char *err, size_t errlen);
/* Frees the slabs of a finished load. */
void gpu_unload(struct gpu_load *l);

#endif
