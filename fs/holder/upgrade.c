/* SPDX-License-Identifier: Apache-2.0 */
/* Upgrades: the binary on disk is started beside the serving daemon,
 * which drains once the new one is ready and hands over to it; a failure
 * at any step leaves the old one serving (or a fresh one of its binary).
 * The outcome is written where `artfsctl upgrade` reads it. */
#include "autoconf.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fs/holder/holder_i.h"
#include "fs/holder/takeover.h"
#include "lib/log.h"
#include "restart/keeper.h"

/* A daemon started for an upgrade that dies this soon after it took over
 * makes the upgrade a failure after all. */
#define UPGRADE_SETTLE_NS 1000000000LL
/* The holder's record of its last upgrade, in the store's directory (which
 * `artfsctl upgrade` finds in .artfs/config): "<seq> <state> <pid> <why>". */
#define UPGRADE_OUTCOME "upgrade-outcome"

static const char *const upgrade_words[] = { "none", "started", "served", "failed" };

/* Writes "<seq> <state> <pid> <why>" whole (renamed into place) to the
 * store's directory, where `artfsctl upgrade` reads it. */
static void outcome_write(struct holder *h, uint64_t seq, enum upgrade_state state, pid_t pid,
			  const char *why)
{
	char line[640];
	int n = snprintf(line, sizeof(line), "%llu %s %ld %.600s\n", (unsigned long long)seq,
			 upgrade_words[state], (long)pid, why);
	int dir = open(h->o->store, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	int fd = dir < 0 ? -1 : openat(dir, UPGRADE_OUTCOME ".new",
				       O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
	bool ok = fd >= 0 && write(fd, line, (size_t)n) == n;
	if (fd >= 0)
		close(fd);
	ok = ok && renameat(dir, UPGRADE_OUTCOME ".new", dir, UPGRADE_OUTCOME) == 0;
	if (!ok)
		log_warn("holder: cannot record the upgrade's outcome in %s/%s: %s (artfsctl upgrade "
			 "then learns less)", h->o->store, UPGRADE_OUTCOME, strerror(errno));
	if (dir >= 0)
		close(dir);
}

/* The upgrade under way is in state now (why: in words). A failure or a
 * success is recorded once; a success becomes a failure when its daemon
 * dies right after it took over. */
__attribute__((format(printf, 4, 5)))
void upgrade_record(struct holder *h, enum upgrade_state state, pid_t pid, const char *fmt, ...)
{
	char why[600];
	va_list ap;

	if (h->upgrade_state == UPGRADE_FAILED ||
	    (h->upgrade_state == UPGRADE_SERVED && state != UPGRADE_FAILED))
		return;
	h->upgrade_state = state;
	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	outcome_write(h, h->upgrade_seq, state, pid, why);
}

/* Why an upgrade cannot begin now, or NULL. */
static const char *upgrade_refusal(const struct holder *h)
{
	return h->next.pid > 0 ? "one is under way"
	     : h->drain_sent ? "the daemon drains for the last one"
	     : !h->cur.ready ? "the daemon is starting"
	     : h->stopping ? "stopping" : NULL;
}

void upgrade_begin(struct holder *h, const char *why)
{
	const char *refused = upgrade_refusal(h);

	if (refused && !h->stopping && h->next.pid <= 0 && !h->drain_sent && !h->cur.ready) {
		/* A SIGHUP or `artfsctl upgrade` right after a start or a crash:
		 * the daemon's READY may be on its way; the upgrade waits for it. */
		h->upgrade_deferred = true;
		log_info("holder: upgrade (%s) waits: daemon %ld is starting; it begins once that "
			 "one serves", why, (long)h->cur.pid);
		return;
	}
	if (refused) {
		log_warn("holder: upgrade (%s) refused: %s", why, refused);
		char text[96];
		snprintf(text, sizeof(text), "refused: %s", refused);
		outcome_write(h, ++h->upgrade_seq, UPGRADE_FAILED, 0, text);
		return;
	}
	h->upgrade_seq++;
	h->upgrade_state = UPGRADE_NONE;
	if (access(h->exe, X_OK) < 0) {
		int e = errno;
		log_err("holder: upgrade (%s): cannot execute %s: %s; daemon %ld keeps serving", why,
			h->exe, strerror(e), (long)h->cur.pid);
		upgrade_record(h, UPGRADE_FAILED, 0, "cannot execute %s: %s; daemon %ld keeps serving",
			       h->exe, strerror(e), (long)h->cur.pid);
		return;
	}
	log_info("holder: upgrade (%s): starting %s beside daemon %ld", why, h->exe,
		 (long)h->cur.pid);
	int rc = daemon_start(h, &h->next, TAKEOVER_UPGRADE, NULL);
	if (rc < 0) {
		log_err("holder: upgrade: cannot start %s: %s", h->exe, strerror(-rc));
		upgrade_record(h, UPGRADE_FAILED, 0, "cannot start %s: %s; daemon %ld keeps serving",
			       h->exe, strerror(-rc), (long)h->cur.pid);
		return;
	}
	upgrade_record(h, UPGRADE_STARTED, h->next.pid, "daemon %ld started beside daemon %ld",
		       (long)h->next.pid, (long)h->cur.pid);
}

/* Whether the upgrade's daemon has ended (its SIGCHLD may not be read yet). */
bool upgrade_next_has_ended(const struct holder *h)
{
	siginfo_t si;

	memset(&si, 0, sizeof(si));
	return waitid(P_PID, (id_t)h->next.pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 &&
	       si.si_pid == h->next.pid;
}

void upgrade_drain_exe_close(struct holder *h)
{
	if (h->drain_exe_fd >= 0)
		close(h->drain_exe_fd);
	h->drain_exe_fd = -1;
}

/* The upgrade's daemon takes over: GO, with whether the one before died.
 * false when it has ended itself (it cannot). */
bool upgrade_switch(struct holder *h, bool crashed)
{
	struct keeper_msg go = keeper_msg_make(KEEPER_GO, NULL, crashed ? 1 : 0);

	if (upgrade_next_has_ended(h) || keeper_send(h->next.ctl, &go, -1) < 0)
		return false;
	log_info("holder: daemon %ld serves (upgrade, the one before %s)", (long)h->next.pid,
		 crashed ? "died while it drained" : "drained");
	upgrade_record(h, UPGRADE_SERVED, h->next.pid, "daemon %ld serves, after daemon %ld",
		       (long)h->next.pid, (long)h->cur.pid);
	h->upgrades++;
	h->upgraded_pid = h->next.pid;
	h->upgraded_at = holder_now_ns();
	h->drain_sent = false;
	upgrade_drain_exe_close(h);
	h->cur = h->next;
	h->cur.ready = true;
	memset(&h->next, 0, sizeof(h->next));
	h->next.ctl = h->next.fds = h->next.life = h->next.exec_err = -1;
	return true;
}

/* The upgrade's daemon is ready: the serving one drains. Its binary is
 * kept open: should the new one die before it takes over, a fresh daemon
 * of the binary that served starts once the old one has drained. */
void upgrade_drain(struct holder *h)
{
	char path[64];
	struct keeper_msg drain = keeper_msg_make(KEEPER_DRAIN, NULL, 0);

	upgrade_drain_exe_close(h);
	snprintf(path, sizeof(path), "/proc/%ld/exe", (long)h->cur.pid);
	h->drain_exe_fd = open(path, O_RDONLY | O_CLOEXEC);
	h->drain_sent = true;
	keeper_send(h->cur.ctl, &drain, -1);
}

/* The upgrade's daemon ended before it took over. */
void upgrade_on_next_end(struct holder *h, pid_t pid, const char *how)
{
	char why[KEEPER_TAG_MAX + PATH_MAX + 64];

	daemon_why_not_served(h, &h->next, how, why, sizeof(why));
	if (h->drain_sent) {
		log_err("holder: the upgrade's daemon %ld ended before it took over: %s; daemon %ld "
			"was told to drain: a fresh daemon takes over once it has", (long)pid, why,
			(long)h->cur.pid);
		upgrade_record(h, UPGRADE_FAILED, pid, "the new daemon %ld ended before it took "
			       "over: %s; a fresh daemon of the binary that served takes over from "
			       "daemon %ld", (long)pid, why, (long)h->cur.pid);
	} else {
		log_err("holder: the upgrade's daemon %ld ended before it served: %s; daemon %ld "
			"keeps serving", (long)pid, why, (long)h->cur.pid);
		upgrade_record(h, UPGRADE_FAILED, pid, "the new daemon %ld ended before it served: "
			       "%s; daemon %ld keeps serving", (long)pid, why, (long)h->cur.pid);
	}
	daemon_close(&h->next);
}

/* A daemon died: the upgrade's daemon, right after it took over, makes
 * the upgrade a failure after all. */
void upgrade_check_death(struct holder *h, pid_t pid, const char *how)
{
	if (pid == h->upgraded_pid && holder_now_ns() - h->upgraded_at < UPGRADE_SETTLE_NS)
		upgrade_record(h, UPGRADE_FAILED, pid, "the new daemon %ld died (%s) right after "
			       "it took over; the next daemon is started", (long)pid, how);
}
