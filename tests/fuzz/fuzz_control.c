/* SPDX-License-Identifier: Apache-2.0 */
/* .artfs/control lines: control_parse (pure), compared with a plain
 * reading of the grammar
 *     load <wv> <checkpoint-dir> [gpus=<list>]
 *     unload <wv>
 * and the same bytes written through control_write/control_flush of an
 * open control file of a tree in this process's scratch directory, so that
 * line splitting, NUL bytes, over-long lines and what a command does with
 * its words (weights_load's name, directory and GPU list checks, then
 * ENODEV in this build without CUDA; weights_unload) are fuzzed too. */
#include "autoconf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>

#include "fuzz.h"
#include "ns/control.h"
#include "ns/tree.h"

static struct artfs_config cfg;
static struct tree tree;
static bool tree_up;

static void close_tree(void)
{
	if (tree_up)
		tree_close(&tree);
	config_free(&cfg);
}

static struct tree *get_tree(void)
{
	char err[256], store[300];

	if (tree_up)
		return &tree;
	snprintf(store, sizeof(store), "%s/store", fz_scratch());
	config_init(&cfg);
	free(cfg.store);
	cfg.store = strdup(store);
	int rc = tree_open(&tree, &cfg, err, sizeof(err));
	if (rc < 0) {
		fprintf(stderr, "fuzz: tree_open %s: %s\n", store, err);
		abort();
	}
	tree_up = true;
	atexit(close_tree);
	return &tree;
}

static void check_line(const char *text, size_t len)
{
	char *line = malloc(len + 1), *copy = malloc(len + 1);
	char *w[5];
	int n = 0;
	struct control_cmd cmd;
	char err[128];

	memcpy(line, text, len);
	line[len] = '\0';
	memcpy(copy, line, len + 1);
	/* The grammar, read plainly over a second copy. */
	for (char *p = copy; *p && n < 5;) {
		p += strspn(p, " \t\r");
		if (!*p)
			break;
		w[n++] = p;
		p += strcspn(p, " \t\r");
		if (*p)
			*p++ = '\0';
	}
	enum control_op want;
	if (n == 0)
		want = CONTROL_NONE;
	else if (n >= 3 && n <= 4 && strcmp(w[0], "load") == 0 &&
		 (n == 3 || strncmp(w[3], "gpus=", 5) == 0))
		want = CONTROL_LOAD;
	else if (n == 2 && strcmp(w[0], "unload") == 0)
		want = CONTROL_UNLOAD;
	else if (n == 1 && strcmp(w[0], "upgrade") == 0)
		want = CONTROL_UPGRADE;
	else
		want = (enum control_op)-1;

	err[0] = '\0';
	int rc = control_parse(line, &cmd, err, sizeof(err));
	if (want == (enum control_op)-1) {
		FZ_CHECK(rc == -EINVAL && err[0] != '\0');
	} else {
		FZ_CHECK(rc == 0 && cmd.op == want);
		if (want != CONTROL_NONE && want != CONTROL_UPGRADE) {
			FZ_CHECK(cmd.wv >= line && cmd.wv < line + len && strcmp(cmd.wv, w[1]) == 0);
		}
		if (want == CONTROL_LOAD) {
			FZ_CHECK(cmd.dir >= line && cmd.dir < line + len && strcmp(cmd.dir, w[2]) == 0);
			FZ_CHECK(strcmp(cmd.gpus, n == 4 ? w[3] + 5 : "") == 0);
		}
	}
	free(line);
	free(copy);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fuzz_in in = { data, size };
	const char *text = (const char *)data;

	/* Every line, as control_write would cut them (at most
	 * CONTROL_LINE_MAX - 1 bytes, no NUL). */
	for (size_t pos = 0; pos < size;) {
		const char *nl = memchr(text + pos, '\n', size - pos);
		size_t end = nl ? (size_t)(nl - text) : size;
		size_t len = end - pos;
		if (len < CONTROL_LINE_MAX && !memchr(text + pos, '\0', len))
			check_line(text + pos, len);
		pos = end + 1;
	}

	/* The bytes through an open control file, in writes of sizes from the
	 * input's own first bytes. */
	struct tree *t = get_tree();
	struct handle *h;
	struct open_reply r = { 0 };
	FZ_CHECK(tree_open_file(t, &t->info_files[INFO_CONTROL], O_WRONLY, &h, &r) == 0);
	uint8_t step = fz_u8(&in);
	for (size_t pos = 0; pos < size;) {
		size_t n = step ? step : size;
		if (n > size - pos)
			n = size - pos;
		int rc = tree_write(t, h, pos, data + pos, n, 0);
		FZ_CHECK(rc == (int)n || rc == -EINVAL || rc == -ENODEV || rc == -ENOENT ||
			 rc == -EOPNOTSUPP);
		pos += n;
	}
	int rc = tree_flush(t, h, 0);
	FZ_CHECK(rc == 0 || rc == -EINVAL || rc == -ENODEV || rc == -ENOENT ||
			 rc == -EOPNOTSUPP /* upgrade: no holder */);
	tree_release(t, h);
	return 0;
}
