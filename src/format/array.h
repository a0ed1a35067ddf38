/* SPDX-License-Identifier: Apache-2.0 */
/* Array descriptions: numpy dtype strings, shapes and byte counts. */
#ifndef ARTFS_ARRAY_H
#define ARTFS_ARRAY_H

#include <stddef.h>
#include <stdint.h>

#include "artfs/artfs.h"

struct array_desc {
	char dtype[4];        /* numpy dtype.str, e.g. "|u1", "<u2" */
	uint8_t itemsize;     /* bytes per element */
	uint8_t ndim;         /* 1..ARTFS_NDIM_MAX */
	uint64_t shape[ARTFS_NDIM_MAX];
};

/* Accepts a numpy dtype.str of kind b, i, u or f with 1, 2, 4 or 8 bytes
 * ("|b1", "|i1", "|u1", "<u2", ">i4", "<f8", ...); fills dtype and itemsize.
 * Returns 0 or -EINVAL. */
int array_dtype_set(struct array_desc *a, const char *dtype);

/* prod(shape) * itemsize; -EOVERFLOW when it does not fit in 64 bits. */
int array_payload_len(const struct array_desc *a, uint64_t *len);

/* "4,3,2" into buf (at least ARRAY_SHAPE_TEXT_MAX bytes). */
#define ARRAY_SHAPE_TEXT_MAX (ARTFS_NDIM_MAX * 21 + 1)
void array_shape_text(const struct array_desc *a, char *buf, size_t len);

#endif
