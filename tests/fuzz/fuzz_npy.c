/* SPDX-License-Identifier: Apache-2.0 */
/* .npy headers (npy_header, npy_file_size) over array descriptions built
 * from the input, and numpy dtype strings (array_dtype_set), the parser
 * behind the envelope's "dtype". Every header must be what numpy.save
 * writes: magic, version 1.0, a length that matches, the dict with this
 * dtype and shape, padding to a multiple of 64 ending in '\n'. */
#include "autoconf.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "format/array.h"
#include "format/npy.h"
#include "fuzz.h"

static const char *const known[] = {
	"|b1", "|i1", "|u1", "<i2", ">i2", "<u2", ">u2", "<f2", ">f2", "<i4", ">u4", "<f4",
	"<i8", ">i8", "<u8", "<f8", ">f8",
};

/* Independent reading of a dtype string: the rules of array.h. */
static bool dtype_ok(const char *s)
{
	if (strlen(s) != 3 || (s[2] != '1' && s[2] != '2' && s[2] != '4' && s[2] != '8'))
		return false;
	int size = s[2] - '0';
	if (size == 1 ? s[0] != '|' : s[0] != '<' && s[0] != '>')
		return false;
	switch (s[1]) {
	case 'b': return size == 1;
	case 'i': case 'u': return true;
	case 'f': return size > 1;
	default: return false;
	}
}

/* Parses the header back and compares it with a. */
static void check_header(const struct array_desc *a, const uint8_t *buf, size_t len)
{
	FZ_CHECK(len % 64 == 0 && len >= 64 && len <= NPY_HEADER_MAX);
	FZ_CHECK(memcmp(buf, "\x93NUMPY\x01\x00", 8) == 0);
	FZ_CHECK((size_t)(buf[8] | buf[9] << 8) == len - 10);
	FZ_CHECK(buf[len - 1] == '\n');
	char text[NPY_HEADER_MAX + 1];
	memcpy(text, buf + 10, len - 10);
	text[len - 10] = '\0';
	FZ_CHECK(strchr(text, '\n') == text + len - 11);

	char prefix[64];
	snprintf(prefix, sizeof(prefix), "{'descr': '%s', 'fortran_order': False, 'shape': (", a->dtype);
	FZ_CHECK(strncmp(text, prefix, strlen(prefix)) == 0);
	const char *p = text + strlen(prefix);
	for (unsigned i = 0; i < a->ndim; i++) {
		if (i) {
			FZ_CHECK(p[0] == ',' && p[1] == ' ');
			p += 2;
		}
		FZ_CHECK(*p >= '0' && *p <= '9');
		char *end;
		unsigned long long v = strtoull(p, &end, 10);
		FZ_CHECK(v == a->shape[i]);
		p = end;
	}
	/* repr of a 1-tuple has its trailing comma */
	FZ_CHECK(strncmp(p, a->ndim == 1 ? ",), }" : "), }", a->ndim == 1 ? 5 : 4) == 0);
	p += a->ndim == 1 ? 5 : 4;
	size_t spaces = strspn(p, " ");
	FZ_CHECK(p[spaces] == '\n' && p[spaces + 1] == '\0');
	char first[24];
	int digits = snprintf(first, sizeof(first), "%llu", (unsigned long long)a->shape[0]);
	/* numpy's room for shape[0] to grow to 21 digits, then 1..64 spaces
	 * (64 when already aligned: numpy's padlen is 64 - n % 64) */
	size_t growth = (size_t)(digits < 21 ? 21 - digits : 0);
	FZ_CHECK(spaces >= growth + 1 && spaces <= growth + 64);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fuzz_in in = { data, size };
	struct array_desc a;
	char dtype[8];

	memset(&a, 0, sizeof(a));
	/* Any string as a dtype; one of the known ones when it is refused. */
	fz_str(&in, dtype, 5, '\0');
	int rc = array_dtype_set(&a, dtype);
	FZ_CHECK((rc == 0) == dtype_ok(dtype));
	if (rc == 0) {
		FZ_CHECK(strcmp(a.dtype, dtype) == 0);
		FZ_CHECK(a.itemsize == dtype[2] - '0');
	} else {
		FZ_CHECK(rc == -EINVAL);
		uint8_t k = fz_u8(&in);
		FZ_CHECK(array_dtype_set(&a, known[k % (sizeof(known) / sizeof(known[0]))]) == 0);
	}
	a.ndim = (uint8_t)(1 + fz_u8(&in) % ARTFS_NDIM_MAX);
	for (unsigned i = 0; i < a.ndim; i++)
		a.shape[i] = fz_num(&in);

	/* Exactly NPY_HEADER_MAX bytes: enough for any description. */
	uint8_t *buf = malloc(NPY_HEADER_MAX);
	ssize_t h = npy_header(&a, buf, NPY_HEADER_MAX);
	FZ_CHECK(h > 0);
	check_header(&a, buf, (size_t)h);

	/* Too short a buffer is refused without a byte written past it. */
	size_t cap = fz_u16(&in) % ((size_t)h + 1);
	uint8_t *small = malloc(cap ? cap : 1);
	ssize_t hs = npy_header(&a, small, cap);
	FZ_CHECK(cap == (size_t)h ? hs == h && memcmp(small, buf, cap) == 0 : hs == -ENOSPC);
	free(small);

	uint64_t payload, fsize;
	int prc = array_payload_len(&a, &payload);
	rc = npy_file_size(&a, &fsize);
	if (prc == 0 && payload <= UINT64_MAX - (uint64_t)h)
		FZ_CHECK(rc == 0 && fsize == payload + (uint64_t)h);
	else
		FZ_CHECK(rc == -EOVERFLOW);

	/* The shape as user.artfs.shape shows it, into buffers of any size. */
	size_t tlen = 1 + fz_u8(&in) % ARRAY_SHAPE_TEXT_MAX;
	char *text = malloc(tlen);
	array_shape_text(&a, text, tlen);
	FZ_CHECK(memchr(text, '\0', tlen) != NULL);
	free(text);
	free(buf);
	return 0;
}
