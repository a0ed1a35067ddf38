/* The holder's life: make the mount, record INIT, start the first daemon,
 * then wait for what comes: a daemon that dies is replaced (and told it
 * takes over from a crash), SIGHUP or a daemon's UPGRADE starts the binary
 * on disk beside the serving one and switches over once that one drained,
 * SIGTERM/SIGINT stop the daemon and unmount, a daemon that ends cleanly
 * (the file system was unmounted) ends the holder. Descriptors the daemons
 * give it are kept across them (src/keeper.h). */
#include "autoconf.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/fuse.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fs/holder/holder.h"
#include "fs/holder/lifeline.h"
#include "fs/holder/takeover.h"
#include "lib/log.h"
#include "restart/held.h"
#include "restart/keeper.h"
#include "store/store.h"

/* A daemon that dies within this long of its start, before it served,
 * counts as a fast failure: the next one waits a little longer (up to
 * RESTART_DELAY_MAX). */
#define FAST_FAILURE_NS 1000000000LL
#define RESTART_DELAY_MAX_MS 2000
/* How long a stopped or drained daemon may take to end before SIGKILL. */
#define STOP_GRACE_MS 10000
/* A read of /dev/fuse takes a buffer of 8 KiB at least; INIT is small. */
#define INIT_BUF (64u << 10)
/* How long a daemon started for an upgrade may take to be ready. */
#define UPGRADE_READY_MS 60000
/* How long the daemon of a mount that was unmounted may take to end before
 * the holder aborts the FUSE connection under it (a thread of its own may
 * wait in the kernel for an answer no daemon will give). */
#define UNMOUNTED_END_MS 2000
/* How long the threads of a daemon whose lifeline broke may take to be
 * past their last system call before the next daemon is started anyway
 * once it has wholly ended (SIGCHLD). */
#define DYING_WAIT_MS 1000
/* Daemons that had served and die again and again, each within this long
 * of its start: from the CRASH_LOOP_FREE-th on the next one waits, as
 * after fast failures (a kill now and then is replaced at once). */
#define CRASH_LOOP_NS 250000000LL
#define CRASH_LOOP_FREE 3
/* A request in flight at this many deaths in a row, each by a fault of the
 * daemon (not a SIGKILL, SIGTERM or SIGINT from outside), is answered EIO
 * instead of being sent to the next daemon: it is what kills them. */
#define POISON_DEATHS 3
#define POISON_TRACK 64
/* A daemon started for an upgrade that dies this soon after it took over
 * makes the upgrade a failure after all. */
#define UPGRADE_SETTLE_NS 1000000000LL
/* The holder's record of its last upgrade, in the store's directory (which
 * `artfsctl upgrade` finds in .artfs/config): "<seq> <state> <pid> <why>". */
#define UPGRADE_OUTCOME "upgrade-outcome"

struct daemon {
	pid_t pid;
	int ctl, fds;              /* the holder's ends of the links */
	int life;                  /* of its lifeline (fs/lifeline.h): hangs up as it dies */
	int exec_err;              /* its exec's failure (an errno) arrives here */
	int64_t started;           /* CLOCK_MONOTONIC ns */
	bool ready;
	char why[KEEPER_TAG_MAX];  /* why it cannot serve, as its READY said */
};

/* A request (unique, bit 63 cleared) in flight at deaths in a row. */
struct strike {
	uint64_t unique;
	unsigned deaths;
};

enum upgrade_state { UPGRADE_NONE, UPGRADE_STARTED, UPGRADE_SERVED, UPGRADE_FAILED };

