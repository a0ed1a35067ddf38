/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/publish_blob.h"

static int bad(char *err, size_t errlen, int rc, const char *what, size_t i)
{
	if (i == (size_t)-1)
		snprintf(err, errlen, "%s", what);
	else
		snprintf(err, errlen, "tensor %zu: %s", i, what);
	return rc;
}

/* A fixed-width string field: NUL-terminated within n bytes. */
static size_t field_len(const char *s, size_t n)
{
	const char *z = memchr(s, '\0', n);

	return z ? (size_t)(z - s) : n;
}

static int name_cmp(const void *a, const void *b)
{
	const struct wblob_tensor *x = *(const struct wblob_tensor *const *)a;
	const struct wblob_tensor *y = *(const struct wblob_tensor *const *)b;

	return strcmp(x->t.name, y->t.name);
}

static int handle_cmp(const void *a, const void *b)
{
	return memcmp(*(const uint8_t *const *)a, *(const uint8_t *const *)b, ARTFS_IPC_HANDLE_SIZE);
}

/* The header's own checks, before anything it counts is read. */
static int check_header(const uint8_t *buf, size_t len, struct artfs_publish_header *h, char *err,
			size_t errlen)
{
	if (len < sizeof(*h))
		return bad(err, errlen, -EBADMSG, "shorter than its header", (size_t)-1);
	memcpy(h, buf, sizeof(*h));
	if (h->magic != ARTFS_PUBLISH_MAGIC)
		return bad(err, errlen, -EBADMSG, "not a publish blob (magic)", (size_t)-1);
	if (h->abi != ARTFS_PUBLISH_ABI) {
		snprintf(err, errlen, "ABI version %u, this daemon speaks %u", h->abi, ARTFS_PUBLISH_ABI);
		return -EINVAL;
	}
	if (h->header_size != sizeof(struct artfs_publish_header) ||
	    h->tensor_size != sizeof(struct artfs_publish_tensor))
		return bad(err, errlen, -EBADMSG, "header_size or tensor_size is not this ABI's", (size_t)-1);
	if (h->handle_count < 1 || h->handle_count > ARTFS_PUBLISH_HANDLES_MAX ||
	    h->tensor_count < 1 || h->tensor_count > ARTFS_PUBLISH_TENSORS_MAX)
		return bad(err, errlen, -EBADMSG, "handle or tensor count out of bounds", (size_t)-1);
	uint64_t want = (uint64_t)h->header_size + (uint64_t)h->handle_count * sizeof(struct artfs_publish_handle) +
			(uint64_t)h->tensor_count * h->tensor_size;
	if (want != len) {
		snprintf(err, errlen, "%zu bytes, the header says %llu", len, (unsigned long long)want);
		return -EBADMSG;
	}
	if (h->tp_size < 1 || h->tp_size > 64 || h->rank >= h->tp_size) {
		snprintf(err, errlen, "rank %u of tp_size %u", h->rank, h->tp_size);
		return -EINVAL;
	}
	if (h->target_device < ARTFS_PUBLISH_TARGET_SOURCE || h->flags)
		return bad(err, errlen, -EINVAL, "target_device or flags out of range", (size_t)-1);
	if (field_len(h->architecture, sizeof(h->architecture)) == sizeof(h->architecture) ||
	    field_len(h->quant_method, sizeof(h->quant_method)) == sizeof(h->quant_method))
		return bad(err, errlen, -EBADMSG, "architecture or quant_method not NUL-terminated",
			   (size_t)-1);
	return 0;
}

/* Whether size is prod(shape) * bits / 8, with every step checked for
 * overflow; unused dimensions must be 0. */
static bool size_matches(const struct artfs_publish_tensor *in, unsigned bits)
{
	unsigned __int128 elems = 1;

	for (unsigned d = 0; d < in->ndim; d++) {
		elems *= in->shape[d];
		if (elems > (unsigned __int128)1 << 62)
			break;
	}
	for (unsigned d = in->ndim; d < ARTFS_NDIM_MAX; d++)
		if (in->shape[d])
			elems = ~(unsigned __int128)0;
	return !(elems > (unsigned __int128)1 << 62 || (elems * bits) % 8 ||
		 (uint64_t)(elems * bits / 8) != in->size);
}

