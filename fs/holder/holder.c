/* SPDX-License-Identifier: Apache-2.0 */
/* The holder's life: make the mount, record INIT, start the first daemon,
 * then wait for what comes: a daemon that dies is replaced (and told it
 * takes over from a crash), SIGHUP or a daemon's UPGRADE starts the binary
 * on disk beside the serving one and switches over once that one drained,
 * SIGTERM/SIGINT stop the daemon and unmount, a daemon that ends cleanly
 * (the file system was unmounted) ends the holder. Descriptors the daemons
 * give it are kept across them (src/restart/keeper.h).
 * This file owns that life (holder_run) and its loop: the signals, the
 * daemons' messages and lifelines it waits for, what a daemon's end leads
 * to (the next daemon, an upgrade's outcome, the holder's end) and the
 * wait for the last ones at the end. Beside it, below it: upgrade.c,
 * poison.c, mount.c, and under them all daemons.c (holder_i.h says what
 * each gives). */
#include "autoconf.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fs/holder/holder.h"
#include "fs/holder/holder_i.h"
#include "fs/holder/lifeline.h"
#include "fs/holder/takeover.h"
#include "lib/log.h"
#include "restart/keeper.h"
#include "store/store.h"

/* How long a daemon started for an upgrade may take to be ready. */
#define UPGRADE_READY_MS 60000
/* How long the threads of a daemon whose lifeline broke may take to be
 * past their last system call before the next daemon is started anyway
 * once it has wholly ended (SIGCHLD). */
#define DYING_WAIT_MS 1000
/* How long a stopped or drained daemon may take to end before SIGKILL. */
#define STOP_GRACE_MS 10000

/* The first daemon is ready (or is not): the parent of a daemonized holder
 * exits with that, saying why it failed. */
static void holder_notify_parent(struct holder *h, int rc, const char *why)
{
	if (h->notify_fd < 0)
		return;
	char line[256];
	int n = snprintf(line, sizeof(line), "%d %s", rc, why ? why : "");
	if (write(h->notify_fd, line, (size_t)n) < 0)
		log_warn("cannot tell the starting command the mount's state: %s", strerror(errno));
	close(h->notify_fd);
	h->notify_fd = -1;
}

/* Forks: the parent waits until the holder says whether the mount serves,
 * and exits with that; the child goes on as the holder, in a session of
 * its own, its standard streams on /dev/null. */
static int daemonize(struct holder *h)
{
	int p[2];

	if (pipe2(p, O_CLOEXEC) < 0)
		return -errno;
	pid_t pid = fork();
	if (pid < 0)
		return -errno;
	if (pid > 0) {
		char line[256] = "";
		close(p[1]);
		ssize_t n = read(p[0], line, sizeof(line) - 1);
		line[n > 0 ? n : 0] = '\0';
		int rc = n > 0 ? atoi(line) : -EIO;
		if (rc < 0) {
			const char *why = strchr(line, ' ');
			fprintf(stderr, "artfs: %s\n", why && why[1] ? why + 1 : "the daemon did not start");
		}
		_exit(rc < 0 ? 1 : 0);
	}
	close(p[0]);
	h->notify_fd = p[1];
	if (setsid() < 0 || chdir("/") < 0)
		return -errno;
	int null = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (null >= 0) {
		dup2(null, 0);
		dup2(null, 1);
		dup2(null, 2);
		close(null);
	}
	return 0;
}

