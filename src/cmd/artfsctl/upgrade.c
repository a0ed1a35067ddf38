/* SPDX-License-Identifier: Apache-2.0 */
/* artfsctl upgrade: asks the holder for the binary on disk to take the
 * mount over, and waits for the new daemon to serve, or for the holder's
 * record to say why it did not. */
#include "autoconf.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmd/artfsctl/artfsctl_i.h"
#include "state/config.h"
#include "state/metrics.h"

#define UPGRADE_WAIT_S 120

/* The serving daemon's pid and generation, from the metrics. */
static int daemon_of(const struct ctl *ctl, uint64_t *pid, uint64_t *generation)
{
	char *text = NULL;
	size_t len;
	struct metrics_view m = { 0 };
	int rc = info_read(ctl, ".artfs/metrics", &text, &len);

	if (rc < 0)
		return rc;
	ctl_for_each_line(text, len, info_metrics_line, &m);
	free(m.samples);
	free(text);
	if (!m.global[METRIC_DAEMON_PID].have || !m.global[METRIC_DAEMON_GENERATION].have)
		return -EPROTO; /* a daemon from before restarts */
	*pid = m.global[METRIC_DAEMON_PID].v;
	*generation = m.global[METRIC_DAEMON_GENERATION].v;
	return 0;
}

/* <store>/upgrade-outcome of the mount's store (from .artfs/config), or
 * NULL when the store is not known. */
static char *upgrade_outcome_path(const struct ctl *ctl)
{
	char *text = NULL, *path = NULL;
	size_t len;
	struct config_view c = { 0 };
	unsigned store_bit;

	if (info_read(ctl, ".artfs/config", &text, &len) < 0)
		return NULL;
	config_init(&c.cfg);
	ctl_for_each_line(text, len, info_config_line, &c);
	config_option_find("store", &store_bit);
	if ((c.cfg.given & store_bit) && c.cfg.store && c.cfg.store[0] == '/')
		path = ctl_path_in(c.cfg.store, "upgrade-outcome");
	config_free(&c.cfg);
	free(text);
	return path;
}

/* The holder's record of its last upgrade: its line in buf ("" when there
 * is none); -errno when it cannot be read. */
static int outcome_read(const char *path, char *buf, size_t size)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);

	buf[0] = '\0';
	if (fd < 0)
		return errno == ENOENT ? 0 : -errno;
	ssize_t n = read(fd, buf, size - 1);
	int rc = n < 0 ? -errno : 0;
	close(fd);
	buf[n > 0 ? n : 0] = '\0';
	char *nl = strchr(buf, '\n');
	if (nl)
		*nl = '\0';
	return rc;
}

struct upgrade_wait {
	uint64_t old_pid, old_gen;
	char *outcome_path;        /* NULL: the store is not known */
	char before[768];          /* the record before the request */
	unsigned long long seq;    /* the record of this upgrade, once seen */
	bool seen;
	double start;
};

/* One look at the holder's record: 1 the upgrade served (a new daemon
 * answers the metrics), -1 it failed (said), 0 not yet. */
static int outcome_look(const struct ctl *ctl, struct upgrade_wait *w)
{
	char line[768], state[16];
	unsigned long long seq;
	long pid;
	int at = 0;
	uint64_t now_pid, now_gen;

	if (!w->outcome_path || outcome_read(w->outcome_path, line, sizeof(line)) < 0 ||
	    strcmp(line, w->before) == 0 ||
	    sscanf(line, "%llu %15s %ld %n", &seq, state, &pid, &at) != 3)
		return 0;
	if (!w->seen) { /* the first new record is this upgrade's */
		w->seen = true;
		w->seq = seq;
	}
	if (seq != w->seq)
		return 0; /* another's, written over this one's: this one's comes again */
	if (strcmp(state, "failed") == 0) {
		ctl_fail("upgrade: failed: %s", line + at);
		return -1;
	}
	/* Served: the daemon named answers (if it died right after it took
	 * over, the holder says so next). */
	if (strcmp(state, "served") == 0 && daemon_of(ctl, &now_pid, &now_gen) == 0 &&
	    now_pid == (uint64_t)pid) {
		printf("%s: upgraded: daemon %ld serves it, after daemon %" PRIu64 " (%.3f s)\n",
		       ctl->mnt, pid, w->old_pid, ctl_seconds_now() - w->start);
		return 1;
	}
	return 0;
}

static int upgrade_wait(const struct ctl *ctl, struct upgrade_wait *w)
{
	uint64_t now_pid, now_gen;

	for (;;) {
		int r = outcome_look(ctl, w);
		if (r)
			return r > 0 ? 0 : 1;
		/* No record of the holder's: a new daemon answering is the sign. */
		if (!w->seen && ctl_seconds_now() - w->start > 1.0 &&
		    daemon_of(ctl, &now_pid, &now_gen) == 0 && now_pid != w->old_pid &&
		    now_gen > w->old_gen) {
			printf("%s: upgraded: daemon %" PRIu64 " serves it, after daemon %" PRIu64
			       " (%.3f s)\n", ctl->mnt, now_pid, w->old_pid, ctl_seconds_now() - w->start);
			return 0;
		}
		if (ctl_seconds_now() - w->start > UPGRADE_WAIT_S)
			return ctl_fail("upgrade: no new daemon serves %s after %d s (the daemon log "
				    "says why)", ctl->mnt, UPGRADE_WAIT_S);
		usleep(10000);
	}
}

/* Asks for the binary on disk to take over the mount (the holder starts
 * it beside the serving daemon, which drains), and waits until it serves
 * or the holder says the upgrade failed (and why), in the record it keeps
 * in the store's directory (fs/holder.c: "<seq> <state> <pid> <why>").
 * Where that record cannot be read (another user's store, a holder from
 * before it), a new daemon answering the metrics is the success. */
int cmd_upgrade(struct ctl *ctl, int argc, char **argv)
{
	uint64_t pid, gen;

	if (argc == 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
		ctl_usage(stdout);
		return 0;
	}
	if (argc != 1)
		return ctl_bad_usage("upgrade: takes no argument");
	int rc = ctl_mount_check(ctl);
	if (rc)
		return rc;
	if ((rc = daemon_of(ctl, &pid, &gen)) < 0)
		return ctl_fail("upgrade: %s does not say which daemon serves it (%s): an artfs "
			    "from before in-place upgrades", ctl->mnt, strerror(-rc));
	struct upgrade_wait w = { .old_pid = pid, .old_gen = gen };
	w.outcome_path = upgrade_outcome_path(ctl);
	if (w.outcome_path)
		outcome_read(w.outcome_path, w.before, sizeof(w.before));
	w.start = ctl_seconds_now();
	rc = ctl_control_write(ctl, "upgrade", "upgrade\n");
	if (rc == -EOPNOTSUPP)
		rc = ctl_fail("upgrade: the daemon of %s was not started by a holder", ctl->mnt);
	else if (rc < 0)
		rc = ctl_fail("upgrade: %s", strerror(-rc));
	else
		rc = upgrade_wait(ctl, &w);
	free(w.outcome_path);
	return rc;
}
