/* SPDX-License-Identifier: Apache-2.0 */
/* The names of the write-once trees (trees/names.h) against an independent
 * reading of DESIGN.md §9's rule: 1-255 bytes, no '/', no NUL, not "." or
 * "..". Both the byte form and the C-string form must agree with it and
 * with each other. */
#include "autoconf.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "trees/names.h"

static int expected(const uint8_t *p, size_t n)
{
	if (n == 0)
		return -EINVAL;
	if (n > 255)
		return -ENAMETOOLONG;
	for (size_t i = 0; i < n; i++)
		if (p[i] == 0 || p[i] == '/')
			return -EINVAL;
	if ((n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.'))
		return -EINVAL;
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	FZ_CHECK(wtree_name_check_bytes((const char *)data, size) == expected(data, size));
	/* As a C string (what FUSE hands the daemon): up to the first NUL. */
	char *s = malloc(size + 1);
	if (!s)
		return 0;
	memcpy(s, data, size);
	s[size] = '\0';
	size_t len = strlen(s);
	FZ_CHECK(wtree_name_check(s) == expected((const uint8_t *)s, len));
	free(s);
	return 0;
}
