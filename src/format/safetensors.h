/* SPDX-License-Identifier: Apache-2.0 */
/* The safetensors format (DESIGN.md §4.1): parse and check a file's header.
 *
 *   u64 little-endian N | N bytes of JSON | data buffer
 *
 * The JSON object maps tensor name -> {"dtype", "shape", "data_offsets"},
 * with an optional "__metadata__" map of strings; data_offsets are relative
 * to the data buffer, which starts at 8 + N. The checks are those of the
 * reference implementation (huggingface/safetensors, tensor.rs), plus a few
 * stricter ones noted below. safetensors_parse is pure and bounded, so it can be
 * fuzzed on its own; safetensors_read does the I/O around it. */
#ifndef ARTFS_SAFETENSORS_H
#define ARTFS_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define SAFETENSORS_PREFIX_LEN 8
/* The reference's MAX_HEADER_SIZE. */
#define SAFETENSORS_HEADER_MAX 100000000u
#define SAFETENSORS_NDIM_MAX 8
#define SAFETENSORS_NAME_MAX 1024

/* Every dtype of the reference, in its order (increasing alignment). */
enum safetensors_dtype {
	SAFETENSORS_BOOL,
	SAFETENSORS_F4,
	SAFETENSORS_F6_E2M3,
	SAFETENSORS_F6_E3M2,
	SAFETENSORS_U8,
	SAFETENSORS_I8,
	SAFETENSORS_F8_E5M2,
	SAFETENSORS_F8_E4M3,
	SAFETENSORS_F8_E8M0,
	SAFETENSORS_F8_E4M3FNUZ,
	SAFETENSORS_F8_E5M2FNUZ,
	SAFETENSORS_I16,
	SAFETENSORS_U16,
	SAFETENSORS_F16,
	SAFETENSORS_BF16,
	SAFETENSORS_I32,
	SAFETENSORS_U32,
	SAFETENSORS_F32,
	SAFETENSORS_C64,
	SAFETENSORS_F64,
	SAFETENSORS_I64,
	SAFETENSORS_U64,
	SAFETENSORS_DTYPE_COUNT
};

/* The name as written in headers ("BF16", "F8_E4M3", ...); "?" when out of
 * range. */
const char *safetensors_dtype_name(enum safetensors_dtype dt);
/* Bits per element: 4, 6, 8, 16, 32 or 64; 0 when out of range. */
unsigned safetensors_dtype_bits(enum safetensors_dtype dt);
/* Exact, case-sensitive name to dtype. Returns 0 or -EINVAL. */
int safetensors_dtype_from_name(const char *name, enum safetensors_dtype *dt);

struct safetensors_tensor {
	char *name;                 /* 1..SAFETENSORS_NAME_MAX bytes, points into safetensors_file.names */
	enum safetensors_dtype dtype;
	uint8_t ndim;               /* 0 (a scalar) .. SAFETENSORS_NDIM_MAX */
	uint64_t shape[SAFETENSORS_NDIM_MAX];
	uint64_t offset;            /* absolute offset in the file */
	uint64_t size;              /* bytes: prod(shape) * bits / 8 */
};

struct safetensors_file {
	uint64_t header_len;        /* N */
	uint64_t data_start;        /* 8 + N */
	uint64_t file_size;
	size_t count;
	struct safetensors_tensor *tensors;  /* sorted by offset (then size, then name) */
	char *names;                /* one buffer holding every tensor's name */
	/* The 8 + N bytes safetensors_read read (NULL after safetensors_parse); the checkpoint
	 * revision hashes them. Owned: safetensors_free frees it, and a caller may free
	 * it earlier and set it to NULL. */
	uint8_t *raw;
	size_t raw_len;
};

/* Parses and checks the prefix and header in buf (at least 8 + N bytes;
 * bytes past 8 + N are not read) of a file of file_size bytes:
 * - N <= SAFETENSORS_HEADER_MAX and 8 + N <= file_size;
 * - the header is UTF-8 JSON, an object, without duplicate keys;
 * - "__metadata__", if present, is an object of strings (or null);
 * - every other member is a tensor: a name of 1..SAFETENSORS_NAME_MAX bytes, mapped to
 *   an object with exactly the keys dtype (a known name), shape (at most
 *   SAFETENSORS_NDIM_MAX integers >= 0) and data_offsets ([begin, end], integers,
 *   begin <= end);
 * - prod(shape) * bits fits in 64 bits and is a whole number of bytes (as in
 *   the reference, an F4 or F6 tensor that ends inside a byte is refused),
 *   equal to end - begin;
 * - sorted by begin, the tensors follow one another with no overlap and no
 *   hole, from 0 to exactly file_size - 8 - N.
 * On failure *out is empty, err says why, and the result is -EINVAL
 * (malformed) or -ENOMEM. */
int safetensors_parse(const uint8_t *buf, size_t len, uint64_t file_size, struct safetensors_file *out,
	     char *err, size_t errlen);

/* Reads and parses the header of an open regular file (pread, does not move
 * the file offset), keeping the raw bytes in out->raw. Returns 0, -EINVAL
 * (not a regular file, or malformed), -ENOMEM or another negative errno of
 * the I/O. */
int safetensors_read(int fd, struct safetensors_file *out, char *err, size_t errlen);

/* Frees what safetensors_parse or safetensors_read allocated; safe on a zeroed or freed one. */
void safetensors_free(struct safetensors_file *f);

#endif
