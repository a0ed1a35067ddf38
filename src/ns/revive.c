/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lib/log.h"
#include "ns/node_ops.h"
#include "ns/revive.h"
#include "r3/object.h"
#include "state/ids.h"

/* ---- nodes --------------------------------------------------------------------------- */

/* The version a record names, referenced; NULL when there is none. */
static struct version *record_version(struct tree *t, const struct held_node *r)
{
	char name[HELD_NAME_MAX + 1];

	memcpy(name, r->name, r->name_len);
	name[r->name_len] = '\0';
	return version_find(t, name);
}

/* A version's part n (.materialize, .put), referenced in place of v. */
static struct node *part_of(struct version *v, struct node *n)
{
	node_ref(n); /* the part's reference; the version's goes */
	node_unref(&v->node, 1);
	return n;
}

/* ---- each kind of node found again (the table: node_ops.c) ------------- */

struct node *revive_version(struct tree *t, const struct held_node *r)
{
	struct version *v = record_version(t, r);

	return v ? &v->node : NULL;
}

struct node *revive_materialize(struct tree *t, const struct held_node *r)
{
	struct version *v = record_version(t, r);

	return v ? part_of(v, &v->materialize) : NULL;
}

struct node *revive_put(struct tree *t, const struct held_node *r)
{
	struct version *v = record_version(t, r);

	return v ? part_of(v, &v->put) : NULL;
}

/* An object by its name (NODE_OBJECT) or by its key (NODE_KEY). */
struct node *revive_object(struct tree *t, const struct held_node *r)
{
	if (r->hash_len == 0 || r->hash_len > sizeof(r->hash))
		return NULL;
	struct version *v = record_version(t, r);
	if (!v)
		return NULL;
	/* The committed object; else (a writer's own inode, whose publish
	 * died or starts again) a fresh node of that name. A create's node
	 * is the one its commit indexes, so a node described while
	 * publishing may be committed by now. */
	struct object *o = version_object_find(t, v, r->hash, r->hash_len);
	if (!o && r->sub)
		o = object_new(v, r->hash, r->hash_len);
	struct node *n = NULL;
	if (o && atomic_load(&r->type) == NODE_KEY) {
		node_ref(&o->keynode);
		node_unref(&o->node, 1);
		n = &o->keynode;
	} else if (o) {
		n = &o->node;
	}
	node_unref(&v->node, 1); /* n keeps the reference it was found with */
	return n;
}

/* ---- the node of an id ------------------------------------------------------ */

struct node *revive_node(struct tree *t, uint64_t id)
{
	const struct held_node *r = ids_node_record(t, id);

	if (!r)
		return &t->stale;
	/* Kinds without revive (the fixed nodes) are not found again. */
	const struct node_ops *ops = node_ops_of(atomic_load(&r->type));
	struct node *n = ops->revive ? ops->revive(t, r) : NULL;
	if (!n)
		return ids_node_install(t, id, &t->stale);
	struct node *mapped = ids_node_install(t, id, n);
	node_unref(n, 1);
	return mapped;
}

struct dir_count {
	struct tree *t;
	size_t found, gone;
};

static void revive_directory(uint64_t id, uint8_t type, void *ctx)
{
	struct dir_count *c = ctx;
	const struct node_ops *ops = node_ops_of(type);

	/* a directory (it has lookup) that can be found again */
	if (ops->lookup && ops->revive && !ids_node(c->t, id)) {
		if (revive_node(c->t, id) == &c->t->stale)
			c->gone++;
		else
			c->found++;
	}
}

