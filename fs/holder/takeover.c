/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/fuse.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fs/holder/takeover.h"
#include "lib/log.h"
#include "restart/keeper.h"

/* Kernel 6.9, protocol 7.40; not in the headers of Debian 12. */
#ifndef FUSE_NOTIFY_RESEND
#define FUSE_NOTIFY_RESEND 7
#endif
#define HAS_RESEND_FLAGS2 (1u << (39 - 32))

static const char *const start_names[] = { "first", "crash", "upgrade" };

void takeover_format(const struct takeover *tk, char *buf, size_t len)
{
	snprintf(buf, len, "fuse=%d,held=%d,lock=%d,ctl=%d,fds=%d,start=%s,life=%d", tk->fuse_fd,
		 tk->held_fd, tk->lock_fd, tk->ctl, tk->fds, start_names[tk->start], tk->life);
}

bool takeover_from_env(struct takeover *tk)
{
	const char *v = getenv(TAKEOVER_ENV);
	char start[16];
	struct takeover t;
	int n = 0;

	if (!v)
		return false;
	int m = 0;
	t.life = -1; /* a holder of a build before lifelines gives none */
	if (sscanf(v, "fuse=%d,held=%d,lock=%d,ctl=%d,fds=%d,start=%15[a-z]%n", &t.fuse_fd,
		   &t.held_fd, &t.lock_fd, &t.ctl, &t.fds, start, &n) != 6 ||
	    (v[n] == ',' && (sscanf(v + n, ",life=%d%n", &t.life, &m) != 1 || t.life < -1)) ||
	    v[n + m] != '\0') {
		log_err("%s=\"%.200s\" is not what a holder writes; serving without one",
			TAKEOVER_ENV, v);
		return false;
	}
	for (size_t i = 0; i < sizeof(start_names) / sizeof(start_names[0]); i++)
		if (strcmp(start, start_names[i]) == 0) {
			t.start = (enum takeover_start)i;
			*tk = t;
			unsetenv(TAKEOVER_ENV); /* not for what this daemon starts itself */
			return true;
		}
	log_err("%s: unknown start \"%s\"", TAKEOVER_ENV, start);
	return false;
}

bool takeover_is_init(const void *init, size_t len)
{
	struct fuse_in_header in;

	if (len < sizeof(in) + 16)
		return false;
	memcpy(&in, init, sizeof(in));
	return in.opcode == FUSE_INIT && in.len == len;
}

bool takeover_init_offers_resend(const void *init, size_t len)
{
	struct fuse_init_in arg;
	size_t at = sizeof(struct fuse_in_header);

	if (!takeover_is_init(init, len))
		return false;
	memset(&arg, 0, sizeof(arg));
	memcpy(&arg, (const uint8_t *)init + at, len - at < sizeof(arg) ? len - at : sizeof(arg));
	if (arg.major != 7 || arg.minor < 40 || !(arg.flags & FUSE_INIT_EXT) ||
	    len - at < offsetof(struct fuse_init_in, flags2) + sizeof(arg.flags2))
		return false;
	return arg.flags2 & HAS_RESEND_FLAGS2;
}

static int write_out(int fd, uint64_t unique, int32_t error)
{
	struct fuse_out_header out = { .len = sizeof(out), .error = error, .unique = unique };
	ssize_t n = write(fd, &out, sizeof(out));

	return n == (ssize_t)sizeof(out) ? 0 : n < 0 ? -errno : -EIO;
}

/* Requests that are never answered: nothing to resend or fail. */
static bool answered(uint32_t opcode)
{
	return opcode != FUSE_FORGET && opcode != FUSE_BATCH_FORGET && opcode != FUSE_INTERRUPT;
}

/* Without the kernel's resend: every request the dead daemon noted as
 * being served fails with EIO, so that no client waits for good. A window
 * remains: a request it had read but not noted yet (fs/loop.c notes it
 * right after the read) is not known here and stays unanswered; only the
 * kernel's resend knows every request that was read. Returns how many. */