struct holder {
	const struct holder_options *o;
	int mountinfo_fd;          /* /proc/self/mountinfo: POLLPRI when mounts change */
	uint64_t mnt_id;           /* the mount's id there */
	unsigned conn;             /* its FUSE connection (the device's minor) */
	bool unmounted;            /* it is gone from the mount table */
	int64_t end_by;            /* unmounted: when its daemon must have ended */
	char exe[PATH_MAX];        /* the binary on disk, for every daemon */
	int fuse_fd;               /* /dev/fuse, without close-on-exec */
	int held_fd;
	int lock_fd;
	int sig_fd;
	struct keeper_store *kept;
	struct daemon cur, next;   /* the serving daemon; one started for an upgrade */
	unsigned fast_failures;
	unsigned crash_loop;       /* deaths in a row of daemons that served, each soon after its start */
	struct held_inflight *inflight; /* the daemons' notes of their requests (mapped at need) */
	struct strike strikes[POISON_TRACK];
	unsigned nstrikes;
	char start_failure[256];   /* why daemons cannot serve, as logged last ("": they can) */
	unsigned start_failures;
	bool drain_sent;           /* the serving daemon was told to drain for an upgrade */
	enum upgrade_state upgrade_state;
	uint64_t upgrade_seq;
	pid_t upgraded_pid;        /* the upgrade's daemon, once it took over */
	int64_t upgraded_at;
	bool stopping;
	bool failed;               /* the first daemon did not serve, or the mount failed */
	int notify_fd;             /* the waiting parent of a daemonized holder, or -1 */
	uint64_t upgrades, restarts;
	int drain_exe_fd;          /* the binary of a daemon told to drain, or -1 */
};

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The first daemon is ready (or is not): the parent of a daemonized holder
 * exits with that, saying why it failed. */
static void notify_parent(struct holder *h, int rc, const char *why)
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

/* ---- daemons ------------------------------------------------------------------- */

static void daemon_close(struct daemon *d)
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
static int daemon_start(struct holder *h, struct daemon *d, enum takeover_start start,
			const char *exe)
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
	d->started = now_ns();
	d->ready = false;
	d->why[0] = '\0';
	/* While daemons cannot serve, each attempt is not worth a line. */
	log_msg(h->start_failure[0] ? LOG_DEBUG : LOG_INFO, "holder: daemon %ld started (%s)",
		(long)pid, start == TAKEOVER_FIRST ? "first" : start == TAKEOVER_CRASH
		? "after a crash" : "upgrade");
	return 0;
}

/* ---- what happens ------------------------------------------------------------------ */

static void stop_daemon(struct daemon *d, int sig)
{
	if (d->pid > 0)
		kill(d->pid, sig);
}

static void abort_connection(struct holder *h);
static void on_mounts_changed(struct holder *h);

/* Waits (bounded) for every daemon to end: one that has not ended
 * UNMOUNTED_END_MS after it was told to stop has the FUSE connection
 * aborted under it (a thread of its own may wait for an answer from its
 * own mount that no daemon gives: the attach socket's bind); SIGKILL after
 * the grace. */
static void reap_all(struct holder *h)
{
	int64_t now = now_ns(), until = now + (int64_t)STOP_GRACE_MS * 1000000;
	int64_t abort_at = now + (int64_t)UNMOUNTED_END_MS * 1000000;

	while (h->cur.pid > 0 || h->next.pid > 0) {
		if (abort_at && now_ns() > abort_at && h->cur.pid > 0) {
			abort_at = 0; /* once */
			abort_connection(h);
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
			if (now_ns() > until) {
				stop_daemon(&h->cur, SIGKILL);
				stop_daemon(&h->next, SIGKILL);
			}
			usleep(10000);
		}
	}
}

/* ---- what `artfsctl upgrade` learns ------------------------------------------------ */

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
static void upgrade_record(struct holder *h, enum upgrade_state state, pid_t pid,
			   const char *fmt, ...)
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

/* ---- daemons that cannot serve --------------------------------------------------- */

