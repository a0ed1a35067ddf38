/* SPDX-License-Identifier: Apache-2.0 */
/* artfsctl status: .artfs/config and .artfs/metrics, read in a child that
 * is killed when the mount does not answer in time, printed as the
 * mount, its store and capacity, and one line per weight version. */
#include "autoconf.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cmd/artfsctl/artfsctl_i.h"
#include "state/config.h"
#include "state/metrics.h"

/* The option's value when the daemon listed it. */
static struct opt_u64 config_u64(const struct config_view *c, const char *name)
{
	unsigned bit;
	const struct config_option *o = config_option_find(name, &bit);

	if (!o || !(c->cfg.given & bit))
		return (struct opt_u64){ false, 0 };
	return (struct opt_u64){ true, *(const uint64_t *)((const char *)&c->cfg + o->offset) };
}

static int sample_cmp(const void *a, const void *b)
{
	const struct version_sample *x = a, *y = b;
	int c = strcmp(x->version, y->version);

	return c ? c : x->kind - y->kind;
}

static const char *opt_text(struct opt_u64 o, char *buf, size_t size)
{
	if (!o.have)
		return "?";
	snprintf(buf, size, "%" PRIu64, o.v);
	return buf;
}

static void print_versions(struct metrics_view *m)
{
	char a[32], b[32];
	int width = 7;

	if (m->nsamples)
		qsort(m->samples, m->nsamples, sizeof(*m->samples), sample_cmp);
	for (size_t i = 0; i < m->nsamples; i++) {
		int len = (int)strlen(m->samples[i].version);
		if (len > width)
			width = len;
	}
	printf("\n");
	if (m->nsamples == 0) {
		printf("no weight versions\n");
		return;
	}
	printf("%-*s  %8s  %10s  %7s  %4s\n", width, "VERSION", "OBJECTS", "BYTES", "IDLE", "OPEN");
	for (size_t i = 0; i < m->nsamples;) {
		const char *name = m->samples[i].version;
		struct opt_u64 v[METRIC_VERSION_COUNT] = { { 0 } };
		for (; i < m->nsamples && strcmp(m->samples[i].version, name) == 0; i++)
			v[m->samples[i].kind] = (struct opt_u64){ true, m->samples[i].value };
		char objects[24], open_files[24];
		printf("%-*s  %8s  %10s  %7s  %4s\n", width, name,
		       opt_text(v[METRIC_VERSION_OBJECTS], objects, sizeof(objects)),
		       v[METRIC_VERSION_BYTES].have
			       ? ctl_human_bytes(v[METRIC_VERSION_BYTES].v, a, sizeof(a)) : "?",
		       v[METRIC_VERSION_IDLE].have
			       ? ctl_human_duration(v[METRIC_VERSION_IDLE].v, b, sizeof(b)) : "?",
		       opt_text(v[METRIC_VERSION_OPEN], open_files, sizeof(open_files)));
	}
}