static unsigned fail_lost(int fd, struct held *held)
{
	unsigned failed = 0;

	for (unsigned i = 0; i < HELD_INFLIGHT; i++) {
		struct held_inflight *f = held_inflight(held, i);
		uint64_t unique = atomic_load(&f->unique);
		uint32_t opcode = atomic_load(&f->opcode);
		if (!unique || !answered(opcode))
			continue;
		int rc = write_out(fd, unique, -EIO);
		log_warn("takeover: request %llu (opcode %u) was being served by the daemon that "
			 "died; %s", (unsigned long long)unique, opcode,
			 rc == 0 ? "answered EIO" : "already answered");
		failed += rc == 0;
	}
	return failed;
}

static void forget_inflight(struct held *held)
{
	for (unsigned i = 0; i < HELD_INFLIGHT; i++) {
		struct held_inflight *f = held_inflight(held, i);
		atomic_store(&f->unique, 0);
		atomic_store(&f->opcode, 0);
	}
}

/* After a crash: where the kernel can, it moves what the dead daemon had
 * read back to its queue (resent requests carry bit 63 in their unique):
 * with resend=1 they are served again, with resend=0 each is answered EIO
 * as it comes back (fs/loop.c), so that no request read is
 * missed, whenever the daemon died. Without the kernel's resend they are
 * answered EIO from the dead daemon's notes. */
static void recover_lost(int fd, struct held *held)
{
	uint32_t flags = held->hdr->flags;
	unsigned inflight = 0;

	for (unsigned i = 0; i < HELD_INFLIGHT; i++)
		inflight += atomic_load(&held_inflight(held, i)->unique) != 0;
	if (flags & HELD_KERNEL_RESEND) {
		int rc = write_out(fd, 0, FUSE_NOTIFY_RESEND);
		if (rc == 0) {
			log_info("takeover: asked the kernel to resend the requests the daemon that "
				 "died had read (%u were being served)%s", inflight,
				 flags & HELD_NO_RESEND ? "; resend=0: each is answered EIO" : "");
			forget_inflight(held);
			return;
		}
		log_err("takeover: the kernel refused FUSE_NOTIFY_RESEND (%s); the requests "
			"the daemon that died was serving are answered EIO", strerror(-rc));
	}
	unsigned failed = fail_lost(fd, held);
	if (inflight)
		log_warn("takeover: %u requests lost with the daemon that died were answered EIO",
			 failed);
	forget_inflight(held);
}

int takeover_session(struct fuse_session *se, const struct takeover *tk, struct held *held)
{
	char dev[32];
	uint32_t len = held->hdr->init_len;

	if (!takeover_is_init(held->hdr->init, len)) {
		log_err("takeover: the holder keeps no FUSE INIT request");
		return -EINVAL;
	}
	snprintf(dev, sizeof(dev), "/dev/fd/%d", tk->fuse_fd);
	if (fuse_session_mount(se, dev) != 0) {
		log_err("takeover: cannot use %s as the session's device", dev);
		return -EIO;
	}
	/* libfuse reads requests into buffers of its own; the INIT it sees is
	 * a copy, so the holder's stays as it was for the next daemon. */
	void *copy = malloc(len);
	if (!copy)
		return -ENOMEM;
	memcpy(copy, held->hdr->init, len);
	struct fuse_buf buf = { .size = len, .mem = copy };
	fuse_session_process_buf(se, &buf);
	free(copy);
	if (fuse_session_exited(se)) {
		log_err("takeover: the recorded FUSE INIT request was refused by this daemon");
		return -EPROTO;
	}
	return 0;
}

void takeover_recover(const struct takeover *tk, struct held *held, bool crashed)
{
	if (crashed)
		recover_lost(tk->fuse_fd, held);
	else
		forget_inflight(held);
}

int takeover_ready(const struct takeover *tk, int rc, const char *why)
{
	struct keeper_msg m = keeper_msg_make(KEEPER_READY, why, rc);

	if (keeper_send(tk->ctl, &m, -1) < 0 || rc < 0)
		return -1;
	if (tk->start != TAKEOVER_UPGRADE)
		return 0;
	/* The daemon before drains meanwhile; GO says whether it died instead. */
	int r = keeper_recv(tk->ctl, &m, NULL, -1);
	if (r < 0 || m.type != KEEPER_GO)
		return -1;
	return m.value ? 1 : 0;
}