/* Checks tensor i, at raw in the blob, and fills t from it. */
static int parse_tensor(const uint8_t *raw, size_t i, size_t nhandles, struct wblob_tensor *t,
			char *err, size_t errlen)
{
	/* Fields are read in place: the blob is a byte buffer with no
	 * alignment promise, hence the copy. */
	struct artfs_publish_tensor in;
	memcpy(&in, raw, sizeof(in));
	const char *name = (const char *)raw;
	size_t nl = field_len(in.name, sizeof(in.name));
	if (nl == 0 || nl == sizeof(in.name))
		return bad(err, errlen, -EBADMSG, "name empty or not NUL-terminated", i);
	char dtype[ARTFS_PUBLISH_DTYPE_MAX];
	if (field_len(in.dtype, sizeof(in.dtype)) == sizeof(in.dtype))
		return bad(err, errlen, -EBADMSG, "dtype not NUL-terminated", i);
	memcpy(dtype, in.dtype, sizeof(dtype));
	if (safetensors_dtype_from_name(dtype, &t->t.dtype) < 0) {
		snprintf(err, errlen, "tensor %zu (%.200s): unknown dtype \"%.15s\"", i, name, dtype);
		return -EBADMSG;
	}
	if (in.ndim > ARTFS_NDIM_MAX || in.handle >= nhandles) {
		snprintf(err, errlen, "tensor %zu (%.200s): ndim %u or handle %u out of range", i, name,
			 in.ndim, in.handle);
		return -EBADMSG;
	}
	if (!size_matches(&in, safetensors_dtype_bits(t->t.dtype))) {
		snprintf(err, errlen, "tensor %zu (%.200s): size %llu is not prod(shape) x itemsize",
			 i, name, (unsigned long long)in.size);
		return -EBADMSG;
	}
	t->t.name = (char *)name; /* NUL-terminated in the blob, checked above */
	t->t.ndim = (uint8_t)in.ndim;
	memcpy(t->t.shape, in.shape, sizeof(t->t.shape));
	t->t.size = in.size;
	t->handle = in.handle;
	t->src_offset = in.offset;
	if (in.offset > UINT64_MAX - in.size)
		return bad(err, errlen, -EBADMSG, "offset + size overflows", i);
	return 0;
}

/* No tensor name twice; sorted has room for every tensor. */
static int check_names_unique(const struct wblob *b, const void **sorted, char *err, size_t errlen)
{
	for (size_t i = 0; i < b->ntensors; i++)
		sorted[i] = &b->tensors[i];
	qsort(sorted, b->ntensors, sizeof(void *), name_cmp);
	for (size_t i = 1; i < b->ntensors; i++)
		if (strcmp(((const struct wblob_tensor *)sorted[i])->t.name,
			   ((const struct wblob_tensor *)sorted[i - 1])->t.name) == 0) {
			snprintf(err, errlen, "tensor name \"%.200s\" given twice",
				 ((const struct wblob_tensor *)sorted[i])->t.name);
			return -EBADMSG;
		}
	return 0;
}

/* No IPC handle twice; sorted has room for every handle. */
static int check_handles_unique(const struct wblob *b, const void **sorted, char *err, size_t errlen)
{
	for (size_t i = 0; i < b->nhandles; i++)
		sorted[i] = b->handles[i].ipc_handle;
	qsort(sorted, b->nhandles, sizeof(void *), handle_cmp);
	for (size_t i = 1; i < b->nhandles; i++)
		if (memcmp(sorted[i], sorted[i - 1], ARTFS_IPC_HANDLE_SIZE) == 0)
			return bad(err, errlen, -EBADMSG, "an IPC handle is listed twice", (size_t)-1);
	return 0;
}

int wblob_parse(const uint8_t *buf, size_t len, struct wblob *b, char *err, size_t errlen)
{
	memset(b, 0, sizeof(*b));
	int rc = check_header(buf, len, &b->head, err, errlen);
	if (rc < 0)
		return rc;
	const struct artfs_publish_header *h = &b->head;
	b->nhandles = h->handle_count;
	b->ntensors = h->tensor_count;
	b->handles = (const struct artfs_publish_handle *)(buf + h->header_size);
	const uint8_t *tp = buf + h->header_size + b->nhandles * sizeof(struct artfs_publish_handle);
	b->tensors = calloc(b->ntensors, sizeof(*b->tensors));
	const void **sorted = calloc(b->ntensors > b->nhandles ? b->ntensors : b->nhandles, sizeof(void *));
	rc = b->tensors && sorted ? 0 : -ENOMEM;
	if (rc < 0)
		snprintf(err, errlen, "out of memory");
	for (size_t i = 0; i < b->ntensors && rc == 0; i++)
		rc = parse_tensor(tp + i * h->tensor_size, i, b->nhandles, &b->tensors[i], err, errlen);
	if (rc == 0)
		rc = check_names_unique(b, sorted, err, errlen);
	if (rc == 0)
		rc = check_handles_unique(b, sorted, err, errlen);
	free(sorted);
	if (rc < 0)
		wblob_free(b);
	return rc;
}

void wblob_free(struct wblob *b)
{
	free(b->tensors);
	b->tensors = NULL;
	b->ntensors = 0;
}
