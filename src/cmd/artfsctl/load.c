/* SPDX-License-Identifier: Apache-2.0 */
/* artfsctl load and unload: GPU weights of a version, asked for through
 * .artfs/control; a load is followed through <wv>/weights/status, with a
 * progress bar on a terminal, until ready or failed. */
#include "autoconf.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmd/artfsctl/artfsctl_i.h"
#include "format/key.h"

/* key = value lines of <wv>/weights/status; the value of key into out. */
static bool status_value(const char *text, const char *key, char *out, size_t size)
{
	size_t klen = strlen(key);

	for (const char *line = text; line && *line;) {
		const char *nl = strchr(line, '\n');
		size_t len = nl ? (size_t)(nl - line) : strlen(line);
		if (len > klen + 3 && strncmp(line, key, klen) == 0 && strncmp(line + klen, " = ", 3) == 0) {
			size_t v = len - klen - 3;
			if (v >= size)
				v = size - 1;
			memcpy(out, line + klen + 3, v);
			out[v] = '\0';
			return true;
		}
		line = nl ? nl + 1 : NULL;
	}
	return false;
}

static void progress(const char *wv, uint64_t done, uint64_t total, double rate)
{
	const int width = 40;
	int filled = total ? (int)((double)done / (double)total * width) : 0;
	char hd[32], ht[32];

	ctl_human_bytes(done, hd, sizeof(hd));
	ctl_human_bytes(total, ht, sizeof(ht));
	fprintf(stderr, "\r%s [", wv);
	for (int i = 0; i < width; i++)
		fputc(i < filled ? '#' : '.', stderr);
	fprintf(stderr, "] %s / %s  %.0f MB/s ", hd, ht, rate);
	fflush(stderr);
}

/* Follows <wv>/weights/status until ready (0) or failed (1). */
static int wait_ready(const struct ctl *ctl, const char *wv)
{
	char rel[ARTFS_VERSION_NAME_MAX + 32], state[32], v[512];
	bool bar = isatty(STDERR_FILENO);

	snprintf(rel, sizeof(rel), "%s/weights/status", wv);
	for (;;) {
		char *text;
		size_t len;
		int rc = info_read(ctl, rel, &text, &len);
		if (rc < 0)
			return ctl_fail("load %s: the weights are gone (%s): unloaded meanwhile?", wv,
				    strerror(-rc));
		uint64_t done = 0, total = 0;
		double rate = 0;
		if (status_value(text, "bytes_done", v, sizeof(v)))
			done = strtoull(v, NULL, 10);
		if (status_value(text, "bytes_total", v, sizeof(v)))
			total = strtoull(v, NULL, 10);
		if (status_value(text, "rate_mb_per_s", v, sizeof(v)))
			rate = strtod(v, NULL);
		if (!status_value(text, "state", state, sizeof(state)))
			state[0] = '\0';
		if (bar)
			progress(wv, done, total, rate);
		if (strcmp(state, "loading") != 0) {
			if (bar)
				fputc('\n', stderr);
			if (strcmp(state, "ready") == 0) {
				char secs[32] = "?", hb[32];
				status_value(text, "seconds", secs, sizeof(secs));
				ctl_human_bytes(total, hb, sizeof(hb));
				printf("%s: ready, %s in %s s (%.0f MB/s)\n", wv, hb, secs, rate);
				free(text);
				return 0;
			}
			if (!status_value(text, "error", v, sizeof(v)))
				v[0] = '\0';
			free(text);
			return ctl_fail("load %s: %s: %s", wv, state, v);
		}
		free(text);
		usleep(20 * 1000); /* a flip waits on this: poll often */
	}
}