static void on_ctl(struct holder *h, struct daemon *d)
{
	struct keeper_msg m;
	int rc = keeper_recv(d->ctl, &m, NULL, 0);

	if (rc == -ECONNRESET || rc == -EPROTO) { /* it is dying: SIGCHLD follows */
		close(d->ctl);
		d->ctl = -1;
		return;
	}
	if (rc < 0)
		return;
	if (m.type == KEEPER_READY && d == &h->cur) {
		d->ready = m.value == 0;
		holder_notify_parent(h, m.value, m.tag);
		if (m.value < 0 && h->restarts == 0 && h->upgrades == 0)
			h->failed = true; /* it exits next: the mount ends */
		if (m.value < 0)
			snprintf(d->why, sizeof(d->why), "%s", m.tag); /* said at its end */
		if (m.value < 0 && h->failed)
			log_err("holder: the daemon cannot serve: %s", m.tag);
		else if (m.value == 0)
			daemon_start_succeeded(h, d->pid);
		if (m.value == 0 && h->upgrade_deferred) {
			h->upgrade_deferred = false;
			upgrade_begin(h, "asked while the daemon started");
		}
	} else if (m.type == KEEPER_READY && d == &h->next) {
		if (m.value < 0) {
			snprintf(d->why, sizeof(d->why), "%s", m.tag);
			log_err("holder: upgrade failed, daemon %ld keeps serving: %s",
				(long)h->cur.pid, m.tag);
			upgrade_record(h, UPGRADE_FAILED, d->pid, "the new daemon %ld cannot serve: "
				       "%s; daemon %ld keeps serving", (long)d->pid, m.tag,
				       (long)h->cur.pid);
			daemon_stop(&h->next, SIGKILL);
			return;
		}
		d->ready = true;
		upgrade_drain(h);
	} else if (m.type == KEEPER_DRAINED && d == &h->cur && h->next.ready) {
		struct daemon old = h->cur;
		if (!upgrade_switch(h, false))
			return; /* the old one ends; a fresh one starts then */
		/* The old one ends by itself; its exit is reaped as a stranger's. */
		old.pid = 0;
		daemon_close(&old);
	} else if (m.type == KEEPER_UPGRADE) {
		upgrade_begin(h, "asked by the daemon");
	}
}

static void on_fds(struct holder *h, struct daemon *d)
{
	struct keeper_msg m;
	int fd;
	int rc = keeper_recv(d->fds, &m, &fd, 0);

	if (rc == -ECONNRESET || rc == -EPROTO) {
		close(d->fds);
		d->fds = -1;
		return;
	}
	if (rc == 0 && !keeper_store_serve(h->kept, d->fds, &m, fd) && fd >= 0)
		close(fd);
}

/* What a daemon that died may still have said (its READY). */
static void holder_read_last_words(struct holder *h, struct daemon *d)
{
	for (int i = 0; i < 16 && d->ctl >= 0; i++) {
		struct pollfd p = { .fd = d->ctl, .events = POLLIN };
		if (poll(&p, 1, 0) != 1)
			break;
		on_ctl(h, d);
	}
}

/* The serving daemon died (crashed): the next one is started. */
static bool on_crash(struct holder *h, pid_t pid, int status, const char *how)
{
	char why[KEEPER_TAG_MAX + PATH_MAX + 64];

	holder_read_last_words(h, &h->cur);
	bool was_ready = h->cur.ready;
	int64_t lived = holder_now_ns() - h->cur.started;
	if (!was_ready)
		daemon_why_not_served(h, &h->cur, how, why, sizeof(why));
	daemon_close(&h->cur);
	if (!was_ready && h->restarts == 0 && h->upgrades == 0) {
		log_err("holder: the daemon ended (%s) before it served: %s", how, why);
		holder_notify_parent(h, -EIO, "the daemon ended before it served (see the log)");
		h->failed = true;
		return false;
	}
	if (was_ready || WIFSIGNALED(status)) /* one that could not serve read nothing */
		poison_check(h, status);
	upgrade_check_death(h, pid, how);
	int delay = daemon_restart_delay(h, was_ready, lived);
	if (!was_ready)
		daemon_start_failed(h, pid, why);
	else
		log_err("holder: daemon %ld died (%s); starting the next%s", (long)pid, how,
			delay ? " after a pause (daemons die one after the other)" : "");
	return daemon_restart(h, delay, NULL);
}

