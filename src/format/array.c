/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "format/array.h"

int array_dtype_set(struct array_desc *a, const char *dtype)
{
	if (strlen(dtype) != 3)
		return -EINVAL;
	char order = dtype[0], kind = dtype[1], size = dtype[2];
	int itemsize;

	switch (size) {
	case '1': itemsize = 1; break;
	case '2': itemsize = 2; break;
	case '4': itemsize = 4; break;
	case '8': itemsize = 8; break;
	default: return -EINVAL;
	}
	switch (kind) {
	case 'b': if (itemsize != 1) return -EINVAL; break;
	case 'i': case 'u': break;
	case 'f': if (itemsize == 1) return -EINVAL; break; /* numpy has no f1 */
	default: return -EINVAL;
	}
	/* numpy writes '|' for single bytes and an explicit order otherwise. */
	if (itemsize == 1 ? order != '|' : (order != '<' && order != '>'))
		return -EINVAL;
	memcpy(a->dtype, dtype, 4);
	a->itemsize = (uint8_t)itemsize;
	return 0;
}

int array_payload_len(const struct array_desc *a, uint64_t *len)
{
	uint64_t n = a->itemsize;

	for (unsigned i = 0; i < a->ndim; i++)
		if (__builtin_mul_overflow(n, a->shape[i], &n))
			return -EOVERFLOW;
	*len = n;
	return 0;
}

void array_shape_text(const struct array_desc *a, char *buf, size_t len)
{
	size_t used = 0;

	buf[0] = '\0';
	for (unsigned i = 0; i < a->ndim && used < len; i++) {
		int n = snprintf(buf + used, len - used, "%s%llu", i ? "," : "",
				 (unsigned long long)a->shape[i]);
		if (n < 0)
			break;
		used += (size_t)n;
	}
}
