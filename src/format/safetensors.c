/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "format/safetensors.h"
#include "lib/reason.h"

static const struct {
	const char *name;
	unsigned bits;
} dtypes[SAFETENSORS_DTYPE_COUNT] = {
	[SAFETENSORS_BOOL] = { "BOOL", 8 },
	[SAFETENSORS_F4] = { "F4", 4 },
	[SAFETENSORS_F6_E2M3] = { "F6_E2M3", 6 },
	[SAFETENSORS_F6_E3M2] = { "F6_E3M2", 6 },
	[SAFETENSORS_U8] = { "U8", 8 },
	[SAFETENSORS_I8] = { "I8", 8 },
	[SAFETENSORS_F8_E5M2] = { "F8_E5M2", 8 },
	[SAFETENSORS_F8_E4M3] = { "F8_E4M3", 8 },
	[SAFETENSORS_F8_E8M0] = { "F8_E8M0", 8 },
	[SAFETENSORS_F8_E4M3FNUZ] = { "F8_E4M3FNUZ", 8 },
	[SAFETENSORS_F8_E5M2FNUZ] = { "F8_E5M2FNUZ", 8 },
	[SAFETENSORS_I16] = { "I16", 16 },
	[SAFETENSORS_U16] = { "U16", 16 },
	[SAFETENSORS_F16] = { "F16", 16 },
	[SAFETENSORS_BF16] = { "BF16", 16 },
	[SAFETENSORS_I32] = { "I32", 32 },
	[SAFETENSORS_U32] = { "U32", 32 },
	[SAFETENSORS_F32] = { "F32", 32 },
	[SAFETENSORS_C64] = { "C64", 64 },
	[SAFETENSORS_F64] = { "F64", 64 },
	[SAFETENSORS_I64] = { "I64", 64 },
	[SAFETENSORS_U64] = { "U64", 64 },
};

const char *safetensors_dtype_name(enum safetensors_dtype dt)
{
	return (unsigned)dt < SAFETENSORS_DTYPE_COUNT ? dtypes[dt].name : "?";
}

unsigned safetensors_dtype_bits(enum safetensors_dtype dt)
{
	return (unsigned)dt < SAFETENSORS_DTYPE_COUNT ? dtypes[dt].bits : 0;
}

int safetensors_dtype_from_name(const char *name, enum safetensors_dtype *dt)
{
	for (unsigned i = 0; i < SAFETENSORS_DTYPE_COUNT; i++)
		if (strcmp(name, dtypes[i].name) == 0) {
			*dt = (enum safetensors_dtype)i;
			return 0;
		}
	return -EINVAL;
}

void safetensors_free(struct safetensors_file *f)
{
	free(f->tensors);
	free(f->names);
	free(f->raw);
	memset(f, 0, sizeof(*f));
}

