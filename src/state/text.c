/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "state/text.h"

struct text_handle {
	struct handle h;
	char *text;
	size_t len;
};

static int text_read(struct tree *t, struct handle *h, uint64_t off, size_t size,
		     const void **data, size_t *len)
{
	struct text_handle *th = (struct text_handle *)h;

	(void)t;
	buffer_slice(th->text, th->len, off, size, data, len);
	return 0;
}

static void text_release(struct tree *t, struct handle *h)
{
	struct text_handle *th = (struct text_handle *)h;

	(void)t;
	free(th->text);
	free(th);
}

static const struct handle_ops text_ops = {
	.kind = "text",
	.held_kind = HANDLE_INFO,
	.read = text_read,
	.release = text_release,
};

int text_open(char *text, struct handle **h, struct open_reply *r)
{
	struct text_handle *th = calloc(1, sizeof(*th));

	if (!th) {
		free(text);
		return -ENOMEM;
	}
	handle_init(&th->h, &text_ops);
	th->text = text;
	th->len = strlen(text);
	r->noflush = true;
	*h = &th->h;
	return 0;
}