/* A daemon ended: returns false when the holder is to end too. */
static bool on_daemon_end(struct holder *h, pid_t pid, int status)
{
	bool crashed = !WIFEXITED(status) || WEXITSTATUS(status) != 0;
	char how[64];

	if (WIFSIGNALED(status))
		snprintf(how, sizeof(how), "killed by signal %d", WTERMSIG(status));
	else
		snprintf(how, sizeof(how), "exit status %d", WEXITSTATUS(status));
	if (pid == h->next.pid) {
		upgrade_on_next_end(h, pid, how);
		return true;
	}
	if (pid != h->cur.pid)
		return true; /* an upgraded daemon's end */
	if (h->stopping || h->unmounted)
		return false;
	if (h->next.ready && !upgrade_next_has_ended(h)) { /* it died while it drained */
		log_err("holder: daemon %ld ended while it drained (%s)", (long)pid, how);
		daemon_close(&h->cur);
		if (upgrade_switch(h, true))
			return true;
		crashed = false; /* the new one ended too: as below */
	}
	if (h->drain_sent) {
		/* It drained for an upgrade whose daemon ended before it took
		 * over: not an unmount (unless the mount table says so). */
		mount_changed(h);
		if (h->unmounted)
			return false;
		char exe[32];
		snprintf(exe, sizeof(exe), "/proc/self/fd/%d", h->drain_exe_fd);
		log_warn("holder: daemon %ld ended (%s) after it drained for an upgrade that failed; "
			 "a fresh daemon takes over", (long)pid, how);
		daemon_close(&h->cur);
		h->drain_sent = false;
		bool ok = daemon_restart(h, 0, h->drain_exe_fd >= 0 ? exe : NULL);
		upgrade_drain_exe_close(h);
		return ok;
	}
	if (!crashed) {
		log_info("holder: daemon %ld ended: the file system was unmounted", (long)pid);
		daemon_close(&h->cur);
		return false;
	}
	return on_crash(h, pid, status, how);
}

/* Returns false when the holder is to end. */
static bool on_signal(struct holder *h)
{
	struct signalfd_siginfo si;

	if (read(h->sig_fd, &si, sizeof(si)) != sizeof(si))
		return true;
	switch (si.ssi_signo) {
	case SIGCHLD:
		for (;;) {
			int status;
			pid_t pid = waitpid(-1, &status, WNOHANG);
			if (pid <= 0)
				return true;
			if (!on_daemon_end(h, pid, status))
				return false;
		}
	case SIGHUP:
		upgrade_begin(h, "SIGHUP");
		return true;
	default: /* SIGTERM, SIGINT */
		log_info("holder: signal %u: stopping", si.ssi_signo);
		h->stopping = true;
		daemon_stop(&h->cur, SIGTERM);
		daemon_stop(&h->next, SIGKILL);
		return false;
	}
}

/* What a dying daemon sent and the holder has not read yet (descriptors
 * to keep): nothing more comes, its threads are past their system calls. */
static void drain_links(struct holder *h, struct daemon *d)
{
	for (int i = 0; i < 4096 && d->fds >= 0; i++) {
		struct pollfd p = { .fd = d->fds, .events = POLLIN };
		if (poll(&p, 1, 0) != 1)
			break;
		on_fds(h, d);
	}
}

/* The serving daemon's lifeline hung up: it dies, or ends. Once every
 * thread of it is past its last system call the next one starts, without
 * waiting for the kernel to release the dead one's memory and files
 * (SIGCHLD: on a GPU node, the driver's teardown). Its SIGCHLD comes
 * later, as a stranger's. Returns false when the holder is to end. */
static bool on_lifeline(struct holder *h)
{
	struct daemon *d = &h->cur;
	char living[512];
	int code = 0;

	close(d->life);
	d->life = -1;
	mount_changed(h); /* an unmount ends a daemon; it does not kill it */
	if (!d->ready || h->stopping || h->unmounted || h->next.pid > 0)
		return true; /* SIGCHLD decides, as before lifelines */
	int64_t broke = holder_now_ns();
	enum lifeline_state s = lifeline_wait_dying(d->pid, DYING_WAIT_MS, &code);
	if (s == LIFELINE_LIVES) {
		lifeline_describe_living(d->pid, living, sizeof(living));
		log_warn("holder: daemon %ld dies, but threads of it are still in the kernel %d ms "
			 "later (%s); the next starts once it has ended", (long)d->pid, DYING_WAIT_MS,
			 living[0] ? living : "none readable");
		return true;
	}
	if (s == LIFELINE_ENDS)
		return true; /* an end of its own (exit status 0): SIGCHLD says why */
	log_info("holder: daemon %ld dies: each of its threads is past its last system call "
		 "%.2f ms after its lifeline broke", (long)d->pid,
		 (double)(holder_now_ns() - broke) / 1e6);
	drain_links(h, d);
	return on_daemon_end(h, d->pid, code);
}

