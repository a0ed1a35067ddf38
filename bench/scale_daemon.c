/* SPDX-License-Identifier: Apache-2.0 */
/* scale_bench's daemon: started as a child on a store (the mount's holder,
 * which runs the daemon that serves), waited for, measured (its log, its
 * memory) and stopped; and leaving nothing behind: every failure path and
 * every signal that ends the run unmounts (lazily) and kills the daemon. */
#include "autoconf.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "scale_i.h"
#include "util.h"

#define MOUNT_WAIT_S 600
#define EXIT_WAIT_S 120

static volatile pid_t g_daemon = -1;
static char g_mnt[PATH_MAX];
static volatile sig_atomic_t g_mount_armed; /* a mount of ours may exist */
static pid_t g_main_pid;

/* Async-signal-safe: lazy unmount, kill, reap. */
static void emergency_stop(void)
{
	if (getpid() != g_main_pid)
		return;
	if (g_mount_armed)
		umount2(g_mnt, MNT_DETACH); /* umount -l */
	pid_t pid = g_daemon;
	if (pid > 0) {
		kill(pid, SIGTERM);
		for (int i = 0; i < 500; i++) { /* 5 s */
			if (waitpid(pid, NULL, WNOHANG) == pid) {
				pid = -1;
				break;
			}
			struct timespec ts = { 0, 10 * 1000 * 1000 };
			nanosleep(&ts, NULL);
		}
		if (pid > 0) {
			kill(pid, SIGKILL);
			waitpid(pid, NULL, 0);
		}
		g_daemon = -1;
	}
	if (g_mount_armed)
		umount2(g_mnt, MNT_DETACH);
	g_mount_armed = 0;
}

static void on_signal(int sig)
{
	static const char msg[] = "scale_bench: interrupted; unmounting and stopping the daemon\n";
	ssize_t w = write(2, msg, sizeof(msg) - 1);
	(void)w;
	emergency_stop();
	_exit(128 + sig);
}

/* bench_die's hook: a fatal error in the main process unmounts and stops
 * the daemon. */
static void die_cleanup(void)
{
	if (getpid() == g_main_pid && (g_daemon > 0 || g_mount_armed)) {
		fputs("scale_bench: unmounting (lazily) and stopping the daemon\n", stderr);
		emergency_stop();
	}
}

void scale_daemon_guard(void)
{
	bench_die_hook = die_cleanup;
	g_main_pid = getpid();
}

void scale_daemon_signals(const char *mnt)
{
	snprintf(g_mnt, sizeof(g_mnt), "%s", mnt);
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
}

static void sleep_ms(unsigned ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

/* /proc/self/mounts escapes space, tab, newline and backslash as \ooo. */
static void unescape_mount(char *s)
{
	char *o = s;

	while (*s) {
		if (s[0] == '\\' && s[1] >= '0' && s[1] <= '3' && s[2] >= '0' && s[2] <= '7' &&
		    s[3] >= '0' && s[3] <= '7') {
			*o++ = (char)((s[1] - '0') * 64 + (s[2] - '0') * 8 + (s[3] - '0'));
			s += 4;
		} else
			*o++ = *s++;
	}
	*o = '\0';
}

bool scale_daemon_is_mounted(const char *path)
{
	FILE *f = fopen("/proc/self/mounts", "re");
	char line[4096];
	bool found = false;

	if (!f)
		bench_die("open /proc/self/mounts: %s", strerror(errno));
	while (!found && fgets(line, sizeof(line), f)) {
		char *save, *dev = strtok_r(line, " ", &save);
		char *mp = dev ? strtok_r(NULL, " ", &save) : NULL;
		char *type = mp ? strtok_r(NULL, " ", &save) : NULL;
		if (!type)
			continue;
		unescape_mount(mp);
		if (strcmp(mp, path) == 0 && strncmp(type, "fuse", 4) == 0)
			found = true;
	}
	fclose(f);
	return found;
}

void scale_daemon_log_tail(const char *log)
{
	FILE *f = fopen(log, "re");
	char line[1024];
	char ring[8][1024];
	unsigned n = 0;

	if (!f)
		return;
	while (fgets(line, sizeof(line), f))
		snprintf(ring[n++ % 8], sizeof(ring[0]), "%s", line);
	fclose(f);
	fprintf(stderr, "scale_bench: last lines of %s:\n", log);
	for (unsigned i = n > 8 ? n - 8 : 0; i < n; i++)
		fprintf(stderr, "  %s", ring[i % 8]);
}

void scale_daemon_read_status(pid_t pid, long *rss, long *hwm, long *anon)
{
	char path[64], line[256];

	snprintf(path, sizeof(path), "/proc/%ld/status", (long)pid);
	FILE *f = fopen(path, "re");
	if (!f)
		bench_die("open %s: %s", path, strerror(errno));
	*rss = *hwm = *anon = -1;
	while (fgets(line, sizeof(line), f)) {
		if (strncmp(line, "VmRSS:", 6) == 0)
			*rss = strtol(line + 6, NULL, 10);
		else if (strncmp(line, "VmHWM:", 6) == 0)
			*hwm = strtol(line + 6, NULL, 10);
		else if (strncmp(line, "RssAnon:", 8) == 0)
			*anon = strtol(line + 8, NULL, 10);
	}
	fclose(f);
	if (*rss < 0)
		bench_die("no VmRSS in %s", path);
}

pid_t scale_daemon_serving(pid_t holder)
{
	char path[96];
	long child = -1;

	snprintf(path, sizeof(path), "/proc/%ld/task/%ld/children", (long)holder, (long)holder);
	for (int tries = 0; tries < 5000 && child < 0; tries++) {
		FILE *f = fopen(path, "re");
		if (f) {
			if (fscanf(f, "%ld", &child) != 1)
				child = -1;
			fclose(f);
		}
		if (child < 0)
			sleep_ms(1);
	}
	if (child < 0)
		bench_die("holder %ld runs no daemon", (long)holder);
	return (pid_t)child;
}

static void parse_index_line(struct daemon_run *d)
{
	FILE *f = fopen(d->log, "re");
	char line[2048];

	d->have_index = false;
	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		const char *p = strstr(line, "indexed ");
		if (!p)
			continue;
		/* Names are indexed before the mount; bytes are counted after it,
		 * in the background ("sized N objects, B bytes, in X ms"). */
		if (sscanf(p, "indexed %llu objects in %llu versions in %lf ms", &d->idx_objects,
			   &d->idx_versions, &d->idx_ms) == 3)
			d->have_index = true;
	}
	fclose(f);
}

