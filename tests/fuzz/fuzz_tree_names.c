/* SPDX-License-Identifier: Apache-2.0 */
/* The names of the write-once trees (trees/names.h) against an independent
 * reading of DESIGN.md §9's rule: 1-255 bytes, no '/', no NUL, not "." or
 * "..". Both the byte form and the C-string form must agree with it and
 * with each other. And §10's block keys: 1-512 bytes of segments of
 * [A-Za-z0-9._:-] joined by '/', none empty, "." or "..", each a name. */
#include "autoconf.h"

#include <ctype.h>
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

static int seg_char(uint8_t c)
{
	return isalnum(c) || c == '.' || c == '_' || c == ':' || c == '-';
}

/* §10 read on its own: the key's bytes, then each segment between slashes. */
static int expected_key(const uint8_t *p, size_t n)
{
	if (n == 0)
		return -EINVAL;
	if (n > 512)
		return -ENAMETOOLONG;
	size_t start = 0;
	for (size_t i = 0; i <= n; i++) {
		if (i < n && p[i] != '/')
			continue;
		size_t len = i - start;
		if (len == 0)
			return -EINVAL;
		if (len > 255) /* a file name's bound comes first */
			return -ENAMETOOLONG;
		if ((len == 1 && p[start] == '.') ||
		    (len == 2 && p[start] == '.' && p[start + 1] == '.'))
			return -EINVAL;
		for (size_t j = start; j < i; j++)
			if (!seg_char(p[j]))
				return -EINVAL;
		start = i + 1;
	}
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	FZ_CHECK(wblocks_key_check((const char *)data, size) == expected_key(data, size));
	if (!memchr(data, '/', size)) /* one segment: a name of .blocks/ */
		FZ_CHECK(wblocks_segment_check_bytes((const char *)data, size) ==
			 expected_key(data, size));
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
