/* SPDX-License-Identifier: Apache-2.0 */
/* The holder's daemons: each started as this binary on disk with the
 * mount's descriptors, stopped and closed; the one that replaces a daemon
 * that ended is started after a pause when they die one after the other,
 * and a daemon that cannot serve is said once for each reason. What a
 * daemon's end leads to is holder.c's to decide; this file is the ground
 * of the folder: it calls none of the others. */
#include "autoconf.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fs/holder/holder_i.h"
#include "fs/holder/takeover.h"
#include "lib/log.h"

/* A daemon that dies within this long of its start, before it served,
 * counts as a fast failure: the next one waits a little longer (up to
 * RESTART_DELAY_MAX). */
#define FAST_FAILURE_NS 1000000000LL
#define RESTART_DELAY_MAX_MS 2000
/* Daemons that had served and die again and again, each within this long
 * of its start: from the CRASH_LOOP_FREE-th on the next one waits, as
 * after fast failures (a kill now and then is replaced at once). */
#define CRASH_LOOP_NS 250000000LL
#define CRASH_LOOP_FREE 3

void daemon_close(struct daemon *d)
{
	if (d->ctl >= 0)
		close(d->ctl);
	if (d->fds >= 0)
		close(d->fds);
	if (d->life >= 0)
		close(d->life);
	if (d->exec_err >= 0)
		close(d->exec_err);
	memset(d, 0, sizeof(*d));
	d->ctl = d->fds = d->life = d->exec_err = -1;
}

/* In the forked child: the daemon's descriptors open across exec, the
 * holder's death its own, then this binary as found on disk. */
static void exec_daemon(struct holder *h, const char *exe, enum takeover_start start, int ctl,
			int fds, int life, int exec_err)
{
	struct takeover tk = { .fuse_fd = h->fuse_fd, .held_fd = h->held_fd,
			       .lock_fd = h->lock_fd, .ctl = ctl, .fds = fds, .life = life,
			       .start = start };
	char env[256];
	sigset_t none;

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() == 1)
		_exit(127); /* the holder died before the line above */
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	signal(SIGPIPE, SIG_DFL);
	int keep[] = { h->fuse_fd, h->held_fd, h->lock_fd, ctl, fds, life };
	for (size_t i = 0; i < sizeof(keep) / sizeof(keep[0]); i++)
		fcntl(keep[i], F_SETFD, 0);
	takeover_format(&tk, env, sizeof(env));
	setenv(TAKEOVER_ENV, env, 1);
	h->o->argv[0] = h->exe;
	execv(exe, h->o->argv);
	int e = errno;
	fprintf(stderr, "artfs: cannot start the daemon %s: %s\n", exe, strerror(e));
	if (exec_err >= 0 && write(exec_err, &e, sizeof(e)) < 0)
		_exit(127); /* the holder sees exit status 127 alone */
	_exit(127);
}

/* Starts a daemon (exe: its binary, NULL for the one on disk). 0 or -errno. */
int daemon_start(struct holder *h, struct daemon *d, enum takeover_start start, const char *exe)
{
	int ctl[2], fds[2], life[2], err[2];

	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, ctl) < 0)
		return -errno;
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) < 0) {
		close(ctl[0]);
		close(ctl[1]);
		return -errno;
	}
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, life) < 0)
		life[0] = life[1] = -1; /* then SIGCHLD alone tells of its death */
	/* Closed by a successful exec; a failed one writes its errno. */
	if (pipe2(err, O_CLOEXEC | O_NONBLOCK) < 0)
		err[0] = err[1] = -1; /* then exit status 127 alone says it */
	pid_t pid = fork();
	if (pid == 0)
		exec_daemon(h, exe ? exe : h->exe, start, ctl[1], fds[1], life[1], err[1]);
	int fork_errno = errno;
	close(ctl[1]);
	close(fds[1]);
	if (life[1] >= 0)
		close(life[1]);
	if (err[1] >= 0)
		close(err[1]);
	if (pid < 0) {
		close(ctl[0]);
		close(fds[0]);
		if (life[0] >= 0)
			close(life[0]);
		if (err[0] >= 0)
			close(err[0]);
		return -fork_errno;
	}
	d->pid = pid;
	d->ctl = ctl[0];
	d->fds = fds[0];
	d->life = life[0];
	d->exec_err = err[0];
	d->started = holder_now_ns();
	d->ready = false;
	d->why[0] = '\0';
	/* While daemons cannot serve, each attempt is not worth a line. */
	log_msg(h->start_failure[0] ? LOG_DEBUG : LOG_INFO, "holder: daemon %ld started (%s)",
		(long)pid, start == TAKEOVER_FIRST ? "first" : start == TAKEOVER_CRASH
		? "after a crash" : "upgrade");
	return 0;
}

