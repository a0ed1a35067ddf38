/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <errno.h>
#include <string.h>

#include "trees/names.h"

int wtree_name_check_bytes(const char *name, size_t len)
{
	if (len == 0)
		return -EINVAL;
	if (len > WTREE_NAME_MAX)
		return -ENAMETOOLONG;
	if (memchr(name, '\0', len) || memchr(name, '/', len))
		return -EINVAL;
	if ((len == 1 && name[0] == '.') || (len == 2 && name[0] == '.' && name[1] == '.'))
		return -EINVAL;
	return 0;
}

int wtree_name_check(const char *name)
{
	size_t len = strnlen(name, WTREE_NAME_MAX + 1);

	return wtree_name_check_bytes(name, len);
}

static int segment_char(unsigned char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       c == '.' || c == '_' || c == ':' || c == '-';
}

int wblocks_segment_check_bytes(const char *name, size_t len)
{
	int rc = wtree_name_check_bytes(name, len);

	for (size_t i = 0; rc == 0 && i < len; i++)
		if (!segment_char((unsigned char)name[i]))
			rc = -EINVAL;
	return rc;
}

int wblocks_segment_check(const char *name)
{
	return wblocks_segment_check_bytes(name, strnlen(name, WTREE_NAME_MAX + 1));
}

int wblocks_key_check(const char *key, size_t len)
{
	if (len == 0)
		return -EINVAL;
	if (len > WBLOCKS_KEY_MAX)
		return -ENAMETOOLONG;
	for (size_t start = 0; start <= len;) {
		const char *slash = memchr(key + start, '/', len - start);
		size_t end = slash ? (size_t)(slash - key) : len;
		int rc = wblocks_segment_check_bytes(key + start, end - start);
		if (rc < 0)
			return rc;
		start = end + 1;
	}
	return 0;
}