int cmd_load(struct ctl *ctl, int argc, char **argv)
{
	enum { OPT_GPUS = 256, OPT_NO_WAIT };
	static const struct option longopts[] = {
		{ "gpus", required_argument, NULL, OPT_GPUS },
		{ "no-wait", no_argument, NULL, OPT_NO_WAIT },
		{ "mount", required_argument, NULL, 'm' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *gpus = NULL;
	bool wait = true;
	char o[64];
	int opt;

	optind = 0;
	while ((opt = getopt_long(argc, argv, ":m:h", longopts, NULL)) != -1) {
		switch (opt) {
		case OPT_GPUS: gpus = optarg; break;
		case OPT_NO_WAIT: wait = false; break;
		case 'm': ctl->mnt = optarg; break;
		case 'h': ctl_usage(stdout); return 0;
		case ':': return ctl_bad_usage("load: %s needs a value", ctl_bad_option(argv, o, sizeof(o)));
		default: return ctl_bad_usage("load: unknown option %s", ctl_bad_option(argv, o, sizeof(o)));
		}
	}
	if (argc - optind != 2)
		return ctl_bad_usage("load: needs <wv> <checkpoint-dir>");
	const char *wv = argv[optind];
	if (!key_version_name_valid(wv))
		return ctl_bad_usage("load: \"%s\" is not a weight version name", wv);
	if (gpus && (!*gpus || strspn(gpus, "0123456789,") != strlen(gpus)))
		return ctl_bad_usage("load: --gpus takes a list like 0,1,2");
	char dir[PATH_MAX];
	if (!realpath(argv[optind + 1], dir))
		return ctl_fail("load %s: %s: %s", wv, argv[optind + 1], strerror(errno));
	if (strpbrk(dir, " \t\n"))
		return ctl_fail("load %s: %s: a checkpoint path with spaces is not supported", wv, dir);
	int rc = ctl_mount_check(ctl);
	if (rc)
		return rc;
	char line[PATH_MAX + 512];
	snprintf(line, sizeof(line), "load %s %s%s%s\n", wv, dir, gpus ? " gpus=" : "", gpus ? gpus : "");
	rc = ctl_control_write(ctl, "load", line);
	switch (rc) {
	case 0: break;
	case -ENODEV:
		return ctl_fail("load %s: no GPU support in this artfs, or no GPU (%s)", wv,
				strerror(-rc));
	case -ENOENT:
		return ctl_fail("load %s: %s holds no safetensors checkpoint (%s)", wv, dir,
				strerror(-rc));
	case -EEXIST: return ctl_fail("load %s: weights of %s are already loaded; loaded weights are "
				  "immutable, use a new version (%s)", wv, wv, strerror(-rc));
	case -EINVAL: return ctl_fail("load %s: the checkpoint or the GPU list was refused; the daemon "
				  "log says why (%s)", wv, strerror(-rc));
	case -ENOMEM: return ctl_fail("load %s: the GPUs lack room for it; attached versions are "
				  "untouched; the daemon log says how much is free (%s)", wv, strerror(-rc));
	default: return ctl_fail("load %s: %s", wv, strerror(-rc));
	}
	return wait ? wait_ready(ctl, wv) : 0;
}

int cmd_unload(struct ctl *ctl, int argc, char **argv)
{
	if (argc == 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
		ctl_usage(stdout);
		return 0;
	}
	if (argc != 2)
		return ctl_bad_usage("unload: needs <wv>");
	if (!key_version_name_valid(argv[1]))
		return ctl_bad_usage("unload: \"%s\" is not a weight version name", argv[1]);
	int rc = ctl_mount_check(ctl);
	if (rc)
		return rc;
	char line[ARTFS_VERSION_NAME_MAX + 16];
	snprintf(line, sizeof(line), "unload %s\n", argv[1]);
	rc = ctl_control_write(ctl, "unload", line);
	if (rc == -ENOENT)
		return ctl_fail("unload %s: no weights of %s are loaded", argv[1], argv[1]);
	if (rc < 0)
		return ctl_fail("unload %s: %s", argv[1], strerror(-rc));
	printf("%s: unloaded (GPU memory is freed when the last attached engine closes)\n", argv[1]);
	return 0;
}