static int status_report(const struct ctl *ctl, struct config_view *c, struct metrics_view *m)
{
	char s1[32], s2[32], s3[32], safe[512];
	struct opt_u64 *g = m->global;
	struct opt_u64 capacity = g[METRIC_CAPACITY].have ? g[METRIC_CAPACITY] : config_u64(c, "capacity");
	struct opt_u64 ttl = config_u64(c, "ttl");
	unsigned store_bit;
	config_option_find("store", &store_bit);
	const char *store = c->cfg.given & store_bit ? c->cfg.store : NULL;

	printf("mount       %s\n", ctl_printable(c->mountpoint && *c->mountpoint ? c->mountpoint
									     : ctl->mnt,
						 safe, sizeof(safe), 400));
	printf("store       %s\n", store ? ctl_printable(store, safe, sizeof(safe), 400) : "?");
	printf("objects     %s in %s versions\n", opt_text(g[METRIC_OBJECTS], s1, sizeof(s1)),
	       opt_text(g[METRIC_VERSIONS], s2, sizeof(s2)));
	printf("used        %s of %s",
	       g[METRIC_BYTES_USED].have ? ctl_human_bytes(g[METRIC_BYTES_USED].v, s1, sizeof(s1)) : "?",
	       capacity.have ? ctl_human_bytes(capacity.v, s2, sizeof(s2)) : "?");
	if (g[METRIC_BYTES_USED].have && capacity.have && capacity.v > 0)
		printf(" (%.1f%%)", 100.0 * (double)g[METRIC_BYTES_USED].v / (double)capacity.v);
	printf("\n");
	printf("reserved    %s by %s publishes in flight\n",
	       g[METRIC_BYTES_RESERVED].have
		       ? ctl_human_bytes(g[METRIC_BYTES_RESERVED].v, s1, sizeof(s1)) : "?",
	       opt_text(g[METRIC_PUBLISHING], s2, sizeof(s2)));
	printf("publishes   %s, %s checksum failures\n", opt_text(g[METRIC_PUBLISHES], s1, sizeof(s1)),
	       opt_text(g[METRIC_CHECKSUM_FAILURES], s2, sizeof(s2)));
	if (!ttl.have)
		printf("ttl         ?\n");
	else if (ttl.v == 0)
		printf("ttl         never (0)\n");
	else
		printf("ttl         %s (%s s)\n", ctl_human_duration(ttl.v, s1, sizeof(s1)),
		       opt_text(ttl, s3, sizeof(s3)));
	print_versions(m);
	if (fflush(stdout) != 0 || ferror(stdout))
		return ctl_fail("writing to stdout: %s", strerror(errno));
	return 0;
}

/* How long status waits for the mount's answers by default: a mount whose
 * daemon does not serve (one that cannot start: the holder retries, and
 * says why in its log) answers nothing, and a read of it waits for good. */
#define STATUS_WAIT_S 5

struct status_texts {
	char *text[2];             /* .artfs/config, .artfs/metrics */
	size_t len[2];
};

static const char *const status_files[2] = { ".artfs/config", ".artfs/metrics" };

/* In a child of its own (status_fetch): the two files, each as its read's
 * result (int), then its length and bytes, on fd. Exits with the exit
 * status of the mount's check. */
static void status_child(const struct ctl *ctl, int fd)
{
	int rc = ctl_mount_check(ctl);

	if (rc)
		_exit(rc);
	for (int i = 0; i < 2; i++) {
		char *text = NULL;
		size_t len = 0;
		int32_t r = info_read(ctl, status_files[i], &text, &len);
		uint64_t n = len;
		if (write(fd, &r, sizeof(r)) != sizeof(r) ||
		    (r == 0 && (write(fd, &n, sizeof(n)) != sizeof(n) || ctl_write_all(fd, text, len) < 0)))
			_exit(1);
		free(text);
	}
	_exit(0);
}

/* Reads len bytes from fd until the deadline (CLOCK_MONOTONIC s): 0,
 * -ETIMEDOUT, -EPIPE (the writer ended first) or -errno. */
static int read_until(int fd, void *buf, size_t len, double deadline)
{
	for (size_t done = 0; done < len;) {
		double left = deadline - ctl_seconds_now();
		struct pollfd p = { .fd = fd, .events = POLLIN };
		int n = left > 0 ? poll(&p, 1, (int)(left * 1000) + 1) : 0;
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return -ETIMEDOUT;
		ssize_t r = read(fd, (char *)buf + done, len - done);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return r < 0 ? -errno : -EPIPE;
		done += (size_t)r;
	}
	return 0;
}

/* One file's text from the child: 0, the read's -errno (*failed set), or
 * the pipe's. */
static int status_take(int fd, struct status_texts *t, int i, double deadline, int *failed)
{
	int32_t r;
	uint64_t n;
	int rc = read_until(fd, &r, sizeof(r), deadline);

	if (rc < 0)
		return rc;
	if (r < 0) {
		*failed = r;
		return 0;
	}
	if ((rc = read_until(fd, &n, sizeof(n), deadline)) < 0)
		return rc;
	if (n >= INFO_FILE_MAX || !(t->text[i] = malloc((size_t)n + 1)))
		return -ENOMEM;
	t->len[i] = (size_t)n;
	t->text[i][n] = '\0';
	return read_until(fd, t->text[i], (size_t)n, deadline);
}

