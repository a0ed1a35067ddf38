#include "autoconf.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "info.h"

struct text_handle {
	struct handle h;
	char *text;
	size_t len;
};

static const char *const names[INFO_COUNT] = {
	[INFO_METRICS] = "metrics",
	[INFO_CONFIG] = "config",
};

const char *info_file_name(enum info_file f)
{
	return (unsigned)f < INFO_COUNT ? names[f] : NULL;
}

static char *render_metrics(struct tree *t)
{
	struct metrics_gauges g;

	pthread_mutex_lock(&t->lock);
	g.objects = t->objects;
	g.versions = t->idx.versions.count;
	g.bytes_used = t->bytes_used;
	g.bytes_reserved = t->bytes_reserved;
	g.uploads = t->uploads;
	pthread_mutex_unlock(&t->lock);
	g.capacity = t->cfg->capacity;
	g.max_object = t->cfg->max_object;
	g.started = t->started;
	return metrics_render(&t->metrics, &g);
}

int info_open(struct tree *t, enum info_file f, struct handle **h, struct tree_open_reply *r)
{
	struct text_handle *th = calloc(1, sizeof(*th));

	if (!th)
		return -ENOMEM;
	handle_init(&th->h, HANDLE_TEXT);
	th->text = f == INFO_METRICS ? render_metrics(t) : config_render(t->cfg);
	if (!th->text) {
		free(th);
		return -ENOMEM;
	}
	th->len = strlen(th->text);
	/* Generated on open, so its size is unknown to stat: read like /proc. */
	r->direct_io = true;
	r->noflush = true;
	*h = &th->h;
	return 0;
}

int info_read(struct handle *h, uint64_t off, size_t size, const void **data, size_t *len)
{
	struct text_handle *th = (struct text_handle *)h;

	if (off >= th->len) {
		*data = th->text;
		*len = 0;
		return 0;
	}
	*data = th->text + off;
	*len = th->len - off < size ? th->len - (size_t)off : size;
	return 0;
}

void info_release(struct handle *h)
{
	struct text_handle *th = (struct text_handle *)h;

	free(th->text);
	free(th);
}
