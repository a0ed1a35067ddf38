/* SPDX-License-Identifier: Apache-2.0 */
/* The record of ready GPU weights that the holder keeps across daemons
 * (DESIGN.md §8): what a next daemon needs to serve them without reading
 * the checkpoint again (every rank's device, fingerprint, slab size, the
 * manifest and status as they were), beside the slabs' descriptors the
 * holder also keeps. Written by the daemon that made the weights ready,
 * read by each next one: encoded and decoded here without CUDA, every
 * field bounded (a record that does not decode is dropped, and logged).
 *
 * The bytes: "artfs-weights 1\n", one line of JSON, then the manifest. */
#ifndef ARTFS_WRECORD_H
#define ARTFS_WRECORD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "artfs/artfs.h"

#define WRECORD_RANKS_MAX 64
#define WRECORD_BYTES_MAX (1ull << 30)
#define WRECORD_STATUS_MAX 8192

struct wrecord_rank {
	int device;
	uint8_t uuid[16];
	uint64_t slab_size;          /* a multiple of ARTFS_SLAB_ALIGN */
	uint64_t bytes;              /* tensor bytes */
	struct artfs_fingerprint fp;
};

struct wrecord {
	char version[ARTFS_VERSION_NAME_MAX + 1];
	char quant_method[64];
	bool quant_block_fp8;
	char *status;                /* the status file's text when ready (malloc'd) */
	char *manifest;              /* manifest.json, NUL-terminated (malloc'd) */
	size_t manifest_len;
	int nranks;
	struct wrecord_rank ranks[WRECORD_RANKS_MAX];
};

/* The record's bytes (malloc'd; *len set), or NULL (out of memory, or a
 * field out of bounds). */
char *wrecord_encode(const struct wrecord *r, size_t *len);
/* Fills r from len bytes: 0, or -EINVAL with why in err (r holds nothing). */
int wrecord_decode(const void *buf, size_t len, struct wrecord *r, char *err, size_t errlen);
void wrecord_free(struct wrecord *r);

#endif
