/* SPDX-License-Identifier: Apache-2.0 */
/* What the files of src/cmd/artfsctl/ share: the mount a command runs on,
 * the views of the daemon's .artfs/ files, and the functions one file
 * gives the others. */
#ifndef ARTFS_ARTFSCTL_I_H
#define ARTFS_ARTFSCTL_I_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "state/config.h"
#include "state/metrics.h"

#define PROG "artfsctl"
#define EXIT_USAGE 2
#define INFO_FILE_MAX (64u << 20)  /* bytes of .artfs/config or .artfs/metrics */

struct ctl {
	const char *mnt;
};

struct opt_u64 {
	bool have;
	uint64_t v;
};

struct version_sample {
	const char *version;  /* points into the metrics text */
	int kind;
	uint64_t value;
};

/* .artfs/metrics: the global samples and the per-version ones. */
struct metrics_view {
	struct opt_u64 global[METRIC_COUNT];
	struct version_sample *samples;
	size_t nsamples, cap;
	bool oom;
};

/* .artfs/config read back through the daemon's own option table. */
struct config_view {
	const char *mountpoint;  /* points into the config text */
	struct artfs_config cfg;
};

/* main.c: the usage and the messages; each returns the exit status. */
void ctl_usage(FILE *f);
/* An operation failed: exit status 1. */
int ctl_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The command line is wrong: exit status 2 (EXIT_USAGE). */
int ctl_bad_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* s with anything but printable ASCII as '?', at most max bytes. */
const char *ctl_printable(const char *s, char *buf, size_t size, size_t max);
const char *ctl_bad_option(char **argv, char *buf, size_t size);

/* units.c: numbers read and written. */
bool ctl_parse_positive(const char *s, uint64_t *out);
const char *ctl_human_bytes(uint64_t v, char *buf, size_t size);
const char *ctl_human_duration(uint64_t s, char *buf, size_t size);

/* mount.c: the mount, its control file, writes and the clock. */
char *ctl_path_in(const char *mnt, const char *rel);
/* 0, or the exit status after saying why ctl->mnt is not an artfs mount. */
int ctl_mount_check(const struct ctl *ctl);
/* A line written to .artfs/control: 0 or -errno (the daemon's answer). */
int ctl_control_write(const struct ctl *ctl, const char *what, const char *line);
int ctl_write_all(int fd, const void *buf, size_t len);
double ctl_seconds_now(void);      /* CLOCK_MONOTONIC */

/* info.c: the .artfs/ files read and parsed. */
int info_read(const struct ctl *ctl, const char *rel, char **text, size_t *len);
void ctl_for_each_line(char *text, size_t len, void (*fn)(char *line, void *arg), void *arg);
/* for_each_line's fn for .artfs/config (arg: a config_view, config_init'ed). */
void info_config_line(char *line, void *arg);
/* for_each_line's fn for .artfs/metrics (arg: a metrics_view). */
void info_metrics_line(char *line, void *arg);
/* One sample line of .artfs/metrics, parsed in place: its name, the value
 * of its version label (NULL without one) and its value; false for
 * comments, blank and malformed lines. */
bool info_sample_parse(char *line, const char **name, const char **version, uint64_t *value);

/* The commands, one file each (load.c has load and unload). */
int cmd_status(struct ctl *ctl, int argc, char **argv);
int cmd_materialize(struct ctl *ctl, int argc, char **argv);
int cmd_load(struct ctl *ctl, int argc, char **argv);
int cmd_unload(struct ctl *ctl, int argc, char **argv);
int cmd_upgrade(struct ctl *ctl, int argc, char **argv);
int cmd_cache(struct ctl *ctl, int argc, char **argv);

#endif