void daemon_stop(struct daemon *d, int sig)
{
	if (d->pid > 0)
		kill(d->pid, sig);
}

/* Why daemon d ended before it served, in words (how: its exit). */
void daemon_why_not_served(const struct holder *h, struct daemon *d, const char *how, char *why,
			   size_t len)
{
	int e = 0;

	if (d->why[0])
		snprintf(why, len, "%s", d->why);
	else if (d->exec_err >= 0 && read(d->exec_err, &e, sizeof(e)) == (ssize_t)sizeof(e))
		snprintf(why, len, "cannot execute %s: %s", h->exe, strerror(e));
	else
		snprintf(why, len, "it ended (%s) before it served", how);
}

/* A daemon could not serve: said once for each reason (a daemon is tried
 * again every RESTART_DELAY_MAX_MS at most: the store, the binary or the
 * configuration may be repaired meanwhile), and again when it changes. */
void daemon_start_failed(struct holder *h, pid_t pid, const char *why)
{
	h->start_failures++;
	if (h->start_failure[0] &&
	    strncmp(why, h->start_failure, sizeof(h->start_failure) - 1) == 0) {
		log_debug("holder: daemon %ld cannot serve either: %s", (long)pid, why);
		return;
	}
	snprintf(h->start_failure, sizeof(h->start_failure), "%.255s", why);
	log_err("holder: daemon %ld cannot serve: %s; another is started every %d s until one can "
		"(said again only if the reason changes)", (long)pid, why, RESTART_DELAY_MAX_MS / 1000);
}

void daemon_start_succeeded(struct holder *h, pid_t pid)
{
	if (h->start_failure[0])
		log_info("holder: daemon %ld serves, after %u daemons that could not", (long)pid,
			 h->start_failures);
	h->start_failure[0] = '\0';
	h->start_failures = 0;
}

/* How long to wait before the next daemon (ms): daemons that die before
 * they serve wait longer each time; so do daemons that served and die
 * again and again soon after their start (a request that kills them, until
 * it is answered EIO), past the first few. */
int daemon_restart_delay(struct holder *h, bool was_ready, int64_t lived)
{
	h->fast_failures = !was_ready && lived < FAST_FAILURE_NS ? h->fast_failures + 1 : 0;
	if (was_ready)
		h->crash_loop = lived < CRASH_LOOP_NS ? h->crash_loop + 1 : 0;
	unsigned n = h->fast_failures;
	if (!n && h->crash_loop >= CRASH_LOOP_FREE)
		n = h->crash_loop - CRASH_LOOP_FREE + 1;
	int delay = n ? 10 << (n < 8 ? n : 8) : 0;
	return delay > RESTART_DELAY_MAX_MS ? RESTART_DELAY_MAX_MS : delay;
}

/* The next daemon takes over from the one that ended: returns false when
 * none can be started (the holder ends). exe: the binary, NULL for the
 * one on disk. */
bool daemon_restart(struct holder *h, int delay_ms, const char *exe)
{
	if (delay_ms)
		usleep((useconds_t)delay_ms * 1000);
	h->restarts++;
	int rc = daemon_start(h, &h->cur, TAKEOVER_CRASH, exe);
	if (rc < 0) {
		log_err("holder: cannot start a daemon: %s; the mount ends", strerror(-rc));
		return false;
	}
	return true;
}