/* What poll waits for at most: an upgrade's daemon to be ready, or the
 * daemon of an unmounted mount to end; -1: nothing. */
static int serve_timeout(const struct holder *h)
{
	if (h->unmounted && h->end_by && h->cur.pid > 0) {
		int64_t left = (h->end_by - holder_now_ns()) / 1000000;
		return left > 0 ? (int)left : 0;
	}
	return h->next.pid > 0 && !h->next.ready ? UPGRADE_READY_MS : -1;
}

static void serve(struct holder *h)
{
	for (;;) {
		struct pollfd p[7] = {
			{ .fd = h->sig_fd, .events = POLLIN },
			{ .fd = h->cur.ctl, .events = POLLIN }, { .fd = h->cur.fds, .events = POLLIN },
			{ .fd = h->next.ctl, .events = POLLIN }, { .fd = h->next.fds, .events = POLLIN },
			{ .fd = h->mnt_id ? h->mountinfo_fd : -1, .events = POLLPRI },
			{ .fd = h->cur.life, .events = POLLIN },
		};
		pid_t life_of = h->cur.pid; /* the events of p[6] are this daemon's */
		int n = poll(p, 7, serve_timeout(h));
		if (n < 0 && errno != EINTR)
			return;
		if (n == 0 && h->unmounted && h->end_by) {
			h->end_by = 0; /* once */
			mount_abort_connection(h);
			continue;
		}
		if (n == 0) {
			log_err("holder: the upgrade's daemon %ld was not ready within %d s; stopped",
				(long)h->next.pid, UPGRADE_READY_MS / 1000);
			upgrade_record(h, UPGRADE_FAILED, h->next.pid, "the new daemon %ld was not "
				       "ready within %d s; daemon %ld keeps serving", (long)h->next.pid,
				       UPGRADE_READY_MS / 1000, (long)h->cur.pid);
			daemon_stop(&h->next, SIGKILL);
			continue;
		}
		if ((p[0].revents & POLLIN) && !on_signal(h))
			return;
		if (p[1].revents & (POLLIN | POLLHUP | POLLERR))
			on_ctl(h, &h->cur);
		if (h->cur.fds >= 0 && (p[2].revents & (POLLIN | POLLHUP | POLLERR)))
			on_fds(h, &h->cur);
		if (h->next.ctl >= 0 && (p[3].revents & (POLLIN | POLLHUP | POLLERR)))
			on_ctl(h, &h->next);
		if (h->next.fds >= 0 && (p[4].revents & (POLLIN | POLLHUP | POLLERR)))
			on_fds(h, &h->next);
		if (p[5].revents & (POLLPRI | POLLERR))
			mount_changed(h);
		if (p[6].fd >= 0 && h->cur.pid == life_of && p[6].fd == h->cur.life &&
		    (p[6].revents & (POLLIN | POLLHUP | POLLERR)) && !on_lifeline(h))
			return;
	}
}

/* Waits (bounded) for every daemon to end: one that has not ended
 * UNMOUNTED_END_MS after it was told to stop has the FUSE connection
 * aborted under it (a thread of its own may wait for an answer from its
 * own mount that no daemon gives: the attach socket's bind); SIGKILL after
 * the grace. */
