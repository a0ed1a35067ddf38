/* SPDX-License-Identifier: Apache-2.0 */
/* A daemon's lifeline (DESIGN.md §8): how the holder learns that its
 * daemon is dying at the start of its death, not at its end.
 *
 * The holder sees a daemon's end (SIGCHLD) only once every thread of it
 * has ended, and the last one out releases the whole process: on a GPU
 * node that is the NVIDIA driver's teardown of its files, mappings and
 * context, 50-270 ms during which no daemon serves. So each daemon keeps
 * one end of a socket pair in a thread of its own that has its own
 * descriptor table (unshare(CLONE_FILES)) holding nothing else: when the
 * daemon is killed that thread ends among the first and its table, and so
 * the socket, goes with it; the holder's end reports a hang-up.
 *
 * A hang-up says only that the daemon is dying. Before another one takes
 * over, every thread of the dying one must be past its last system call
 * (a publish's link() that is under way finishes, a reply being written
 * is written): the holder asks /proc until each thread is exiting
 * (lifeline_dying). */
#ifndef ARTFS_FS_LIFELINE_H
#define ARTFS_FS_LIFELINE_H

#include <sys/types.h>

/* Daemon: keeps fd (the daemon's end, taken: closed in this process's
 * descriptor table) in a thread with a table of its own. 0 or -errno
 * (then fd stays open in the process's table: it breaks once the whole
 * daemon has ended, as SIGCHLD tells, never while it serves). */
int lifeline_keep(int fd);

enum lifeline_state {
	LIFELINE_LIVES,    /* a thread of it is not exiting (yet) */
	LIFELINE_ENDS,     /* every thread exits, by exit status 0: an end, not a death */
	LIFELINE_DIES,     /* every thread exits, killed by a signal or a failure status */
};

/* Holder: how the threads of its child pid stand (from /proc/<pid>/task);
 * when none lives, *code is the status its end reports (as in waitpid). A
 * child that is already a zombie reads as exiting. pid must not have been
 * reaped. */
enum lifeline_state lifeline_dying(pid_t pid, int *code);

/* Holder: waits up to wait_ms for lifeline_dying(pid) to be other than
 * LIFELINE_LIVES, asking every 200 us; LIFELINE_LIVES when it still is. */
enum lifeline_state lifeline_wait_dying(pid_t pid, int wait_ms, int *code);

/* Holder: the threads of pid that are not exiting, as "tid:wchan ..." in
 * buf (len bytes), for a log line. */
void lifeline_describe_living(pid_t pid, char *buf, size_t len);

#endif