void revive_directories(struct tree *t)
{
	struct dir_count c = { .t = t };
	struct timespec t0, t1;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	held_nodes_taken_over_each(&t->held, revive_directory, &c);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	if (c.found + c.gone)
		log_info("takeover: %zu directories the kernel holds found again, %zu gone, in %.1f ms",
			 c.found, c.gone, (double)(t1.tv_sec - t0.tv_sec) * 1e3 +
			 (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
}

/* ---- handles that fail, or say what was decided ---------------------------------------- */

struct remnant {
	struct handle h;
	int result;   /* flush and fsync */
};

static int eio_read(struct tree *t, struct handle *h, uint64_t off, size_t size,
		    const void **data, size_t *len)
{
	return -EIO;
}

static int eio_write(struct tree *t, struct handle *h, uint64_t off, const void *buf, size_t len,
		     uint64_t owner)
{
	return -EIO;
}

static int result_flush(struct tree *t, struct handle *h, uint64_t owner)
{
	return ((struct remnant *)h)->result;
}

static int result_fsync(struct tree *t, struct handle *h)
{
	return ((struct remnant *)h)->result;
}

static int eio_ioctl(struct tree *t, struct handle *h, unsigned int cmd, const void *in,
		     size_t in_len, void *out, size_t out_len)
{
	return -EIO;
}

static int eio_readdir(struct tree *t, struct handle *h, size_t i, struct dir_entry *de)
{
	return -EIO;
}

static void remnant_release(struct tree *t, struct handle *h)
{
	free(h);
}

#define REMNANT_OPS(k)                                                                   \
	{ .kind = "remnant", .read = eio_read, .write = eio_write, .flush = result_flush, \
	  .fsync = result_fsync, .ioctl = eio_ioctl, .readdir = eio_readdir,              \
	  .release = remnant_release, .held_kind = k }

static const struct handle_ops remnant_ops[HANDLE_KINDS] = {
	[HANDLE_OBJECT] = REMNANT_OPS(HANDLE_OBJECT),
	[HANDLE_KEY] = REMNANT_OPS(HANDLE_KEY),
	[HANDLE_LISTING] = REMNANT_OPS(HANDLE_LISTING),
	[HANDLE_INFO] = REMNANT_OPS(HANDLE_INFO),
	[HANDLE_CONTROL] = REMNANT_OPS(HANDLE_CONTROL),
	[HANDLE_MATERIALIZE] = REMNANT_OPS(HANDLE_MATERIALIZE),
	[HANDLE_GET] = REMNANT_OPS(HANDLE_GET),
	[HANDLE_PUT] = REMNANT_OPS(HANDLE_PUT),
	[HANDLE_PUBLISH] = REMNANT_OPS(HANDLE_PUBLISH),
	[HANDLE_WEIGHTS_FILE] = REMNANT_OPS(HANDLE_WEIGHTS_FILE),
	[HANDLE_RANK] = REMNANT_OPS(HANDLE_RANK),
	[HANDLE_WEIGHTS_PUBLISH] = REMNANT_OPS(HANDLE_WEIGHTS_PUBLISH),
	[HANDLE_CACHE_READ] = REMNANT_OPS(HANDLE_CACHE_READ),
	[HANDLE_CACHE_WRITE] = REMNANT_OPS(HANDLE_CACHE_WRITE),
	[HANDLE_BLOCKS_PUT] = REMNANT_OPS(HANDLE_BLOCKS_PUT),
	[HANDLE_BLOCKS_GET] = REMNANT_OPS(HANDLE_BLOCKS_GET),
};

static struct handle *remnant(enum handle_kind kind, int result)
{
	struct remnant *r = calloc(1, sizeof(*r));

	if (!r)
		return NULL;
	if (kind <= 0 || kind >= HANDLE_KINDS)
		kind = HANDLE_PUBLISH;
	handle_init(&r->h, &remnant_ops[kind]);
	r->result = result;
	return &r->h;
}

struct handle *revive_dead(struct tree *t, enum handle_kind kind)
{
	(void)t;
	return remnant(kind, -EIO);
}

struct handle *revive_finished(struct tree *t, int result)
{
	(void)t;
	return remnant(HANDLE_PUBLISH, result);
}

int revive_commit_outcome(struct tree *t, const struct held_handle *rec)
{
	const struct held_node *r = ids_node_record(t, rec->node);
	struct envelope env;

	if (!r || !r->hash_len || r->hash_len > sizeof(r->hash))
		return -EIO;
	struct version *v = record_version(t, r);
	if (!v)
		return -EIO;
	int rc = object_read_meta(t, v, r->hash, r->hash_len, &env);
	node_unref(&v->node, 1);
	if (rc < 0)
		return -EIO; /* nothing of the key: it did not commit */
	return memcmp(env.payload_sha256, rec->sha, 32) == 0 ? 0 : -EEXIST;
}
