/* SPDX-License-Identifier: Apache-2.0 */
/* artfsctl materialize: one <wv>/.materialize transaction, its block
 * hashes read from stdin (each checked before it is sent), its .npy
 * copied to stdout, and what a failure of it means. */
#include "autoconf.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cmd/artfsctl/artfsctl_i.h"
#include "format/key.h"
#include "state/config.h"

#define COPY_CHUNK (1u << 20)

struct buffer {
	char *data;
	size_t len, cap;
};

static bool buffer_add(struct buffer *b, const char *s, size_t n)
{
	if (n == 0)
		return true;
	if (b->cap - b->len < n) {
		size_t cap = b->cap ? b->cap : 4096;
		while (cap - b->len < n)
			cap *= 2;
		char *grown = realloc(b->data, cap);
		if (!grown)
			return false;
		b->data = grown;
		b->cap = cap;
	}
	memcpy(b->data + b->len, s, n);
	b->len += n;
	return true;
}

enum line_status { LINE_OK, LINE_EOF, LINE_LONG, LINE_NUL, LINE_ERROR };

/* One line of stdin into buf (size bytes), without its newline. */
static enum line_status read_line(FILE *f, char *buf, size_t size)
{
	size_t n = 0;
	int ch;

	while ((ch = getc(f)) != EOF && ch != '\n') {
		if (ch == '\0')
			return LINE_NUL;
		if (n + 1 >= size)
			return LINE_LONG;
		buf[n++] = (char)ch;
	}
	if (ch == EOF && ferror(f))
		return LINE_ERROR;
	if (ch == EOF && n == 0)
		return LINE_EOF;
	buf[n] = '\0';
	return LINE_OK;
}

/* Appends the block hashes of stdin, one a line, to the request. Returns 0,
 * or the exit status after saying what was wrong. */
static int read_hashes(struct buffer *req)
{
	char line[ARTFS_HASH_HEX_MAX + 64], safe[64];
	uint8_t bytes[ARTFS_HASH_BYTES_MAX];
	size_t lineno = 0, count = 0, len;

	for (;;) {
		enum line_status st = read_line(stdin, line, sizeof(line));
		lineno++;
		if (st == LINE_EOF)
			break;
		if (st == LINE_ERROR)
			return ctl_fail("reading the block hashes from stdin: %s", strerror(errno));
		if (st == LINE_LONG || st == LINE_NUL) {
			fprintf(stderr, PROG ": stdin line %zu: %s; expected one block hash a line "
				"(2 to 128 lowercase hex digits, even length)\n",
				lineno, st == LINE_LONG ? "too long" : "NUL byte");
			return EXIT_USAGE;
		}
		char *h = config_trim(line);
		if (*h == '\0')
			continue;
		if (key_hash_decode(h, bytes, &len) < 0) {
			fprintf(stderr, PROG ": stdin line %zu: \"%s\" is not a block hash "
				"(2 to 128 lowercase hex digits, even length)\n",
				lineno, ctl_printable(h, safe, sizeof(safe), 40));
			return EXIT_USAGE;
		}
		if (!buffer_add(req, h, strlen(h)) || !buffer_add(req, "\n", 1))
			return ctl_fail("reading the block hashes from stdin: %s", strerror(ENOMEM));
		count++;
	}
	if (count == 0) {
		fprintf(stderr, PROG ": no block hashes on stdin (one a line, in token order)\n");
		return EXIT_USAGE;
	}
	return 0;
}

/* What a failed read of .materialize means (DESIGN.md §3.4). */
static const char *materialize_error(int err)
{
	switch (err) {
	case ENOENT: return "an object of the request does not exist";
	case EIO: return "an object failed verification";
	case EBADMSG: return "the objects do not form the request (see the daemon log)";
	case EINVAL: return "malformed request";
	default: return "reading the result failed";
	}
}

/* Reads the result from offset 0 to EOF onto stdout. */
static int materialize_copy(int fd, const char *wv)
{
	char *buf = malloc(COPY_CHUNK);
	uint64_t off = 0;
	int rc = 0;

	if (!buf)
		return ctl_fail("materialize %s: %s", wv, strerror(ENOMEM));
	for (;;) {
		ssize_t r = pread(fd, buf, COPY_CHUNK, (off_t)off);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			int err = errno;
			rc = ctl_fail("materialize %s: %s (%s)%s", wv, materialize_error(err),
				  strerror(err), off ? "; the output is incomplete" : "");
			break;
		}
		if (r == 0)
			break;
		int w = ctl_write_all(STDOUT_FILENO, buf, (size_t)r);
		if (w < 0) {
			rc = ctl_fail("materialize %s: writing to stdout: %s", wv, strerror(-w));
			break;
		}
		off += (uint64_t)r;
	}
	free(buf);
	return rc;
}

struct materialize_args {
	uint64_t token_end, block_size;   /* 0: not given */
	const char *wv;
	bool helped;                      /* --help: the usage is printed, nothing else */
};