static void reap_all(struct holder *h)
{
	int64_t now = holder_now_ns(), until = now + (int64_t)STOP_GRACE_MS * 1000000;
	int64_t abort_at = now + (int64_t)UNMOUNTED_END_MS * 1000000;

	while (h->cur.pid > 0 || h->next.pid > 0) {
		if (abort_at && holder_now_ns() > abort_at && h->cur.pid > 0) {
			abort_at = 0; /* once */
			mount_abort_connection(h);
		}
		int status;
		pid_t pid = waitpid(-1, &status, WNOHANG);
		if (pid == h->cur.pid)
			daemon_close(&h->cur);
		else if (pid == h->next.pid)
			daemon_close(&h->next);
		else if (pid < 0 && errno == ECHILD)
			break;
		if (pid <= 0) {
			if (holder_now_ns() > until) {
				daemon_stop(&h->cur, SIGKILL);
				daemon_stop(&h->next, SIGKILL);
			}
			usleep(10000);
		}
	}
}

static const struct fuse_lowlevel_ops no_ops;

static int signals_open(void)
{
	sigset_t set;

	sigemptyset(&set);
	sigaddset(&set, SIGCHLD);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGHUP);
	sigprocmask(SIG_BLOCK, &set, NULL);
	signal(SIGPIPE, SIG_IGN);
	return signalfd(-1, &set, SFD_CLOEXEC);
}

bool holder_started_us(void)
{
	return getenv(TAKEOVER_ENV) != NULL;
}

int holder_run(struct fuse_args *args, const struct holder_options *o)
{
	struct holder h = { .o = o, .fuse_fd = -1, .held_fd = -1, .lock_fd = -1, .notify_fd = -1,
			    .mountinfo_fd = -1 };
	char err[512];
	int rc = 1;

	h.cur.ctl = h.cur.fds = h.cur.life = h.cur.exec_err = -1;
	h.next.ctl = h.next.fds = h.next.life = h.next.exec_err = -1;
	ssize_t n = readlink("/proc/self/exe", h.exe, sizeof(h.exe) - 1);
	if (n <= 0) {
		fprintf(stderr, "artfs: cannot find its own binary: %s\n", strerror(errno));
		return 1;
	}
	h.exe[n] = '\0';
	h.lock_fd = store_lock(o->store, err, sizeof(err));
	if (h.lock_fd < 0) {
		fprintf(stderr, "artfs: %s\n", err);
		return 1;
	}
	struct fuse_session *se = fuse_session_new(args, &no_ops, sizeof(no_ops), NULL);
	h.kept = keeper_store_new();
	if (!se || !h.kept)
		goto out;
	if (!o->foreground && daemonize(&h) < 0)
		goto out;
	log_init(!o->foreground, o->debug);
	store_lock_note_pid(h.lock_fd);
	h.sig_fd = signals_open();
	if (h.sig_fd < 0 || mount_and_record(&h, se) < 0) {
		holder_notify_parent(&h, -EIO, "cannot mount (see the log)");
		goto out_unmount;
	}
	if (daemon_start(&h, &h.cur, TAKEOVER_FIRST, NULL) < 0) {
		holder_notify_parent(&h, -EIO, "cannot start the daemon");
		goto out_unmount;
	}
	serve(&h);
	rc = h.failed ? 1 : 0;
	if (h.stopping || h.cur.pid > 0 || h.next.pid > 0)
		reap_all(&h);
	log_info("holder: unmounting %s (%llu restarts, %llu upgrades)", o->mountpoint,
		 (unsigned long long)h.restarts, (unsigned long long)h.upgrades);
out_unmount:
	holder_notify_parent(&h, -EIO, "the mount ended before it served");
	if (se)
		fuse_session_unmount(se);
	mount_detach_if_left(&h);
out:
	if (se)
		fuse_session_destroy(se);
	keeper_store_free(h.kept);
	if (h.fuse_fd >= 0)
		close(h.fuse_fd);
	if (h.held_fd >= 0)
		close(h.held_fd);
	if (h.lock_fd >= 0)
		close(h.lock_fd);
	if (h.mountinfo_fd >= 0)
		close(h.mountinfo_fd);
	return rc;
}
