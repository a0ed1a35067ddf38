/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/log.h"
#include "lib/reason.h"
#include "ns/control.h"
#include "weights/weights.h"

struct control {
	struct handle h;
	pthread_mutex_t mu;
	char line[CONTROL_LINE_MAX];
	size_t len;
};

static const struct handle_ops control_ops;

int control_open(struct tree *t, struct handle **h, struct open_reply *r)
{
	struct control *c = calloc(1, sizeof(*c));

	if (!c)
		return -ENOMEM;
	handle_init(&c->h, &control_ops);
	pthread_mutex_init(&c->mu, NULL);
	r->direct_io = true;
	*h = &c->h;
	return 0;
}

/* Splits a line into at most max words on spaces and tabs. */
static int words(char *line, char **w, int max)
{
	int n = 0;
	char *save;

	for (char *p = strtok_r(line, " \t\r", &save); p; p = strtok_r(NULL, " \t\r", &save)) {
		if (n == max)
			return -1;
		w[n++] = p;
	}
	return n;
}

int control_parse(char *line, struct control_cmd *cmd, char *err, size_t errlen)
{
	char *w[4];
	int n = words(line, w, 4);

	memset(cmd, 0, sizeof(*cmd));
	if (n == 0)
		return 0;
	if (n >= 3 && n <= 4 && strcmp(w[0], "load") == 0) {
		cmd->gpus = "";
		if (n == 4) {
			if (strncmp(w[3], "gpus=", 5) != 0)
				return reason(-EINVAL, err, errlen, "load takes gpus=<list> after the directory");
			cmd->gpus = w[3] + 5;
		}
		cmd->op = CONTROL_LOAD;
		cmd->wv = w[1];
		cmd->dir = w[2];
		return 0;
	}
	if (n == 2 && strcmp(w[0], "unload") == 0) {
		cmd->op = CONTROL_UNLOAD;
		cmd->wv = w[1];
		return 0;
	}
	if (n == 1 && strcmp(w[0], "upgrade") == 0) {
		cmd->op = CONTROL_UPGRADE;
		return 0;
	}
	return reason(-EINVAL, err, errlen, "unknown command");
}

static int run(struct tree *t, char *line)
{
	char copy[CONTROL_LINE_MAX], why[96];
	struct control_cmd cmd;

	snprintf(copy, sizeof(copy), "%s", line);
	if (control_parse(copy, &cmd, why, sizeof(why)) < 0) {
		log_warn("control: %s: \"%.200s\" (load <wv> <dir> [gpus=0,1,...] | unload <wv> | "
			 "upgrade)", why, line);
		return -EINVAL;
	}
	switch (cmd.op) {
	case CONTROL_LOAD:
		return weights_load(t, cmd.wv, cmd.dir, cmd.gpus);
	case CONTROL_UNLOAD:
		return weights_unload(t, cmd.wv);
	case CONTROL_UPGRADE:
		/* The holder starts the binary on disk beside this daemon. */
		return t->upgrade ? t->upgrade(t->upgrade_ctx) : -EOPNOTSUPP;
	default:
		return 0;
	}
}

static int control_write(struct tree *t, struct handle *h, uint64_t off, const void *buf,
			 size_t len, uint64_t owner)
{
	struct control *c = (struct control *)h;
	const char *p = buf;
	int rc = 0;

	(void)off, (void)owner;
	pthread_mutex_lock(&c->mu);
	for (size_t i = 0; i < len && rc == 0; i++) {
		if (p[i] == '\n') {
			c->line[c->len] = '\0';
			c->len = 0;
			rc = run(t, c->line);
		} else if (c->len == CONTROL_LINE_MAX - 1 || p[i] == '\0') {
			c->len = 0;
			log_warn("control: command too long or with a NUL byte");
			rc = -EINVAL;
		} else
			c->line[c->len++] = p[i];
	}
	pthread_mutex_unlock(&c->mu);
	return rc < 0 ? rc : (int)len;
}

static int control_flush(struct tree *t, struct handle *h, uint64_t owner)
{
	struct control *c = (struct control *)h;
	int rc = 0;

	(void)owner;
	pthread_mutex_lock(&c->mu);
	if (c->len) {
		c->line[c->len] = '\0';
		c->len = 0;
		rc = run(t, c->line);
	}
	pthread_mutex_unlock(&c->mu);
	return rc;
}

static void control_release(struct tree *t, struct handle *h)
{
	struct control *c = (struct control *)h;

	(void)t;
	pthread_mutex_destroy(&c->mu);
	free(c);
}

/* Commands load and unload weights: never on the thread reading requests. */
static bool never_quick(struct tree *t, struct handle *h)
{
	(void)t, (void)h;
	return false;
}

static bool write_never_quick(struct tree *t, struct handle *h, size_t len)
{
	(void)len;
	return never_quick(t, h);
}

static const struct handle_ops control_ops = {
	.kind = "control",
	.held_kind = HANDLE_CONTROL,
	.write = control_write,
	.flush = control_flush,
	.release = control_release,
	.write_quick = write_never_quick,
	.flush_quick = never_quick,
};
