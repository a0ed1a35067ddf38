/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "format/npy.h"

/* numpy.lib.format: MAGIC_LEN 6, ARRAY_ALIGN 64, GROWTH_AXIS_MAX_DIGITS 21. */
#define NPY_MAGIC "\x93NUMPY"
#define NPY_MAGIC_LEN 6
#define NPY_PREFIX_LEN (NPY_MAGIC_LEN + 2 + 2) /* magic, version, u16 length */
#define NPY_ALIGN 64
#define NPY_GROWTH_DIGITS 21

ssize_t npy_header(const struct array_desc *a, uint8_t *buf, size_t cap)
{
	char dict[NPY_HEADER_MAX];
	int n, len;

	/* repr() of the shape tuple: "(16,)" for one axis, "(16, 61, 8)" else. */
	len = snprintf(dict, sizeof(dict), "{'descr': '%s', 'fortran_order': False, 'shape': (",
		       a->dtype);
	for (unsigned i = 0; i < a->ndim; i++) {
		n = snprintf(dict + len, sizeof(dict) - (size_t)len, "%s%llu",
			     i ? ", " : "", (unsigned long long)a->shape[i]);
		len += n;
	}
	n = snprintf(dict + len, sizeof(dict) - (size_t)len, "%s), }", a->ndim == 1 ? "," : "");
	len += n;

	/* Room for the first axis to grow to 21 digits, as numpy.save leaves. */
	char digits[24];
	int first = snprintf(digits, sizeof(digits), "%llu", (unsigned long long)a->shape[0]);
	int growth = NPY_GROWTH_DIGITS - first;
	if (growth < 0)
		growth = 0;

	/* Then spaces and '\n' so that prefix + header is a multiple of 64. */
	size_t hlen = (size_t)len + (size_t)growth + 1;
	size_t padlen = NPY_ALIGN - ((NPY_PREFIX_LEN + hlen) % NPY_ALIGN);
	size_t total = NPY_PREFIX_LEN + hlen + padlen;
	if (total > cap)
		return -ENOSPC;

	size_t dict_total = hlen + padlen; /* little-endian u16 */
	memcpy(buf, NPY_MAGIC, NPY_MAGIC_LEN);
	buf[6] = 1;
	buf[7] = 0;
	buf[8] = (uint8_t)(dict_total & 0xff);
	buf[9] = (uint8_t)(dict_total >> 8);
	memcpy(buf + NPY_PREFIX_LEN, dict, (size_t)len);
	memset(buf + NPY_PREFIX_LEN + len, ' ', (size_t)growth + padlen);
	buf[total - 1] = '\n';
	return (ssize_t)total;
}

int npy_file_size(const struct array_desc *a, uint64_t *size)
{
	uint8_t hdr[NPY_HEADER_MAX];
	uint64_t payload;
	ssize_t h = npy_header(a, hdr, sizeof(hdr));

	if (h < 0)
		return (int)h;
	if (array_payload_len(a, &payload) < 0 || payload > UINT64_MAX - (uint64_t)h)
		return -EOVERFLOW;
	*size = payload + (uint64_t)h;
	return 0;
}
