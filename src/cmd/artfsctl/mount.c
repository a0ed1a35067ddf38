/* SPDX-License-Identifier: Apache-2.0 */
/* artfsctl and the mount: a path in it, whether it is an artfs mount, a
 * line written to its .artfs/control, and the writes and the clock that
 * the commands' waits on it use. */
#include "autoconf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cmd/artfsctl/artfsctl_i.h"

char *ctl_path_in(const char *mnt, const char *rel)
{
	size_t a = strlen(mnt), b = strlen(rel);
	bool slash = a > 0 && mnt[a - 1] == '/';
	char *p = malloc(a + b + 2);

	if (p)
		snprintf(p, a + b + 2, "%s%s%s", mnt, slash ? "" : "/", rel);
	return p;
}

/* An artfs mount is a directory whose .artfs/config can be read. */
int ctl_mount_check(const struct ctl *ctl)
{
	if (!*ctl->mnt)
		return ctl_bad_usage("the mount point is an empty string");
	char *path = ctl_path_in(ctl->mnt, ".artfs/config");
	if (!path)
		return ctl_fail("out of memory");
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	int err = errno;
	free(path);
	if (fd < 0)
		return ctl_fail("%s is not an artfs mount (.artfs/config: %s)", ctl->mnt, strerror(err));
	close(fd);
	return 0;
}

int ctl_control_write(const struct ctl *ctl, const char *what, const char *line)
{
	char *path = ctl_path_in(ctl->mnt, ".artfs/control");
	if (!path)
		return -ENOMEM;
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	free(path);
	if (fd < 0)
		return -errno;
	int rc = ctl_write_all(fd, line, strlen(line));
	if (close(fd) < 0 && rc == 0)
		rc = -errno;
	(void)what;
	return rc;
}

/* Writes all of buf, across short writes and signals. Returns 0 or -errno. */
int ctl_write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len > 0) {
		ssize_t w = write(fd, p, len);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return -errno;
		if (w == 0)
			return -EIO;
		p += w;
		len -= (size_t)w;
	}
	return 0;
}

double ctl_seconds_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}
