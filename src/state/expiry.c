/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lib/log.h"
#include "state/expiry.h"

/* A collected version: its store directory, renamed into trash/, and the
 * name the kernel still has cached. */
struct doomed {
	struct doomed *next;
	uint64_t parent;       /* node id of the directory holding name */
	char trash[64];        /* "" when there is nothing to delete */
	char name[ARTFS_VERSION_NAME_MAX + 1];
};

struct expiry {
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool stop;
	bool running;
	struct doomed *queue;
	uint64_t seq;
};

static struct expiry *expiry_of(struct tree *t)
{
	return t->expiry;
}

struct candidates {
	struct version **v;
	size_t n, cap;
	int64_t now;
	uint64_t ttl;
};

static void consider(void *ctx, struct version *v)
{
	struct candidates *c = ctx;

	if (c->n == c->cap || v->open_files || v->publishing || v->weights)
		return;
	if (c->now - atomic_load(&v->last_active) < (int64_t)c->ttl)
		return;
	c->v[c->n++] = v;
}

uint64_t expiry_collect(struct tree *t)
{
	struct expiry *e = expiry_of(t);
	uint64_t ttl = t->cfg->ttl, freed = 0;

	if (!ttl || !e)
		return 0;
	pthread_mutex_lock(&t->lock);
	if (t->sizing) { /* a version's bytes are not known yet */
		pthread_mutex_unlock(&t->lock);
		return 0;
	}
	struct candidates c = { .now = clock_now(), .ttl = ttl, .cap = t->idx.versions.count };
	c.v = calloc(c.cap ? c.cap : 1, sizeof(*c.v));
	if (c.v)
		index_each_version(&t->idx, consider, &c);
	for (size_t i = 0; i < c.n; i++) {
		struct version *v = c.v[i];
		struct doomed *d = calloc(1, sizeof(*d));
		if (!d)
			break;
		pthread_mutex_lock(&e->mu);
		snprintf(d->trash, sizeof(d->trash), "%" PRIu64 ".%" PRId64, e->seq++, (int64_t)c.now);
		pthread_mutex_unlock(&e->mu);
		snprintf(d->name, sizeof(d->name), "%s", v->name);
		d->parent = 1;
		int rc = store_version_trash(&t->store, v->name, d->trash);
		if (rc < 0) {
			log_err("expire %s: cannot move it out of the store: %s", v->name, strerror(-rc));
			free(d);
			continue;
		}
		uint64_t objects = v->objects.count, bytes = v->bytes;
		int64_t idle = c.now - atomic_load(&v->last_active);
		t->objects -= objects;
		t->bytes_used -= bytes;
		freed += bytes;
		index_version_detach(&t->idx, v);
		counter_inc(&t->metrics.versions_collected);
		atomic_fetch_add(&t->metrics.objects_collected, objects);
		atomic_fetch_add(&t->metrics.bytes_collected, bytes);
		log_info("expire %s: idle %" PRId64 " s (ttl %" PRIu64 "), %" PRIu64 " objects, %"
			 PRIu64 " bytes collected", d->name, idle, ttl, objects, bytes);
		pthread_mutex_lock(&e->mu);
		d->next = e->queue;
		e->queue = d;
		pthread_cond_signal(&e->cv);
		pthread_mutex_unlock(&e->mu);
	}
	pthread_mutex_unlock(&t->lock);
	free(c.v);
	return freed;
}

void expiry_forget(struct tree *t, uint64_t parent, const char *name)
{
	struct expiry *e = expiry_of(t);
	struct doomed *d = e ? calloc(1, sizeof(*d)) : NULL;

	if (!d)
		return; /* no janitor (tests, shutdown): no kernel to tell */
	d->parent = parent;
	snprintf(d->name, sizeof(d->name), "%s", name);
	pthread_mutex_lock(&e->mu);
	d->next = e->queue;
	e->queue = d;
	pthread_cond_signal(&e->cv);
	pthread_mutex_unlock(&e->mu);
}

/* Deletes the files and has the kernel drop the cached names. */
static void bury(struct tree *t, struct doomed *d, bool notify)
{
	while (d) {
		struct doomed *next = d->next;
		/* The name first: a large version takes a while to delete. */
		if (notify && t->forget_entry)
			t->forget_entry(t->forget_ctx, d->parent, d->name);
		int rc = d->trash[0] ? store_trash_empty(&t->store, d->trash) : 0;
		if (rc < 0)
			log_warn("expire %s: deleting trash/%s: %s (retried at next start)", d->name,
				 d->trash, strerror(-rc));
		free(d);
		d = next;
	}
}

static void *janitor(void *arg)
{
	struct tree *t = arg;
	struct expiry *e = expiry_of(t);
	uint64_t ttl = t->cfg->ttl;
	/* Look about four times per ttl, between once a second and once a minute. */
	time_t period = ttl ? (time_t)(ttl / 4) : 60;
	if (period < 1)
		period = 1;
	if (period > 60)
		period = 60;

	pthread_mutex_lock(&e->mu);
	while (!e->stop) {
		struct doomed *q = e->queue;
		e->queue = NULL;
		pthread_mutex_unlock(&e->mu);
		if (q)
			bury(t, q, true);
		else
			expiry_collect(t);
		if (!q && t->collect_more)
			t->collect_more(t, clock_now());
		pthread_mutex_lock(&e->mu);
		if (!e->queue && !e->stop) {
			struct timespec until;
			clock_gettime(CLOCK_MONOTONIC, &until);
			until.tv_sec += period;
			pthread_cond_timedwait(&e->cv, &e->mu, &until);
		}
	}
	pthread_mutex_unlock(&e->mu);
	return NULL;
}

int expiry_start(struct tree *t)
{
	struct expiry *e = calloc(1, sizeof(*e));
	pthread_condattr_t ca;

	if (!e)
		return -ENOMEM;
	pthread_mutex_init(&e->mu, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&e->cv, &ca);
	pthread_condattr_destroy(&ca);
	t->expiry = e;
	int rc = pthread_create(&e->thread, NULL, janitor, t);
	if (rc) {
		t->expiry = NULL;
		pthread_cond_destroy(&e->cv);
		pthread_mutex_destroy(&e->mu);
		free(e);
		return -rc;
	}
	e->running = true;
	return 0;
}

bool expiry_stop(struct tree *t, int ms)
{
	struct expiry *e = expiry_of(t);

	if (!e)
		return true;
	pthread_mutex_lock(&e->mu);
	e->stop = true;
	pthread_cond_signal(&e->cv);
	pthread_mutex_unlock(&e->mu);
	if (e->running) {
		struct timespec until;
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_sec += ms / 1000;
		until.tv_nsec += (long)(ms % 1000) * 1000000;
		if (until.tv_nsec >= 1000000000) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000;
		}
		/* A collection's notice to the kernel can wait for a request
		 * that no thread serves any more. */
		if (ms >= 0 ? pthread_timedjoin_np(e->thread, NULL, &until) != 0
			    : pthread_join(e->thread, NULL) != 0)
			return false;
	}
	bury(t, e->queue, false);
	t->expiry = NULL;
	pthread_cond_destroy(&e->cv);
	pthread_mutex_destroy(&e->mu);
	free(e);
	return true;
}
