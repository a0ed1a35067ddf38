/* SPDX-License-Identifier: Apache-2.0 */
/* Requests that kill daemon after daemon: the daemons note the requests
 * they serve (src/restart/held.h); one in flight at each of the last few
 * deaths of daemons is answered EIO instead of being sent to the next. */
#include "autoconf.h"

#include <errno.h>
#include <linux/fuse.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fs/holder/holder_i.h"
#include "lib/log.h"
#include "restart/held.h"

/* A request in flight at this many deaths in a row, each by a fault of the
 * daemon (not a SIGKILL, SIGTERM or SIGINT from outside), is answered EIO
 * instead of being sent to the next daemon: it is what kills them. */
#define POISON_DEATHS 3

/* The daemons' notes of the requests they serve (src/restart/held.h), mapped the
 * first time they are wanted: NULL when they cannot be. */
static struct held_inflight *inflight_of(struct holder *h)
{
	struct held_header hdr;

	if (h->inflight || h->held_fd < 0)
		return h->inflight;
	if (pread(h->held_fd, &hdr, sizeof(hdr), 0) != (ssize_t)sizeof(hdr) ||
	    hdr.magic != HELD_MAGIC || hdr.layout != HELD_LAYOUT)
		return NULL;
	size_t len = hdr.inflight_off + (size_t)HELD_INFLIGHT * sizeof(struct held_inflight);
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, h->held_fd, 0);
	if (p == MAP_FAILED) {
		log_warn("holder: cannot map the daemons' notes of their requests: %s; a request "
			 "that kills daemon after daemon is not found", strerror(errno));
		return NULL;
	}
	h->inflight = (struct held_inflight *)((uint8_t *)p + hdr.inflight_off);
	return h->inflight;
}

static const char *opcode_name(uint32_t op)
{
	switch (op) {
	case FUSE_LOOKUP: return "LOOKUP";
	case FUSE_GETATTR: return "GETATTR";
	case FUSE_SETATTR: return "SETATTR";
	case FUSE_MKDIR: return "MKDIR";
	case FUSE_UNLINK: return "UNLINK";
	case FUSE_RMDIR: return "RMDIR";
	case FUSE_RENAME: return "RENAME";
	case FUSE_OPEN: return "OPEN";
	case FUSE_READ: return "READ";
	case FUSE_WRITE: return "WRITE";
	case FUSE_RELEASE: return "RELEASE";
	case FUSE_FSYNC: return "FSYNC";
	case FUSE_GETXATTR: return "GETXATTR";
	case FUSE_LISTXATTR: return "LISTXATTR";
	case FUSE_FLUSH: return "FLUSH";
	case FUSE_OPENDIR: return "OPENDIR";
	case FUSE_READDIR: return "READDIR";
	case FUSE_CREATE: return "CREATE";
	case FUSE_READDIRPLUS: return "READDIRPLUS";
	default: return "request";
	}
}

/* Requests the kernel waits an answer for (not FORGETs, interrupts). */
static bool awaits_answer(uint32_t op)
{
	return op != FUSE_FORGET && op != FUSE_BATCH_FORGET && op != FUSE_INTERRUPT;
}

/* Answers the request noted in f EIO (the kernel still holds it as read by
 * the dead daemon) and clears the note, before the next daemon has the
 * kernel send what is left again. */
static void answer_eio(struct holder *h, struct held_inflight *f, uint64_t unique, uint32_t op,
		       unsigned deaths)
{
	struct fuse_out_header out = { .len = sizeof(out), .error = -EIO, .unique = unique };
	ssize_t n = write(h->fuse_fd, &out, sizeof(out));

	atomic_store(&f->unique, 0);
	atomic_store(&f->opcode, 0);
	log_err("holder: request %llu (%s, opcode %u; its node is not noted) was being served at "
		"each of the last %u deaths of daemons: %s instead of being sent to the next one",
		(unsigned long long)(unique & ~(1ULL << 63)), opcode_name(op), op, deaths,
		n == (ssize_t)sizeof(out) ? "answered EIO" : "it was answered already");
}

/* A daemon died (status as waitpid's): a request in flight at this death
 * and the POISON_DEATHS - 1 before, each by a fault of the daemon, is what
 * kills them: it is answered EIO. Deaths from outside (SIGKILL, SIGTERM,
 * SIGINT: a kill, the OOM killer) neither count nor break the row; nor do
 * daemons that exited before they served (the notes are still the last
 * serving daemon's: a store that cannot be opened is not the request's
 * fault). */
void poison_check(struct holder *h, int status)
{
	int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
	struct held_inflight *f = inflight_of(h);
	struct strike now[POISON_TRACK];
	unsigned n = 0;

	if (!f || sig == SIGKILL || sig == SIGTERM || sig == SIGINT)
		return;
	for (unsigned i = 0; i < HELD_INFLIGHT && n < POISON_TRACK; i++) {
		uint64_t unique = atomic_load(&f[i].unique);
		uint32_t op = atomic_load(&f[i].opcode);
		if (!unique || !awaits_answer(op))
			continue;
		uint64_t id = unique & ~(1ULL << 63); /* a resent request carries bit 63 */
		unsigned deaths = 1;
		for (unsigned k = 0; k < h->nstrikes; k++)
			if (h->strikes[k].unique == id)
				deaths = h->strikes[k].deaths + 1;
		if (deaths >= POISON_DEATHS)
			answer_eio(h, &f[i], unique, op, deaths);
		else
			now[n++] = (struct strike){ id, deaths };
	}
	memcpy(h->strikes, now, n * sizeof(now[0]));
	h->nstrikes = n;
}
