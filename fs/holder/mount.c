/* SPDX-License-Identifier: Apache-2.0 */
/* The mount: made with the kernel's INIT recorded for every daemon, found
 * in /proc/self/mountinfo and watched there; when it is gone the daemon is
 * stopped, and a daemon that does not end has its FUSE connection aborted. */
#include "autoconf.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fs/holder/holder_i.h"
#include "fs/holder/takeover.h"
#include "lib/log.h"
#include "restart/held.h"
#include "restart/keeper.h"

/* A read of /dev/fuse takes a buffer of 8 KiB at least; INIT is small. */
#define INIT_BUF (64u << 10)

/* Reads the kernel's INIT request, the first thing on a new connection. */
static int read_init(int fd, uint8_t **init, size_t *len)
{
	uint8_t *buf = malloc(INIT_BUF);
	ssize_t n;

	if (!buf)
		return -ENOMEM;
	while ((n = read(fd, buf, INIT_BUF)) < 0 && (errno == EINTR || errno == EAGAIN))
		;
	if (n < 0 || !takeover_is_init(buf, (size_t)n)) {
		int rc = n < 0 ? -errno : -EPROTO;
		free(buf);
		return rc;
	}
	*init = buf;
	*len = (size_t)n;
	return 0;
}

/* The id of the last mount of fuse.artfs at path in /proc/self/mountinfo
 * (whose text is read from fd), or 0 when there is none. Paths there escape
 * a space, tab, newline and backslash as \ooo. */
static uint64_t mount_id_at(int fd, const char *path, unsigned *minor_out)
{
	char *text = NULL, esc[PATH_MAX * 4];
	size_t len = 0, cap = 0;
	uint64_t found = 0;

	size_t e = 0;
	for (const char *p = path; *p && e + 5 < sizeof(esc); p++)
		e += (size_t)(strchr(" \t\n\\", *p) && *p ? snprintf(esc + e, 5, "\\%03o", *p)
							: snprintf(esc + e, 2, "%c", *p));
	esc[e] = '\0';
	if (lseek(fd, 0, SEEK_SET) < 0)
		return 0;
	for (;;) {
		if (len + 4096 + 1 > cap) {
			char *more = realloc(text, cap = cap ? cap * 2 : 65536);
			if (!more)
				break;
			text = more;
		}
		ssize_t n = read(fd, text + len, cap - len - 1);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		len += (size_t)n;
	}
	if (!text)
		return 0;
	text[len] = '\0';
	for (char *line = text; line && *line;) {
		char *next = strchr(line, '\n');
		if (next)
			*next++ = '\0';
		unsigned long long id;
		unsigned major, minor;
		char mp[sizeof(esc)], *sep = strstr(line, " - ");
		_Static_assert(sizeof(mp) == 16384, "the width below");
		if (sep && sscanf(line, "%llu %*u %u:%u %*s %16383s", &id, &major, &minor, mp) == 4 &&
		    strcmp(mp, esc) == 0 && strncmp(sep + 3, "fuse.artfs ", 11) == 0) {
			found = id;
			if (minor_out)
				*minor_out = minor;
		}
		line = next;
	}
	free(text);
	return found;
}

/* The mount table changed: is the mount gone? Then the daemon is stopped
 * (what a daemon holds on to, the attach socket's clone of the mount, would
 * keep the file system alive unseen). */
void mount_changed(struct holder *h)
{
	if (h->unmounted || !h->mnt_id ||
	    mount_id_at(h->mountinfo_fd, h->o->mountpoint, NULL) == h->mnt_id)
		return;
	h->unmounted = true;
	h->end_by = holder_now_ns() + (int64_t)UNMOUNTED_END_MS * 1000000;
	log_info("holder: %s was unmounted; stopping", h->o->mountpoint);
	keeper_store_drop(h->kept, "", true); /* the attach socket, kept slabs: the mount is over */
	daemon_stop(&h->cur, SIGTERM);
	daemon_stop(&h->next, SIGKILL);
}

/* After the session's unmount: libfuse does not unmount a mount whose
 * connection was aborted (its device polls POLLERR, which it reads as
 * "unmounted already"), so a stop whose daemon had to be cut off left the
 * mount behind, every access ENOTCONN. What is left is detached here. */