/* Reads .artfs/config and .artfs/metrics in a child process, waiting at
 * most wait_s for them: a read of a mount whose daemon does not serve
 * waits in the kernel, where only a fatal signal ends it (the child is
 * killed then, and this process answers). Returns 0 or the exit status
 * after saying why. */
static int status_fetch(const struct ctl *ctl, unsigned wait_s, struct status_texts *t)
{
	int p[2], rc = 0, failed[2] = { 0, 0 };

	if (pipe2(p, O_CLOEXEC) < 0)
		return ctl_fail("status: %s", strerror(errno));
	fflush(NULL);
	pid_t pid = fork();
	if (pid == 0) {
		close(p[0]);
		status_child(ctl, p[1]);
	}
	close(p[1]);
	if (pid < 0) {
		close(p[0]);
		return ctl_fail("status: %s", strerror(errno));
	}
	double deadline = ctl_seconds_now() + wait_s;
	for (int i = 0; i < 2 && rc == 0; i++)
		rc = status_take(p[0], t, i, deadline, &failed[i]);
	close(p[0]);
	if (rc == -ETIMEDOUT) {
		kill(pid, SIGKILL);
		waitpid(pid, NULL, WNOHANG); /* a request already read by a dying daemon holds it */
		return ctl_fail("%s does not answer within %u s: its daemon does not serve (the artfs "
			    "log, syslog in the background, says why)", ctl->mnt, wait_s);
	}
	int status = 0;
	waitpid(pid, &status, 0);
	if (rc == -EPIPE && WIFEXITED(status) && WEXITSTATUS(status) != 0)
		return WEXITSTATUS(status); /* the mount's check said why */
	if (rc < 0)
		return ctl_fail("status: %s", strerror(-rc));
	for (int i = 0; i < 2; i++)
		if (failed[i] < 0)
			return ctl_fail("reading %s/%s: %s", ctl->mnt, status_files[i], strerror(-failed[i]));
	return 0;
}

int cmd_status(struct ctl *ctl, int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "mount", required_argument, NULL, 'm' },
		{ "timeout", required_argument, NULL, 't' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	char o[64];
	int opt;
	uint64_t wait_s = STATUS_WAIT_S;

	optind = 0;
	while ((opt = getopt_long(argc, argv, ":m:t:h", longopts, NULL)) != -1) {
		switch (opt) {
		case 'm': ctl->mnt = optarg; break;
		case 't':
			if (!ctl_parse_positive(optarg, &wait_s) || wait_s > 86400)
				return ctl_bad_usage("status: --timeout takes seconds, 1 to 86400");
			break;
		case 'h': ctl_usage(stdout); return 0;
		case ':': return ctl_bad_usage("status: %s needs a value", ctl_bad_option(argv, o, sizeof(o)));
		default: return ctl_bad_usage("status: unknown option %s", ctl_bad_option(argv, o, sizeof(o)));
		}
	}
	if (optind < argc)
		return ctl_bad_usage("status: unexpected argument \"%s\"", argv[optind]);
	struct status_texts t = { { NULL, NULL }, { 0, 0 } };
	int rc = status_fetch(ctl, (unsigned)wait_s, &t);
	if (rc) {
		free(t.text[0]);
		free(t.text[1]);
		return rc;
	}
	struct config_view c = { 0 };
	struct metrics_view m = { 0 };
	config_init(&c.cfg);
	ctl_for_each_line(t.text[0], t.len[0], info_config_line, &c);
	ctl_for_each_line(t.text[1], t.len[1], info_metrics_line, &m);
	if (m.oom)
		rc = ctl_fail("reading %s/.artfs/metrics: %s", ctl->mnt, strerror(ENOMEM));
	else
		rc = status_report(ctl, &c, &m);
	config_free(&c.cfg);
	free(m.samples);
	free(t.text[0]);
	free(t.text[1]);
	return rc;
}
