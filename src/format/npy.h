/* SPDX-License-Identifier: Apache-2.0 */
/* The one place that turns an array description into .npy bytes. */
#ifndef ARTFS_NPY_H
#define ARTFS_NPY_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "format/array.h"

/* Longest header npy_header can produce (8 axes of 20 digits), rounded up. */
#define NPY_HEADER_MAX 384

/* Writes magic, version 1.0, length and the header dict exactly as
 * numpy.save does (growth padding and 64-byte alignment included).
 * Returns the header length (a multiple of 64) or -ENOSPC if cap is short. */
ssize_t npy_header(const struct array_desc *a, uint8_t *buf, size_t cap);

/* Header length + payload length: the st_size of the served file. */
int npy_file_size(const struct array_desc *a, uint64_t *size);

#endif
