/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fs/holder/lifeline.h"
#include "lib/log.h"

/* include/linux/sched.h: the task is in do_exit() (past its last system call). */
#define PF_EXITING 0x00000004u

/* ---- the daemon's side ------------------------------------------------------------- */

struct keeping {
	int fd;
	int rc;
	sem_t done;
};

static void *keep_main(void *arg)
{
	struct keeping *k = arg;
	int fd = k->fd;
	sigset_t all;

	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL); /* signals are the other threads' */
	if (unshare(CLONE_FILES) < 0) {
		k->rc = -errno;
		sem_post(&k->done);
		return NULL;
	}
	/* This table is a copy of the process's: all of it but the lifeline
	 * goes, so that this thread holds nothing else open. */
	if (fd > 0)
		close_range(0, (unsigned)fd - 1, 0);
	close_range((unsigned)fd + 1, ~0u, 0);
	k->rc = 0;
	sem_post(&k->done); /* k is the caller's: not touched after this */
	for (;;)
		pause(); /* every signal blocked: until the process ends */
	return NULL;
}

int lifeline_keep(int fd)
{
	struct keeping k = { .fd = fd, .rc = -EINVAL };
	pthread_attr_t attr;
	pthread_t th;

	if (fd < 0)
		return -EBADF;
	sem_init(&k.done, 0, 0);
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&attr, 64 << 10);
	int rc = pthread_create(&th, &attr, keep_main, &k);
	pthread_attr_destroy(&attr);
	if (rc == 0) {
		while (sem_wait(&k.done) < 0 && errno == EINTR)
			;
		rc = k.rc;
	} else {
		rc = -rc;
	}
	sem_destroy(&k.done);
	if (rc == 0) {
		close(fd); /* this table's copy: the thread's is the only one left */
		return 0;
	}
	/* Left open in the process's table, it breaks only once the whole
	 * daemon has ended (as SIGCHLD tells), never while it serves. */
	log_warn("no lifeline to the holder (%s): after a crash the next daemon starts only "
		 "once this one has wholly ended", strerror(-rc));
	return rc;
}

/* ---- the holder's side -------------------------------------------------------------- */

/* Reads /proc/<pid>/task/<tid>/<what> into buf; its length or -1. */
static ssize_t read_task(pid_t pid, const char *tid, const char *what, char *buf, size_t len)
{
	char path[96];

	snprintf(path, sizeof(path), "/proc/%ld/task/%.20s/%s", (long)pid, tid, what);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t n = read(fd, buf, len - 1);
	close(fd);
	if (n < 0)
		return -1;
	buf[n] = '\0';
	return n;
}

/* From a task's stat: its flags (field 9) and exit_code (field 52, since
 * Linux 3.5; 0 where the reader may not see it). false: not a stat line. */
static bool parse_stat(const char *stat, unsigned long *flags, long *code)
{
	const char *p = strrchr(stat, ')'); /* the name before it may hold anything */

	if (!p)
		return false;
	p++;
	*code = 0;
	for (int field = 3; field <= 52; field++) {
		char *end;
		while (*p == ' ')
			p++;
		if (!*p)
			return field > 9; /* an old kernel: no exit_code */
		if (field == 9)
			*flags = strtoul(p, &end, 10);
		else if (field == 52)
			*code = strtol(p, &end, 10);
		else
			end = strpbrk(p, " \n") ? strpbrk(p, " \n") : (char *)p + strlen(p);
		if (end == p)
			return false;
		p = end;
	}
	return true;
}

enum lifeline_state lifeline_dying(pid_t pid, int *code)
{
	char path[64], stat[1024];
	struct dirent *e;
	bool exiting = false, signalled = false;
	long status = 0;

	snprintf(path, sizeof(path), "/proc/%ld/task", (long)pid);
	DIR *dir = opendir(path);
	if (!dir)
		return LIFELINE_LIVES;
	while ((e = readdir(dir))) {
		unsigned long flags;
		long c;
		if (e->d_name[0] == '.')
			continue;
		if (read_task(pid, e->d_name, "stat", stat, sizeof(stat)) < 0)
			continue; /* released since the listing: it ended */
		if (!parse_stat(stat, &flags, &c) || !(flags & PF_EXITING)) {
			closedir(dir);
			return LIFELINE_LIVES;
		}
		exiting = true;
		if (c & 0x7f)
			signalled = true;
		if (c)
			status = c;
	}
	closedir(dir);
	if (!exiting)
		return LIFELINE_LIVES; /* nothing read: not a sign of death */
	*code = (int)status;
	return signalled || status ? LIFELINE_DIES : LIFELINE_ENDS;
}

enum lifeline_state lifeline_wait_dying(pid_t pid, int wait_ms, int *code)
{
	struct timespec start, now, pause = { .tv_nsec = 200000 };

	clock_gettime(CLOCK_MONOTONIC, &start);
	for (;;) {
		enum lifeline_state s = lifeline_dying(pid, code);
		if (s != LIFELINE_LIVES)
			return s;
		clock_gettime(CLOCK_MONOTONIC, &now);
		if ((now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000 >=
		    wait_ms)
			return LIFELINE_LIVES;
		nanosleep(&pause, NULL);
	}
}

void lifeline_describe_living(pid_t pid, char *buf, size_t len)
{
	char path[64], stat[1024], wchan[128];
	struct dirent *e;
	size_t at = 0;

	buf[0] = '\0';
	snprintf(path, sizeof(path), "/proc/%ld/task", (long)pid);
	DIR *dir = opendir(path);
	if (!dir)
		return;
	while ((e = readdir(dir)) && at + 1 < len) {
		unsigned long flags;
		long c;
		if (e->d_name[0] == '.' || read_task(pid, e->d_name, "stat", stat, sizeof(stat)) < 0 ||
		    (parse_stat(stat, &flags, &c) && (flags & PF_EXITING)))
			continue;
		if (read_task(pid, e->d_name, "wchan", wchan, sizeof(wchan)) <= 0)
			strcpy(wchan, "?");
		int n = snprintf(buf + at, len - at, "%s%s:%s", at ? " " : "", e->d_name, wchan);
		if (n < 0)
			break;
		at += (size_t)n < len - at ? (size_t)n : len - at - 1;
	}
	closedir(dir);
}
