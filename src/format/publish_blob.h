/* SPDX-License-Identifier: Apache-2.0 */
/* The blob of a GPU-direct publish (include/artfs/artfs.h, DESIGN.md §4.3):
 * parsed and checked without CUDA, so that every bound is tested (and
 * fuzzable) where there is no GPU. Whether the handles open and the offsets
 * lie inside their allocations is checked by gpu_publish. */
#ifndef ARTFS_WBLOB_H
#define ARTFS_WBLOB_H

#include <stddef.h>
#include <stdint.h>

#include "artfs/artfs.h"
#include "format/safetensors.h"

/* The most bytes one blob may have (about 186,000 tensors). */
#define WBLOB_BYTES_MAX (64u << 20)

struct wblob_tensor {
	struct safetensors_tensor t;   /* name points into the blob; offset unused */
	uint32_t handle;
	uint64_t src_offset;
};

struct wblob {
	struct artfs_publish_header head;          /* a copy, strings NUL-terminated */
	const struct artfs_publish_handle *handles; /* into the blob */
	struct wblob_tensor *tensors;              /* tensor_count, blob order */
	size_t nhandles, ntensors;
};

/* Checks buf[0..len) and fills b (tensors allocated; names point into buf).
 * Returns 0, -EBADMSG (malformed; err says why), -EINVAL (unknown ABI, rank
 * not below tp_size) or -ENOMEM. */
int wblob_parse(const uint8_t *buf, size_t len, struct wblob *b, char *err, size_t errlen);
void wblob_free(struct wblob *b);

#endif