/* The options and the weight version of the command line. Returns 0, or
 * the exit status after saying what was wrong. */
static int materialize_read_args(struct ctl *ctl, int argc, char **argv, struct materialize_args *a)
{
	enum { OPT_TOKEN_END = 256, OPT_BLOCK_SIZE };
	static const struct option longopts[] = {
		{ "token-end", required_argument, NULL, OPT_TOKEN_END },
		{ "block-size", required_argument, NULL, OPT_BLOCK_SIZE },
		{ "mount", required_argument, NULL, 'm' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	char o[64];
	int opt;

	optind = 0;
	while ((opt = getopt_long(argc, argv, ":m:h", longopts, NULL)) != -1) {
		switch (opt) {
		case OPT_TOKEN_END:
		case OPT_BLOCK_SIZE:
			if (!ctl_parse_positive(optarg, opt == OPT_TOKEN_END ? &a->token_end : &a->block_size))
				return ctl_bad_usage("materialize: %s needs a positive integer, not \"%s\"",
						 opt == OPT_TOKEN_END ? "--token-end" : "--block-size",
						 optarg);
			break;
		case 'm': ctl->mnt = optarg; break;
		case 'h': ctl_usage(stdout); a->helped = true; return 0;
		case ':':
			return ctl_bad_usage("materialize: %s needs a value", ctl_bad_option(argv, o, sizeof(o)));
		default:
			return ctl_bad_usage("materialize: unknown option %s", ctl_bad_option(argv, o, sizeof(o)));
		}
	}
	if (optind >= argc)
		return ctl_bad_usage("materialize: which weight version?");
	if (optind + 1 < argc)
		return ctl_bad_usage("materialize: unexpected argument \"%s\"", argv[optind + 1]);
	a->wv = argv[optind];
	if (!key_version_name_valid(a->wv)) {
		char safe[160];
		return ctl_bad_usage("materialize: \"%s\" is not a weight version name",
				 ctl_printable(a->wv, safe, sizeof(safe), 140));
	}
	return 0;
}

/* The request's text: its token_end and block_size lines, then the block
 * hashes of stdin. Returns 0, or the exit status after saying why not. */
static int materialize_request(const struct materialize_args *a, struct buffer *req)
{
	char head[64];
	int n = 0;

	if (a->token_end)
		n += snprintf(head + n, sizeof(head) - (size_t)n, "token_end %" PRIu64 "\n",
			      a->token_end);
	if (a->block_size)
		n += snprintf(head + n, sizeof(head) - (size_t)n, "block_size %" PRIu64 "\n",
			      a->block_size);
	if (!buffer_add(req, head, (size_t)n))
		return ctl_fail("materialize %s: %s", a->wv, strerror(ENOMEM));
	return read_hashes(req);
}

/* Why <wv>/.materialize did not open: a version the mount lacks, or the
 * error at path. Returns the exit status. */
static int materialize_open_failed(const struct ctl *ctl, const char *wv, const char *path,
				   int err)
{
	struct stat st;

	if (err == ENOENT && stat(ctl->mnt, &st) == 0)
		return ctl_fail("materialize %s: no weight version \"%s\" in %s (%s)", wv, wv, ctl->mnt,
			    strerror(err));
	return ctl_fail("materialize %s: opening %s: %s", wv, path, strerror(err));
}

/* The request written to <wv>/.materialize, its result read back onto
 * stdout. Returns 0 or the exit status. */
static int materialize_run(const struct ctl *ctl, const char *wv, const struct buffer *req)
{
	char rel[ARTFS_VERSION_NAME_MAX + 16];
	snprintf(rel, sizeof(rel), "%s/.materialize", wv);
	char *path = ctl_path_in(ctl->mnt, rel);
	if (!path)
		return ctl_fail("materialize %s: %s", wv, strerror(ENOMEM));
	int rc;
	int fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		rc = materialize_open_failed(ctl, wv, path, errno);
		free(path);
		return rc;
	}
	int w = ctl_write_all(fd, req->data, req->len);
	if (w < 0)
		rc = ctl_fail("materialize %s: writing the request to %s: %s%s", wv, path, strerror(-w),
			  w == -EFBIG ? " (more than the daemon accepts in one request)" : "");
	else
		rc = materialize_copy(fd, wv);
	close(fd);
	free(path);
	return rc;
}

int cmd_materialize(struct ctl *ctl, int argc, char **argv)
{
	struct materialize_args a = { 0 };
	int rc = materialize_read_args(ctl, argc, argv, &a);

	if (rc || a.helped)
		return rc;
	if (isatty(STDOUT_FILENO))
		return ctl_fail("materialize %s: stdout is a terminal; redirect the .npy to a file or "
			    "a pipe", a.wv);
	if ((rc = ctl_mount_check(ctl)))
		return rc;
	struct buffer req = { 0 };
	rc = materialize_request(&a, &req);
	if (rc == 0)
		rc = materialize_run(ctl, a.wv, &req);
	free(req.data);
	return rc;
}