static uint64_t le64(const uint8_t *p)
{
	uint64_t v = 0;

	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

/* A JSON integer >= 0 (jansson refuses integers beyond int64). */
static int get_uint(json_t *v, uint64_t *out)
{
	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return -1;
	*out = (uint64_t)json_integer_value(v);
	return 0;
}

static int check_metadata(json_t *meta, char *err, size_t errlen)
{
	const char *key;
	json_t *v;

	if (json_is_null(meta))
		return 0; /* serde's Option: null is "absent" */
	if (!json_is_object(meta))
		return reason(-EINVAL, err, errlen, "__metadata__ is not an object");
	json_object_foreach(meta, key, v)
		if (!json_is_string(v))
			return reason(-EINVAL, err, errlen, "__metadata__ \"%.64s\" is not a string", key);
	return 0;
}

/* One tensor entry; on success t holds everything but name and offset, and
 * *begin, *end its data_offsets. */
static int parse_tensor(const char *name, json_t *entry, struct safetensors_tensor *t, uint64_t *begin,
			uint64_t *end, char *err, size_t errlen)
{
	json_t *dtype = json_object_get(entry, "dtype");
	json_t *shape = json_object_get(entry, "shape");
	json_t *offsets = json_object_get(entry, "data_offsets");

	if (!json_is_object(entry))
		return reason(-EINVAL, err, errlen, "tensor \"%.64s\" is not an object", name);
	if (json_object_size(entry) != 3 || !dtype || !shape || !offsets)
		return reason(-EINVAL, err, errlen,
			    "tensor \"%.64s\" does not have exactly dtype, shape and data_offsets", name);

	if (!json_is_string(dtype) || safetensors_dtype_from_name(json_string_value(dtype), &t->dtype) < 0)
		return reason(-EINVAL, err, errlen, "tensor \"%.64s\": unknown dtype", name);

	size_t ndim = json_array_size(shape);
	if (!json_is_array(shape) || ndim > SAFETENSORS_NDIM_MAX)
		return reason(-EINVAL, err, errlen, "tensor \"%.64s\": shape is not a list of at most %d integers",
			    name, SAFETENSORS_NDIM_MAX);
	t->ndim = (uint8_t)ndim;
	uint64_t elems = 1;
	bool overflow = false;
	for (size_t i = 0; i < ndim; i++) {
		if (get_uint(json_array_get(shape, i), &t->shape[i]) < 0)
			return reason(-EINVAL, err, errlen, "tensor \"%.64s\": shape[%zu] is not an integer >= 0",
				    name, i);
		/* Like the reference, overflow counts even when a later
		 * dimension is 0. */
		overflow |= __builtin_mul_overflow(elems, t->shape[i], &elems);
	}
	uint64_t bits;
	if (overflow || __builtin_mul_overflow(elems, (uint64_t)safetensors_dtype_bits(t->dtype), &bits))
		return reason(-EINVAL, err, errlen, "tensor \"%.64s\": size of shape overflows", name);
	if (bits % 8)
		return reason(-EINVAL, err, errlen, "tensor \"%.64s\": %s data ends inside a byte", name,
			    safetensors_dtype_name(t->dtype));
	t->size = bits / 8;

	if (!json_is_array(offsets) || json_array_size(offsets) != 2 ||
	    get_uint(json_array_get(offsets, 0), begin) < 0 ||
	    get_uint(json_array_get(offsets, 1), end) < 0)
		return reason(-EINVAL, err, errlen, "tensor \"%.64s\": data_offsets is not [begin, end]", name);
	if (*end < *begin)
		return reason(-EINVAL, err, errlen, "tensor \"%.64s\": data_offsets end before begin", name);
	if (*end - *begin != t->size)
		return reason(-EINVAL, err, errlen,
			    "tensor \"%.64s\": data_offsets span %llu bytes, dtype and shape need %llu", name,
			    (unsigned long long)(*end - *begin), (unsigned long long)t->size);
	return 0;
}

/* Order of the data buffer: begin, then end (zero-sized tensors before the
 * one that starts where they are), then name for a stable result. Offsets
 * are still relative here. */
static int by_offset(const void *a, const void *b)
{
	const struct safetensors_tensor *x = a, *y = b;

	if (x->offset != y->offset)
		return x->offset < y->offset ? -1 : 1;
	if (x->size != y->size)
		return x->size < y->size ? -1 : 1;
	return strcmp(x->name, y->name);
}

static int parse_root(json_t *root, uint64_t data_len, struct safetensors_file *out, char *err, size_t errlen)
{
	const char *name;
	json_t *v;
	size_t names_len = 0, n = 0;

	json_object_foreach(root, name, v) {
		if (strcmp(name, "__metadata__") == 0) {
			int rc = check_metadata(v, err, errlen);
			if (rc < 0)
				return rc;
			continue;
		}
		/* jansson refuses NUL in strings, so strlen is the key's length. */
		size_t len = strlen(name);
		if (len < 1 || len > SAFETENSORS_NAME_MAX)
			return reason(-EINVAL, err, errlen, "tensor name of %zu bytes (1..%d)", len, SAFETENSORS_NAME_MAX);
		names_len += len + 1;
		n++;
	}
	out->tensors = calloc(n ? n : 1, sizeof(*out->tensors));
	out->names = malloc(names_len ? names_len : 1);
	if (!out->tensors || !out->names)
		return reason(-ENOMEM, err, errlen, "out of memory for %zu tensors", n);

	char *at = out->names;
	json_object_foreach(root, name, v) {
		if (strcmp(name, "__metadata__") == 0)
			continue;
		struct safetensors_tensor *t = &out->tensors[out->count];
		uint64_t begin, end;
		int rc = parse_tensor(name, v, t, &begin, &end, err, errlen);
		if (rc < 0)
			return rc;
		size_t len = strlen(name) + 1;
		memcpy(at, name, len);
		t->name = at;
		at += len;
		t->offset = begin;
		out->count++;
	}

	qsort(out->tensors, out->count, sizeof(*out->tensors), by_offset);
	uint64_t next = 0;
	for (size_t i = 0; i < out->count; i++) {
		struct safetensors_tensor *t = &out->tensors[i];
		if (t->offset < next)
			return reason(-EINVAL, err, errlen, "tensor \"%.64s\" overlaps the one before it", t->name);
		if (t->offset > next)
			return reason(-EINVAL, err, errlen, "hole of %llu bytes before tensor \"%.64s\"",
				    (unsigned long long)(t->offset - next), t->name);
		next = t->offset + t->size;
		t->offset += out->data_start;
	}
	/* The reference's "metadata incomplete buffer": no unindexed bytes, so
	 * no polyglot files. */
	if (next != data_len)
		return reason(-EINVAL, err, errlen, "tensors cover %llu bytes of a %llu-byte data buffer",
			    (unsigned long long)next, (unsigned long long)data_len);
	return 0;
}

int safetensors_parse(const uint8_t *buf, size_t len, uint64_t file_size, struct safetensors_file *out,
	     char *err, size_t errlen)
{
	json_error_t jerr;

	memset(out, 0, sizeof(*out));
	if (len < SAFETENSORS_PREFIX_LEN || file_size < SAFETENSORS_PREFIX_LEN)
		return reason(-EINVAL, err, errlen, "shorter than the 8-byte header length");
	uint64_t n = le64(buf);
	if (n > SAFETENSORS_HEADER_MAX)
		return reason(-EINVAL, err, errlen, "header length %llu over %u", (unsigned long long)n,
			    SAFETENSORS_HEADER_MAX);
	if (n > file_size - SAFETENSORS_PREFIX_LEN)
		return reason(-EINVAL, err, errlen, "header of %llu bytes runs past the end of the file",
			    (unsigned long long)n);
	if (n > len - SAFETENSORS_PREFIX_LEN)
		return reason(-EINVAL, err, errlen, "header of %llu bytes cut short", (unsigned long long)n);
	out->header_len = n;
	out->data_start = SAFETENSORS_PREFIX_LEN + n;
	out->file_size = file_size;

	/* jansson checks UTF-8, refuses NUL in strings, integers beyond int64,
	 * nesting beyond 2048 and, with this flag, duplicate keys (so duplicate
	 * tensor names); trailing non-space bytes are an error. */
	json_t *root = json_loadb((const char *)buf + SAFETENSORS_PREFIX_LEN, (size_t)n, JSON_REJECT_DUPLICATES,
				  &jerr);
	if (!root)
		return reason(-EINVAL, err, errlen, "header JSON: %s", jerr.text);
	int rc = json_is_object(root) ? parse_root(root, file_size - out->data_start, out, err, errlen)
				      : reason(-EINVAL, err, errlen, "header JSON is not an object");
	json_decref(root);
	if (rc < 0)
		safetensors_free(out);
	return rc;
}

static int pread_full(int fd, void *buf, size_t len, off_t off)
{
	size_t done = 0;

	while (done < len) {
		ssize_t r = pread(fd, (uint8_t *)buf + done, len - done, off + (off_t)done);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -errno;
		if (r == 0)
			return -EIO; /* the file shrank under us */
		done += (size_t)r;
	}
	return 0;
}

int safetensors_read(int fd, struct safetensors_file *out, char *err, size_t errlen)
{
	struct stat st;
	uint8_t prefix[SAFETENSORS_PREFIX_LEN];
	int rc;

	memset(out, 0, sizeof(*out));
	if (fstat(fd, &st) < 0)
		return reason(-errno, err, errlen, "fstat: %s", strerror(errno));
	if (!S_ISREG(st.st_mode))
		return reason(-EINVAL, err, errlen, "not a regular file");
	uint64_t size = (uint64_t)st.st_size;
	if (size < SAFETENSORS_PREFIX_LEN)
		return reason(-EINVAL, err, errlen, "shorter than the 8-byte header length");
	rc = pread_full(fd, prefix, sizeof(prefix), 0);
	if (rc < 0)
		return reason(rc, err, errlen, "read: %s", strerror(-rc));
	uint64_t n = le64(prefix);
	/* Bound N before allocating for it; safetensors_parse repeats these checks. */
	if (n > SAFETENSORS_HEADER_MAX || n > size - SAFETENSORS_PREFIX_LEN)
		return safetensors_parse(prefix, sizeof(prefix), size, out, err, errlen);

	size_t raw_len = SAFETENSORS_PREFIX_LEN + (size_t)n;
	uint8_t *raw = malloc(raw_len);
	if (!raw)
		return reason(-ENOMEM, err, errlen, "out of memory for a %zu-byte header", raw_len);
	memcpy(raw, prefix, SAFETENSORS_PREFIX_LEN);
	rc = pread_full(fd, raw + SAFETENSORS_PREFIX_LEN, (size_t)n, SAFETENSORS_PREFIX_LEN);
	if (rc < 0) {
		free(raw);
		return reason(rc, err, errlen, "read: %s", strerror(-rc));
	}
	rc = safetensors_parse(raw, raw_len, size, out, err, errlen);
	if (rc < 0) {
		free(raw);
		return rc;
	}
	out->raw = raw;
	out->raw_len = raw_len;
	return 0;
}
