/* SPDX-License-Identifier: Apache-2.0 */
/* artfsctl: the command line of an artfs mount. It talks to the daemon only
 * through files of the mount (DESIGN.md §2): status reads .artfs/config and
 * .artfs/metrics, materialize runs one <wv>/.materialize transaction, cache
 * walks .cache/.
 * Whatever the daemon writes is parsed as outside input: bounded lines,
 * unknown lines ignored, control bytes never echoed to a terminal.
 *
 * This file: the table of commands, main, and how artfsctl speaks: the
 * usage, its two kinds of error, text made safe for a terminal. Each
 * command lives in a file of its own (status.c, materialize.c, load.c,
 * upgrade.c, cache.c); artfsctl_i.h says what the files share. */
#include "autoconf.h"

#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd/artfsctl/artfsctl_i.h"
#include "state/config.h"

struct command {
	const char *name;
	const char *synopsis;  /* arguments after the name */
	const char *summary;
	int (*run)(struct ctl *ctl, int argc, char **argv);
};

static const struct command *commands_list(size_t *n);

/* ---- messages ------------------------------------------------------------ */

void ctl_usage(FILE *f)
{
	size_t n;
	const struct command *cmds = commands_list(&n);

	fprintf(f, "usage: " PROG " [-m MOUNTPOINT] <command> [arguments]\n\ncommands:\n");
	for (size_t i = 0; i < n; i++)
		fprintf(f, "  %s%s%s\n      %s\n", cmds[i].name, *cmds[i].synopsis ? " " : "",
			cmds[i].synopsis, cmds[i].summary);
	fprintf(f, "\noptions:\n"
		   "  -m, --mount MOUNTPOINT  the artfs mount (default $ARTFS_MOUNT, else %s)\n"
		   "  -h, --help              show this help\n"
		   "\nexit status: 0 success, 1 the operation failed, 2 usage error\n",
		CONFIG_DEFAULT_MOUNTPOINT);
}

/* An operation failed: one line on stderr, exit status 1. */
int ctl_fail(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fputs(PROG ": ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	return 1;
}

/* The command line is wrong: the reason, then the usage, exit status 2. */
int ctl_bad_usage(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fputs(PROG ": ", stderr);
	vfprintf(stderr, fmt, ap);
	fputs("\n\n", stderr);
	va_end(ap);
	ctl_usage(stderr);
	return EXIT_USAGE;
}

/* Text from the daemon or from stdin, made safe for a terminal: anything
 * but printable ASCII becomes '?' (no escape sequences, C1 controls
 * included), and at most max bytes are kept ("..." marks a cut). */
const char *ctl_printable(const char *s, char *buf, size_t size, size_t max)
{
	size_t n = 0;

	for (; *s && n + 4 < size && n < max; s++)
		buf[n++] = (*s >= 0x20 && *s < 0x7f) ? *s : '?';
	if (*s && n + 4 <= size) {
		memcpy(buf + n, "...", 3);
		n += 3;
	}
	buf[n] = '\0';
	return buf;
}

/* The option getopt stopped at: "-x" for a short one, else the word. */
const char *ctl_bad_option(char **argv, char *buf, size_t size)
{
	if (optopt > 0 && optopt < 0x7f && optopt >= 0x21) {
		snprintf(buf, size, "-%c", optopt);
		return buf;
	}
	return ctl_printable(argv[optind - 1], buf, size, 40);
}

/* ---- dispatch ------------------------------------------------------------------ */

/* One entry and one function per command. */
static const struct command commands[] = {
	{ "status", "[--timeout SECONDS]",
	  "the mount, its store and capacity, and one line per weight version (waiting at most\n"
	  "      --timeout seconds, default 5, for a mount whose daemon does not answer)",
	  cmd_status },
	{ "materialize", "<wv> [--token-end N] [--block-size N] < hashes > out.npy",
	  "one request's R3 array as .npy, from its block hashes on stdin (one a line)",
	  cmd_materialize },
	{ "load", "<wv> <checkpoint-dir> [--gpus 0,1,...] [--no-wait]",
	  "load a safetensors checkpoint into GPU memory as <wv>/weights, with a progress bar",
	  cmd_load },
	{ "unload", "<wv>",
	  "remove <wv>/weights; GPU memory is freed when the last attached engine closes",
	  cmd_unload },
	{ "upgrade", "",
	  "the artfs binary now on disk takes the mount over; no client sees an error",
	  cmd_upgrade },
	{ "cache", "[--timeout SECONDS]",
	  "the write-once tree .cache/: files and bytes per top-level directory, then the\n"
	  "      cache's hits, misses, evictions, bytes and capacity",
	  cmd_cache },
	/* A usage line of its own; the first word finds cmd_cache above. */
	{ "cache env", "[--shell]",
	  "the environment lines that point torch.compile, Triton, vLLM, DeepGEMM and CUDA's\n"
	  "      JIT at .cache/ (--shell: as export lines for sh)",
	  cmd_cache },
};

static const struct command *commands_list(size_t *n)
{
	*n = sizeof(commands) / sizeof(commands[0]);
	return commands;
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "mount", required_argument, NULL, 'm' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *env = getenv("ARTFS_MOUNT");
	struct ctl ctl = { .mnt = env && *env ? env : CONFIG_DEFAULT_MOUNTPOINT };
	char o[64];
	int opt;

	opterr = 0;
	while ((opt = getopt_long(argc, argv, "+:m:h", longopts, NULL)) != -1) {
		switch (opt) {
		case 'm': ctl.mnt = optarg; break;
		case 'h': ctl_usage(stdout); return 0;
		case ':': return ctl_bad_usage("%s needs a value", ctl_bad_option(argv, o, sizeof(o)));
		default: return ctl_bad_usage("unknown option %s", ctl_bad_option(argv, o, sizeof(o)));
		}
	}
	if (optind >= argc)
		return ctl_bad_usage("no command given");
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		if (strcmp(argv[optind], commands[i].name) == 0)
			return commands[i].run(&ctl, argc - optind, argv + optind);
	char safe[64];
	return ctl_bad_usage("unknown command \"%s\"",
			     ctl_printable(argv[optind], safe, sizeof(safe), 40));
}
