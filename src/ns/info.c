/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <string.h>

#include "ns/info.h"
#include "remote/remote.h"
#include "state/text.h"
#include "trees/wtree.h"

static const char *const names[INFO_COUNT] = {
	[INFO_METRICS] = "metrics",
	[INFO_CONFIG] = "config",
	[INFO_CONTROL] = "control",
};

const char *info_file_name(enum info_file f)
{
	return (unsigned)f < INFO_COUNT ? names[f] : NULL;
}

struct version_sample {
	struct metrics_gauges *g;
	int64_t now;
	size_t cap;
};

static void sample_version(void *ctx, struct version *v)
{
	struct version_sample *s = ctx;
	struct metrics_gauges *g = s->g;

	if (g->nper_version == s->cap)
		return;
	struct metrics_version *mv = &g->per_version[g->nper_version++];
	snprintf(mv->name, sizeof(mv->name), "%s", v->name);
	mv->objects = v->objects.count;
	mv->bytes = v->bytes;
	mv->idle = s->now - atomic_load(&v->last_active);
	mv->open_files = v->open_files;
}

static char *render_metrics(struct tree *t)
{
	struct metrics_gauges g = { 0 };
	struct version_sample s = { .g = &g, .now = clock_now() };

	pthread_mutex_lock(&t->lock);
	s.cap = t->idx.versions.count;
	g.per_version = calloc(s.cap ? s.cap : 1, sizeof(*g.per_version));
	if (g.per_version)
		index_each_version(&t->idx, sample_version, &s);
	g.objects = t->objects;
	g.versions = t->idx.versions.count;
	g.bytes_used = t->bytes_used;
	g.bytes_reserved = t->bytes_reserved;
	g.publishing = t->publishing;
	g.materialize_held = atomic_load(&t->materialize_held);
	g.materialize_max = t->cfg->materialize_max;
	g.sizing = t->sizing;
	pthread_mutex_unlock(&t->lock);
	g.capacity = t->cfg->capacity;
	g.max_object = t->cfg->max_object;
	g.started = (uint64_t)t->started;
	g.daemon_pid = (uint64_t)getpid();
	g.daemon_generation = atomic_load(&t->held.hdr->generation);
	if (t->cache)
		wtree_gauges(t->cache, &g.cache_bytes, &g.cache_files, &g.cache_capacity);
	if (t->blocks)
		wtree_gauges(t->blocks, &g.blocks_bytes, &g.blocks_files, &g.blocks_capacity);
	char *text = metrics_render(&t->metrics, &g);
	free(g.per_version);
	if (!text || !t->remote)
		return text;
	/* The cluster client's own counters and latency histogram follow. */
	char *all = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&all, &len);
	if (!f)
		return text;
	fputs(text, f);
	remote_metrics_render(t->remote, f);
	free(text);
	if (fclose(f) != 0) {
		free(all);
		return NULL;
	}
	return all;
}

int info_open(struct tree *t, enum info_file f, struct handle **h, struct open_reply *r)
{
	char *text = f == INFO_METRICS ? render_metrics(t) : config_render(t->cfg);

	if (!text)
		return -ENOMEM;
	/* Generated on open, so its size is unknown to stat: read like /proc. */
	r->direct_io = true;
	return text_open(text, h, r);
}
