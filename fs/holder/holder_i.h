/* SPDX-License-Identifier: Apache-2.0 */
/* What the files of fs/holder/ share (other folders see only
 * fs/holder/holder.h): the holder's state, its daemons, and the functions
 * one file of the folder gives the others. holder.c runs the loop that
 * waits for what happens and decides what a daemon's end leads to;
 * upgrade.c replaces the serving daemon and records how that went;
 * poison.c answers EIO the request that kills daemon after daemon; mount.c
 * makes the mount and sees it go; daemons.c starts, stops and describes
 * daemons. Calls go one way: holder.c -> upgrade.c, poison.c, mount.c ->
 * daemons.c, which calls none of the others. */
#ifndef ARTFS_FS_HOLDER_I_H
#define ARTFS_FS_HOLDER_I_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "fs/holder/holder.h"
#include "fs/holder/takeover.h"
#include "restart/held.h"
#include "restart/keeper.h"

/* How long the daemon of a mount that was unmounted may take to end before
 * the holder aborts the FUSE connection under it (a thread of its own may
 * wait in the kernel for an answer no daemon will give). */
#define UNMOUNTED_END_MS 2000
/* Requests in flight the holder tracks across deaths (poison.c). */
#define POISON_TRACK 64

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
	bool upgrade_deferred;     /* asked while the daemon started: begins once it serves */
	pid_t upgraded_pid;        /* the upgrade's daemon, once it took over */
	int64_t upgraded_at;
	bool stopping;
	bool failed;               /* the first daemon did not serve, or the mount failed */
	int notify_fd;             /* the waiting parent of a daemonized holder, or -1 */
	uint64_t upgrades, restarts;
	int drain_exe_fd;          /* the binary of a daemon told to drain, or -1 */
};

static inline int64_t holder_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* daemons.c: starting and ending daemons */
void daemon_close(struct daemon *d);
int daemon_start(struct holder *h, struct daemon *d, enum takeover_start start, const char *exe);
void daemon_stop(struct daemon *d, int sig);
void daemon_why_not_served(const struct holder *h, struct daemon *d, const char *how, char *why,
			   size_t len);
void daemon_start_failed(struct holder *h, pid_t pid, const char *why);
void daemon_start_succeeded(struct holder *h, pid_t pid);
int daemon_restart_delay(struct holder *h, bool was_ready, int64_t lived);
bool daemon_restart(struct holder *h, int delay_ms, const char *exe);

/* upgrade.c: upgrades and their outcome */
__attribute__((format(printf, 4, 5)))
void upgrade_record(struct holder *h, enum upgrade_state state, pid_t pid, const char *fmt, ...);
void upgrade_begin(struct holder *h, const char *why);
bool upgrade_next_has_ended(const struct holder *h);
void upgrade_drain_exe_close(struct holder *h);
bool upgrade_switch(struct holder *h, bool crashed);
void upgrade_drain(struct holder *h);
void upgrade_on_next_end(struct holder *h, pid_t pid, const char *how);
void upgrade_check_death(struct holder *h, pid_t pid, const char *how);

/* poison.c: the requests that kill daemon after daemon */
void poison_check(struct holder *h, int status);

/* mount.c: the mount */
int mount_and_record(struct holder *h, struct fuse_session *se);
void mount_changed(struct holder *h);
void mount_abort_connection(struct holder *h);
void mount_detach_if_left(struct holder *h);

#endif
