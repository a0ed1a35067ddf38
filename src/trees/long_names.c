/* SPDX-License-Identifier: Apache-2.0 */
/* The whole name of a file being written whose name is longer than the
 * holder's record of its node keeps (HELD_NAME_MAX): kept beside the
 * temporary files as <tmp_dir>/n.<inode> while the file is written, read
 * by a next daemon that makes the file again (nodes.c), dropped when the
 * file ends (file.c). */
#include "autoconf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lib/log.h"
#include "trees/wtree_i.h"

#define LONG_NAME_PREFIX "n."

static void long_name_file(char *buf, size_t len, uint64_t ino)
{
	snprintf(buf, len, LONG_NAME_PREFIX "%llx", (unsigned long long)ino);
}

bool wlong_name_file(const char *file, uint64_t *ino)
{
	const char *hex = file + strlen(LONG_NAME_PREFIX);

	if (strncmp(file, LONG_NAME_PREFIX, strlen(LONG_NAME_PREFIX)) != 0 || !*hex ||
	    strspn(hex, "0123456789abcdef") != strlen(hex) || strlen(hex) > 16)
		return false;
	*ino = strtoull(hex, NULL, 16);
	return true;
}

int wlong_name_keep(struct wtree *w, uint64_t ino, const char *name)
{
	char file[32];
	size_t len = strlen(name);

	long_name_file(file, sizeof(file), ino);
	int fd = openat(w->tmp_fd, file, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC,
			0600);
	if (fd < 0)
		return -errno;
	/* No fsync: it serves a next daemon on this machine, as the
	 * temporary file it names does. */
	ssize_t n = write(fd, name, len);
	int rc = n == (ssize_t)len ? 0 : n < 0 ? -errno : -EIO;
	close(fd);
	if (rc < 0)
		unlinkat(w->tmp_fd, file, 0);
	return rc;
}

int wlong_name_read(struct wtree *w, uint64_t ino, const char *prefix, char *name, size_t size)
{
	char file[32];

	long_name_file(file, sizeof(file), ino);
	int fd = openat(w->tmp_fd, file, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	ssize_t n = read(fd, name, size);
	close(fd);
	if (n <= 0 || (size_t)n >= size)
		return -EBADMSG; /* empty, unreadable, or longer than a name */
	name[n] = '\0';
	if (strlen(name) != (size_t)n || w->p->name_check(name) != 0 ||
	    strncmp(name, prefix, strlen(prefix)) != 0)
		return -EBADMSG;
	return 0;
}

void wlong_name_drop(struct wtree *w, uint64_t ino)
{
	char file[32];

	long_name_file(file, sizeof(file), ino);
	if (unlinkat(w->tmp_fd, file, 0) < 0 && errno != ENOENT)
		log_err("%s: %s/%s: %s", w->p->label, w->p->tmp_dir, file, strerror(errno));
}
