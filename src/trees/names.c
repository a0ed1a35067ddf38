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