void mount_detach_if_left(struct holder *h)
{
	if (!h->mnt_id || h->mountinfo_fd < 0 ||
	    mount_id_at(h->mountinfo_fd, h->o->mountpoint, NULL) != h->mnt_id)
		return;
	if (umount2(h->o->mountpoint, MNT_DETACH) == 0) {
		log_info("holder: %s detached (its connection had been aborted)", h->o->mountpoint);
		return;
	}
	int e = errno;
	pid_t pid = e == EPERM ? fork() : -1;
	if (pid == 0) {
		execlp("fusermount3", "fusermount3", "-u", "-z", h->o->mountpoint, (char *)NULL);
		_exit(127);
	}
	int status = 0;
	if (pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
	    WEXITSTATUS(status) == 0)
		return;
	log_err("holder: cannot unmount %s: %s; `umount -l %s` ends it", h->o->mountpoint,
		strerror(e), h->o->mountpoint);
}

/* The daemon of an unmounted mount did not end: the FUSE connection is
 * aborted (fusectl, mounted if it is not), so that every request waiting
 * for an answer fails, and the daemon is killed. */
void mount_abort_connection(struct holder *h)
{
	char path[96];
	int fd = -1;

	snprintf(path, sizeof(path), "/sys/fs/fuse/connections/%u/abort", h->conn);
	for (int attempt = 0; attempt < 2 && fd < 0; attempt++) {
		fd = open(path, O_WRONLY | O_CLOEXEC);
		if (fd < 0 && attempt == 0 && errno == ENOENT)
			mount("fusectl", "/sys/fs/fuse/connections", "fusectl", 0, NULL);
	}
	int e = fd < 0 ? errno : 0;
	bool done = fd >= 0 && write(fd, "1", 1) == 1;
	/* No such connection: the unmount ended the last mount of the file
	 * system (no attach socket held it yet), and the kernel aborted the
	 * connection itself. */
	log_warn("holder: daemon %ld did not end within %d s of the unmount or the stop; %s; "
		 "killing it",
		 (long)h->cur.pid, UNMOUNTED_END_MS / 1000,
		 done	       ? "aborted its FUSE connection"
		 : e == ENOENT ? "its FUSE connection ended with the file system"
			       : "cannot abort its FUSE connection");
	if (fd >= 0)
		close(fd);
	daemon_stop(&h->cur, SIGKILL);
}

/* Makes the mount, records INIT and the memory the daemons share. */
int mount_and_record(struct holder *h, struct fuse_session *se)
{
	uint8_t *init = NULL;
	size_t len = 0;

	if (fuse_session_mount(se, h->o->mountpoint) != 0)
		return -EIO;
	h->mountinfo_fd = open("/proc/self/mountinfo", O_RDONLY | O_CLOEXEC);
	if (h->mountinfo_fd >= 0)
		h->mnt_id = mount_id_at(h->mountinfo_fd, h->o->mountpoint, &h->conn);
	if (!h->mnt_id)
		log_warn("holder: %s is not in /proc/self/mountinfo: an unmount is seen only when the "
			 "file system ends", h->o->mountpoint);
	h->fuse_fd = fcntl(fuse_session_fd(se), F_DUPFD, 3); /* without close-on-exec */
	if (h->fuse_fd < 0)
		return -errno;
	int rc = read_init(h->fuse_fd, &init, &len);
	if (rc < 0) {
		log_err("holder: no FUSE INIT request from the kernel: %s", strerror(-rc));
		return rc;
	}
	uint32_t flags = takeover_init_offers_resend(init, len) ? HELD_KERNEL_RESEND : 0;
	if (h->o->no_resend)
		flags |= HELD_NO_RESEND;
	h->held_fd = held_create(init, len, flags);
	free(init);
	if (h->held_fd < 0)
		return h->held_fd;
	log_info("holder: mounted %s; the kernel %s resend requests a daemon leaves unanswered%s",
		 h->o->mountpoint, flags & HELD_KERNEL_RESEND ? "can" : "cannot",
		 h->o->no_resend ? " (resend=0: they are answered EIO)" : "");
	return 0;
}
