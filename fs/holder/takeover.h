/* SPDX-License-Identifier: Apache-2.0 */
/* A daemon that a holder (fs/holder.h) started takes the session over
 * (DESIGN.md §8): its libfuse session reads the holder's /dev/fuse file
 * (mounted on /dev/fd/N), the kernel's INIT request recorded by the holder
 * is replayed through it (libfuse 3.14 has no takeover: the replay sets
 * the session up as the first daemon's was; the kernel refuses the second
 * reply, harmlessly), and after a crash the requests the dead daemon had
 * read are asked for again (FUSE_NOTIFY_RESEND, written to /dev/fuse: not
 * in libfuse 3.14) or, where the kernel cannot resend them, answered EIO
 * from the dead daemon's record of them (src/restart/held.h), never left hanging. */
#ifndef ARTFS_FS_TAKEOVER_H
#define ARTFS_FS_TAKEOVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fs/ops.h"
#include "restart/held.h"

enum takeover_start {
	TAKEOVER_FIRST,    /* the mount is new: the replayed INIT is the kernel's answer */
	TAKEOVER_CRASH,    /* the daemon before died: resend (or EIO) what it had read */
	TAKEOVER_UPGRADE,  /* the daemon before drains: serve once the holder says GO */
};

/* What a holder handed its daemon (the environment variable
 * ARTFS_TAKEOVER, every descriptor inherited). */
struct takeover {
	int fuse_fd;       /* /dev/fuse, the holder's open file */
	int held_fd;       /* the memory the holder keeps */
	int lock_fd;       /* the store's lock, held by the holder */
	int ctl;           /* the control link: READY, DRAIN, GO, DRAINED, UPGRADE */
	int fds;           /* the descriptor link: KEEP, FETCH, DROP */
	int life;          /* the lifeline (fs/lifeline.h); -1: the holder gave none */
	enum takeover_start start;
};

#define TAKEOVER_ENV "ARTFS_TAKEOVER"

/* The value of ARTFS_TAKEOVER for tk (buf of len bytes). */
void takeover_format(const struct takeover *tk, char *buf, size_t len);
/* tk from the environment: true when this process was started by a
 * holder (false and nothing set otherwise, or when the value is not one a
 * holder writes: logged). */
bool takeover_from_env(struct takeover *tk);

/* Whether the kernel's INIT request (len bytes) offers FUSE_HAS_RESEND;
 * false for anything that is not an INIT request. */
bool takeover_init_offers_resend(const void *init, size_t len);
/* Whether len bytes are a FUSE INIT request. */
bool takeover_is_init(const void *init, size_t len);

/* Takes the session over: se reads the holder's /dev/fuse and the
 * recorded INIT is replayed through it. 0 or -errno (logged). */
int takeover_session(struct fuse_session *se, const struct takeover *tk, struct held *held);

/* Before the first request is read: crashed, what the daemon before had
 * read is resent (or answered EIO); else its record is cleared. */
void takeover_recover(const struct takeover *tk, struct held *held, bool crashed);

/* Tells the holder this daemon serves (rc 0) or cannot start (rc < 0, why
 * in words). For an upgrade it then waits for the holder's GO: 0 the
 * daemon before drained, 1 it died instead (recover as after a crash),
 * -1 the holder said otherwise or is gone. */
int takeover_ready(const struct takeover *tk, int rc, const char *why);

#endif
