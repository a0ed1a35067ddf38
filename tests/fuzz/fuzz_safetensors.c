/* SPDX-License-Identifier: Apache-2.0 */
/* The safetensors header (safetensors_parse) over any buffer and any file
 * size, and safetensors_read of the same bytes as a file. What parses must
 * keep every promise of safetensors.h: tensors sorted by offset, each the
 * size its dtype and shape give, together covering the data buffer with no
 * hole and no overlap. */
#include "autoconf.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "format/safetensors.h"
#include "fuzz.h"

static void check_file(const struct safetensors_file *f, uint64_t file_size)
{
	FZ_CHECK(f->header_len <= SAFETENSORS_HEADER_MAX);
	FZ_CHECK(f->data_start == SAFETENSORS_PREFIX_LEN + f->header_len);
	FZ_CHECK(f->data_start <= file_size && f->file_size == file_size);
	uint64_t next = f->data_start;
	for (size_t i = 0; i < f->count; i++) {
		const struct safetensors_tensor *t = &f->tensors[i];
		size_t len = strlen(t->name);
		FZ_CHECK(len >= 1 && len <= SAFETENSORS_NAME_MAX);
		FZ_CHECK(t->name >= f->names);
		FZ_CHECK((unsigned)t->dtype < SAFETENSORS_DTYPE_COUNT);
		enum safetensors_dtype back;
		FZ_CHECK(safetensors_dtype_from_name(safetensors_dtype_name(t->dtype), &back) == 0 &&
			 back == t->dtype);
		FZ_CHECK(t->ndim <= SAFETENSORS_NDIM_MAX);
		unsigned __int128 bits = safetensors_dtype_bits(t->dtype);
		for (unsigned d = 0; d < t->ndim; d++) {
			bits *= t->shape[d];
			if (bits > UINT64_MAX)
				bits = (unsigned __int128)UINT64_MAX + 1; /* stays too large */
		}
		FZ_CHECK(bits % 8 == 0 && bits / 8 == t->size);
		FZ_CHECK(t->offset == next);
		next = t->offset + t->size;
		if (i) {
			const struct safetensors_tensor *p = &f->tensors[i - 1];
			FZ_CHECK(p->offset < t->offset ||
				 (p->offset == t->offset && (p->size < t->size ||
				  (p->size == t->size && strcmp(p->name, t->name) < 0))));
		}
	}
	FZ_CHECK(next == file_size);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fuzz_in in = { data, size };
	struct safetensors_file f;
	char err[256];

	/* The file size: the rest of the input exactly (a whole file), more,
	 * or anything. */
	uint8_t mode = fz_u8(&in);
	uint64_t file_size;
	switch (mode & 3) {
	case 0: case 1: file_size = in.n; break;
	case 2: file_size = in.n + fz_num(&in); break;
	default: file_size = fz_num(&in); break;
	}
	const uint8_t *buf = in.p;
	size_t len = in.n;

	err[0] = '\0';
	int rc = safetensors_parse(buf, len, file_size, &f, err, sizeof(err));
	FZ_CHECK(rc == 0 || rc == -EINVAL || rc == -ENOMEM);
	FZ_CHECK(rc == 0 || err[0] != '\0');
	FZ_CHECK(f.raw == NULL);
	if (rc == 0)
		check_file(&f, file_size);
	else
		FZ_CHECK(f.count == 0 && f.tensors == NULL && f.names == NULL);
	safetensors_free(&f);
	safetensors_free(&f); /* safe on a freed one */

	/* The same bytes as a file, read as the checkpoint loader does. */
	if (mode & 4) {
		int fd = memfd_create("fuzz.safetensors", MFD_CLOEXEC);
		FZ_CHECK(fd >= 0);
		size_t done = 0;
		while (done < len) {
			ssize_t w = write(fd, buf + done, len - done);
			FZ_CHECK(w > 0);
			done += (size_t)w;
		}
		int rrc = safetensors_read(fd, &f, err, sizeof(err));
		FZ_CHECK(rrc == 0 || rrc == -EINVAL || rrc == -ENOMEM);
		/* A file of len bytes is what the buffer was with file_size len. */
		if (rrc == 0) {
			check_file(&f, len);
			FZ_CHECK(f.raw && f.raw_len == f.data_start && memcmp(f.raw, buf, f.raw_len) == 0);
		}
		struct safetensors_file g;
		int grc = safetensors_parse(buf, len, len, &g, err, sizeof(err));
		FZ_CHECK((rrc == 0) == (grc == 0));
		if (rrc == 0 && grc == 0)
			FZ_CHECK(f.count == g.count);
		safetensors_free(&g);
		safetensors_free(&f);
		close(fd);
	}
	return 0;
}