double scale_daemon_wait_sized(const char *log, unsigned long long *bytes)
{
	for (int i = 0; i < 6000; i++) {
		FILE *f = fopen(log, "re");
		char line[2048];
		double ms = -1;
		unsigned long long objects;
		while (f && fgets(line, sizeof(line), f)) {
			const char *p = strstr(line, "sized ");
			if (p && sscanf(p, "sized %llu objects, %llu bytes, in %lf ms", &objects, bytes,
					&ms) == 3)
				break;
			ms = -1;
		}
		if (f)
			fclose(f);
		if (ms >= 0)
			return ms;
		usleep(10000);
	}
	return -1;
}

void scale_daemon_start(const struct cfg *c, const char *store, const char *log,
			struct daemon_run *d)
{
	char opts[PATH_MAX + 64];

	memset(d, 0, sizeof(*d));
	snprintf(d->log, sizeof(d->log), "%s", log);
	if ((size_t)snprintf(opts, sizeof(opts), "store=%s,capacity=64G", store) >= sizeof(opts))
		bench_die("store path too long");
	if (scale_daemon_is_mounted(c->mnt))
		bench_die("%s is already mounted (umount it first)", c->mnt);
	int logfd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (logfd < 0)
		bench_die("open %s: %s", log, strerror(errno));
	fflush(stdout);
	fflush(stderr);

	uint64_t t0 = bench_now_ns();
	pid_t pid = fork();
	if (pid < 0)
		bench_die("fork: %s", strerror(errno));
	if (pid == 0) {
		/* The daemon goes down with us, whatever kills us. */
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		if (getppid() != g_main_pid)
			_exit(127);
		int nullfd = open("/dev/null", O_RDONLY);
		if (nullfd >= 0)
			dup2(nullfd, 0);
		dup2(logfd, 1);
		dup2(logfd, 2);
		char *argv[] = { (char *)c->daemon, "-f", "-o", opts, (char *)c->mnt, NULL };
		execv(c->daemon, argv);
		dprintf(2, "scale_bench: exec %s: %s\n", c->daemon, strerror(errno));
		_exit(127);
	}
	g_daemon = pid;
	g_mount_armed = 1;
	d->pid = pid;
	close(logfd);

	for (;;) {
		if (scale_daemon_is_mounted(c->mnt))
			break;
		int status;
		if (waitpid(pid, &status, WNOHANG) == pid) {
			g_daemon = -1;
			scale_daemon_log_tail(log);
			bench_die("the daemon exited before mounting (status %d)",
				  WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
		}
		if (bench_now_ns() - t0 > (uint64_t)MOUNT_WAIT_S * 1000000000ull)
			bench_die("no mount at %s after %d s", c->mnt, MOUNT_WAIT_S);
		sleep_ms(1);
	}
	d->start_ns = bench_now_ns() - t0;
	struct stat st;
	if (stat(c->mnt, &st) < 0)
		bench_die("stat %s: %s", c->mnt, strerror(errno));
	d->ready_ns = bench_now_ns() - t0;
	scale_daemon_read_status(scale_daemon_serving(pid), &d->rss_kb, &d->hwm_kb, &d->anon_kb);
	parse_index_line(d);
}

int scale_daemon_stop(const struct cfg *c, struct daemon_run *d, uint64_t *exit_ns)
{
	int status;
	uint64_t t0 = bench_now_ns();
	pid_t u = fork();

	if (u < 0)
		bench_die("fork: %s", strerror(errno));
	if (u == 0) {
		char *argv[] = { "umount", (char *)c->mnt, NULL };
		execvp("umount", argv);
		_exit(127);
	}
	if (waitpid(u, &status, 0) != u || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
		bench_die("umount %s failed (status %d)", c->mnt, status);
	g_mount_armed = 0;
	for (;;) {
		pid_t w = waitpid(d->pid, &status, WNOHANG);
		if (w == d->pid)
			break;
		if (w < 0)
			bench_die("waitpid daemon: %s", strerror(errno));
		if (bench_now_ns() - t0 > (uint64_t)EXIT_WAIT_S * 1000000000ull)
			bench_die("the daemon did not exit %d s after umount", EXIT_WAIT_S);
		sleep_ms(1);
	}
	*exit_ns = bench_now_ns() - t0;
	g_daemon = -1;
	if (WIFEXITED(status))
		return WEXITSTATUS(status);
	return 128 + WTERMSIG(status);
}