/* Why daemon d ended before it served, in words (how: its exit). */
static void why_not_served(const struct holder *h, struct daemon *d, const char *how, char *why,
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
static void start_failed(struct holder *h, pid_t pid, const char *why)
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

static void start_succeeded(struct holder *h, pid_t pid)
{
	if (h->start_failure[0])
		log_info("holder: daemon %ld serves, after %u daemons that could not", (long)pid,
			 h->start_failures);
	h->start_failure[0] = '\0';
	h->start_failures = 0;
}

/* ---- requests that kill daemon after daemon ------------------------------------- */

/* The daemons' notes of the requests they serve (src/held.h), mapped the
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
static void poison_check(struct holder *h, int status)
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

/* How long to wait before the next daemon (ms): daemons that die before
 * they serve wait longer each time; so do daemons that served and die
 * again and again soon after their start (a request that kills them, until
 * it is answered EIO), past the first few. */
static int restart_delay(struct holder *h, bool was_ready, int64_t lived)
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

/* ---- upgrades ----------------------------------------------------------------------- */

/* Why an upgrade cannot begin now, or NULL. */
static const char *upgrade_refusal(const struct holder *h)
{
	return h->next.pid > 0 ? "one is under way"
	     : h->drain_sent ? "the daemon drains for the last one"
	     : !h->cur.ready ? "the daemon is starting"
	     : h->stopping ? "stopping" : NULL;
}

static void upgrade_begin(struct holder *h, const char *why)
{
	const char *refused = upgrade_refusal(h);

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
static bool next_ended(const struct holder *h)
{
	siginfo_t si;

	memset(&si, 0, sizeof(si));
	return waitid(P_PID, (id_t)h->next.pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 &&
	       si.si_pid == h->next.pid;
}

static void drain_exe_close(struct holder *h)
{
	if (h->drain_exe_fd >= 0)
		close(h->drain_exe_fd);
	h->drain_exe_fd = -1;
}

/* The upgrade's daemon takes over: GO, with whether the one before died.
 * false when it has ended itself (it cannot). */
static bool upgrade_switch(struct holder *h, bool crashed)
{
	struct keeper_msg go = keeper_msg_make(KEEPER_GO, NULL, crashed ? 1 : 0);

	if (next_ended(h) || keeper_send(h->next.ctl, &go, -1) < 0)
		return false;
	log_info("holder: daemon %ld serves (upgrade, the one before %s)", (long)h->next.pid,
		 crashed ? "died while it drained" : "drained");
	upgrade_record(h, UPGRADE_SERVED, h->next.pid, "daemon %ld serves, after daemon %ld",
		       (long)h->next.pid, (long)h->cur.pid);
	h->upgrades++;
	h->upgraded_pid = h->next.pid;
	h->upgraded_at = now_ns();
	h->drain_sent = false;
	drain_exe_close(h);
	h->cur = h->next;
	h->cur.ready = true;
	memset(&h->next, 0, sizeof(h->next));
	h->next.ctl = h->next.fds = h->next.life = h->next.exec_err = -1;
	return true;
}

/* The upgrade's daemon is ready: the serving one drains. Its binary is
 * kept open: should the new one die before it takes over, a fresh daemon
 * of the binary that served starts once the old one has drained. */
static void drain_for_upgrade(struct holder *h)
{
	char path[64];
	struct keeper_msg drain = keeper_msg_make(KEEPER_DRAIN, NULL, 0);

	drain_exe_close(h);
	snprintf(path, sizeof(path), "/proc/%ld/exe", (long)h->cur.pid);
	h->drain_exe_fd = open(path, O_RDONLY | O_CLOEXEC);
	h->drain_sent = true;
	keeper_send(h->cur.ctl, &drain, -1);
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
		notify_parent(h, m.value, m.tag);
		if (m.value < 0 && h->restarts == 0 && h->upgrades == 0)
			h->failed = true; /* it exits next: the mount ends */
		if (m.value < 0)
			snprintf(d->why, sizeof(d->why), "%s", m.tag); /* said at its end */
		if (m.value < 0 && h->failed)
			log_err("holder: the daemon cannot serve: %s", m.tag);
		else if (m.value == 0)
			start_succeeded(h, d->pid);
	} else if (m.type == KEEPER_READY && d == &h->next) {
		if (m.value < 0) {
			snprintf(d->why, sizeof(d->why), "%s", m.tag);
			log_err("holder: upgrade failed, daemon %ld keeps serving: %s",
				(long)h->cur.pid, m.tag);
			upgrade_record(h, UPGRADE_FAILED, d->pid, "the new daemon %ld cannot serve: "
				       "%s; daemon %ld keeps serving", (long)d->pid, m.tag,
				       (long)h->cur.pid);
			stop_daemon(&h->next, SIGKILL);
			return;
		}
		d->ready = true;
		drain_for_upgrade(h);
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

/* The upgrade's daemon ended before it took over. */
static void next_ended_before_serving(struct holder *h, pid_t pid, const char *how)
{
	char why[KEEPER_TAG_MAX + PATH_MAX + 64];

	why_not_served(h, &h->next, how, why, sizeof(why));
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

/* What a daemon that died may still have said (its READY). */
static void read_last_words(struct holder *h, struct daemon *d)
{
	for (int i = 0; i < 16 && d->ctl >= 0; i++) {
		struct pollfd p = { .fd = d->ctl, .events = POLLIN };
		if (poll(&p, 1, 0) != 1)
			break;
		on_ctl(h, d);
	}
}

/* The next daemon takes over from the one that ended: returns false when
 * none can be started (the holder ends). exe: the binary, NULL for the
 * one on disk. */
static bool restart(struct holder *h, int delay_ms, const char *exe)
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

/* The serving daemon died (crashed): the next one is started. */
static bool on_crash(struct holder *h, pid_t pid, int status, const char *how)
{
	char why[KEEPER_TAG_MAX + PATH_MAX + 64];

	read_last_words(h, &h->cur);
	bool was_ready = h->cur.ready;
	int64_t lived = now_ns() - h->cur.started;
	if (!was_ready)
		why_not_served(h, &h->cur, how, why, sizeof(why));
	daemon_close(&h->cur);
	if (!was_ready && h->restarts == 0 && h->upgrades == 0) {
		log_err("holder: the daemon ended (%s) before it served: %s", how, why);
		notify_parent(h, -EIO, "the daemon ended before it served (see the log)");
		h->failed = true;
		return false;
	}
	if (was_ready || WIFSIGNALED(status)) /* one that could not serve read nothing */
		poison_check(h, status);
	if (pid == h->upgraded_pid && now_ns() - h->upgraded_at < UPGRADE_SETTLE_NS)
		upgrade_record(h, UPGRADE_FAILED, pid, "the new daemon %ld died (%s) right after "
			       "it took over; the next daemon is started", (long)pid, how);
	int delay = restart_delay(h, was_ready, lived);
	if (!was_ready)
		start_failed(h, pid, why);
	else
		log_err("holder: daemon %ld died (%s); starting the next%s", (long)pid, how,
			delay ? " after a pause (daemons die one after the other)" : "");
	return restart(h, delay, NULL);
}

/* A daemon ended: returns false when the holder is to end too. */
static bool on_exit_of(struct holder *h, pid_t pid, int status)
{
	bool crashed = !WIFEXITED(status) || WEXITSTATUS(status) != 0;
	char how[64];

	if (WIFSIGNALED(status))
		snprintf(how, sizeof(how), "killed by signal %d", WTERMSIG(status));
	else
		snprintf(how, sizeof(how), "exit status %d", WEXITSTATUS(status));
	if (pid == h->next.pid) {
		next_ended_before_serving(h, pid, how);
		return true;
	}
	if (pid != h->cur.pid)
		return true; /* an upgraded daemon's end */
	if (h->stopping || h->unmounted)
		return false;
	if (h->next.ready && !next_ended(h)) { /* it died while it drained */
		log_err("holder: daemon %ld ended while it drained (%s)", (long)pid, how);
		daemon_close(&h->cur);
		if (upgrade_switch(h, true))
			return true;
		crashed = false; /* the new one ended too: as below */
	}
	if (h->drain_sent) {
		/* It drained for an upgrade whose daemon ended before it took
		 * over: not an unmount (unless the mount table says so). */
		on_mounts_changed(h);
		if (h->unmounted)
			return false;
		char exe[32];
		snprintf(exe, sizeof(exe), "/proc/self/fd/%d", h->drain_exe_fd);
		log_warn("holder: daemon %ld ended (%s) after it drained for an upgrade that failed; "
			 "a fresh daemon takes over", (long)pid, how);
		daemon_close(&h->cur);
		h->drain_sent = false;
		bool ok = restart(h, 0, h->drain_exe_fd >= 0 ? exe : NULL);
		drain_exe_close(h);
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
			if (!on_exit_of(h, pid, status))
				return false;
		}
	case SIGHUP:
		upgrade_begin(h, "SIGHUP");
		return true;
	default: /* SIGTERM, SIGINT */
		log_info("holder: signal %u: stopping", si.ssi_signo);
		h->stopping = true;
		stop_daemon(&h->cur, SIGTERM);
		stop_daemon(&h->next, SIGKILL);
		return false;
	}
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
static void on_mounts_changed(struct holder *h)
{
	if (h->unmounted || !h->mnt_id ||
	    mount_id_at(h->mountinfo_fd, h->o->mountpoint, NULL) == h->mnt_id)
		return;
	h->unmounted = true;
	h->end_by = now_ns() + (int64_t)UNMOUNTED_END_MS * 1000000;
	log_info("holder: %s was unmounted; stopping", h->o->mountpoint);
	keeper_store_drop(h->kept, "", true); /* the attach socket, kept slabs: the mount is over */
	stop_daemon(&h->cur, SIGTERM);
	stop_daemon(&h->next, SIGKILL);
}

/* The daemon of an unmounted mount did not end: the FUSE connection is
 * aborted (fusectl, mounted if it is not), so that every request waiting
 * for an answer fails, and the daemon is killed. */
static void abort_connection(struct holder *h)
{
	char path[96];
	int fd = -1;

	snprintf(path, sizeof(path), "/sys/fs/fuse/connections/%u/abort", h->conn);
	for (int attempt = 0; attempt < 2 && fd < 0; attempt++) {
		fd = open(path, O_WRONLY | O_CLOEXEC);
		if (fd < 0 && attempt == 0 && errno == ENOENT)
			mount("fusectl", "/sys/fs/fuse/connections", "fusectl", 0, NULL);
	}
	bool done = fd >= 0 && write(fd, "1", 1) == 1;
	log_warn("holder: daemon %ld did not end within %d s of the unmount or the stop; %s; "
		 "killing it",
		 (long)h->cur.pid, UNMOUNTED_END_MS / 1000,
		 done ? "aborted its FUSE connection" : "cannot abort its FUSE connection");
	if (fd >= 0)
		close(fd);
	stop_daemon(&h->cur, SIGKILL);
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
	on_mounts_changed(h); /* an unmount ends a daemon; it does not kill it */
	if (!d->ready || h->stopping || h->unmounted || h->next.pid > 0)
		return true; /* SIGCHLD decides, as before lifelines */
	int64_t broke = now_ns();
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
		 "%.2f ms after its lifeline broke", (long)d->pid, (double)(now_ns() - broke) / 1e6);
	drain_links(h, d);
	return on_exit_of(h, d->pid, code);
}

/* What poll waits for at most: an upgrade's daemon to be ready, or the
 * daemon of an unmounted mount to end; -1: nothing. */
static int serve_timeout(const struct holder *h)
{
	if (h->unmounted && h->end_by && h->cur.pid > 0) {
		int64_t left = (h->end_by - now_ns()) / 1000000;
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
			abort_connection(h);
			continue;
		}
		if (n == 0) {
			log_err("holder: the upgrade's daemon %ld was not ready within %d s; stopped",
				(long)h->next.pid, UPGRADE_READY_MS / 1000);
			upgrade_record(h, UPGRADE_FAILED, h->next.pid, "the new daemon %ld was not "
				       "ready within %d s; daemon %ld keeps serving", (long)h->next.pid,
				       UPGRADE_READY_MS / 1000, (long)h->cur.pid);
			stop_daemon(&h->next, SIGKILL);
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
			on_mounts_changed(h);
		if (p[6].fd >= 0 && h->cur.pid == life_of && p[6].fd == h->cur.life &&
		    (p[6].revents & (POLLIN | POLLHUP | POLLERR)) && !on_lifeline(h))
			return;
	}
}

/* ---- the mount ---------------------------------------------------------------------- */

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

/* Makes the mount, records INIT and the memory the daemons share. */
static int mount_and_record(struct holder *h, struct fuse_session *se)
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
		notify_parent(&h, -EIO, "cannot mount (see the log)");
		goto out_unmount;
	}
	if (daemon_start(&h, &h.cur, TAKEOVER_FIRST, NULL) < 0) {
		notify_parent(&h, -EIO, "cannot start the daemon");
		goto out_unmount;
	}
	serve(&h);
	rc = h.failed ? 1 : 0;
	if (h.stopping || h.cur.pid > 0 || h.next.pid > 0)
		reap_all(&h);
	log_info("holder: unmounting %s (%llu restarts, %llu upgrades)", o->mountpoint,
		 (unsigned long long)h.restarts, (unsigned long long)h.upgrades);
out_unmount:
	notify_parent(&h, -EIO, "the mount ended before it served");
	if (se)
		fuse_session_unmount(se);
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
