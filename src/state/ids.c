/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "lib/log.h"
#include "state/ids.h"

static void (*_Atomic weights_describe)(const struct node *n, struct held_node *d);

void ids_set_weights_describe(void (*fn)(const struct node *n, struct held_node *d))
{
	weights_describe = fn;
}

static void (*_Atomic trees_describe)(const struct node *n, struct held_node *d);

void ids_set_trees_describe(void (*fn)(const struct node *n, struct held_node *d))
{
	trees_describe = fn;
}

void ids_init(struct tree *t)
{
	atomic_store(&t->root.id, ID_ROOT);
	atomic_store(&t->info_dir.id, ID_INFO_DIR);
	for (int i = 0; i < INFO_COUNT; i++)
		atomic_store(&t->info_files[i].id, ID_INFO_FILE0 + (uint64_t)i);
	atomic_store(&t->keys_dir.id, ID_KEYS_DIR);
	atomic_store(&t->keys_put.id, ID_KEYS_PUT);
	atomic_store(&t->keys_get.id, ID_KEYS_GET);
	atomic_store(&t->attach_node.id, ID_ATTACH);
	atomic_store(&t->blocks_put.id, ID_BLOCKS_PUT);
	atomic_store(&t->blocks_get.id, ID_BLOCKS_GET);
	t->stale.type = NODE_STALE;
	t->handle_unbind = ids_handle_unbind;
	pthread_mutex_init(&t->ids_mu, NULL);
}

void ids_close(struct tree *t)
{
	for (size_t i = 0; i < HELD_NODES_MAX / IDS_PAGE; i++)
		free(atomic_load(&t->node_pages[i]));
	for (size_t i = 0; i < HELD_HANDLES_MAX / IDS_PAGE; i++)
		free(atomic_load(&t->handle_pages[i]));
	pthread_mutex_destroy(&t->ids_mu);
}

/* ---- the maps -------------------------------------------------------------------- */

/* The map's cell of slot, its page made when make (NULL: none, or out of
 * memory). Pages only appear, never go, until ids_close. */
static _Atomic(void *) *cell(_Atomic(void *) *_Atomic *pages, uint64_t slot, bool make)
{
	_Atomic(void *) *page = atomic_load_explicit(&pages[slot / IDS_PAGE], memory_order_acquire);

	if (!page && make) {
		_Atomic(void *) *fresh = calloc(IDS_PAGE, sizeof(*fresh));
		if (!fresh)
			return NULL;
		if (atomic_compare_exchange_strong(&pages[slot / IDS_PAGE], &page, fresh))
			page = fresh;
		else
			free(fresh); /* another thread's came first: page is it */
	}
	return page ? &page[slot % IDS_PAGE] : NULL;
}

static _Atomic(void *) *node_cell(struct tree *t, uint64_t id, bool make)
{
	return cell((_Atomic(void *) *_Atomic *)t->node_pages, id - HELD_NODE_BASE, make);
}

static _Atomic(void *) *handle_cell(struct tree *t, uint64_t fh, bool make)
{
	return cell((_Atomic(void *) *_Atomic *)t->handle_pages, held_handle_slot(fh), make);
}

/* ---- node ids ---------------------------------------------------------------------- */

static void describe_version(const struct version *v, struct held_node *d)
{
	size_t len = strlen(v->name);

	d->name_len = (uint8_t)(len > HELD_NAME_MAX ? HELD_NAME_MAX : len);
	memcpy(d->name, v->name, d->name_len);
	d->name[d->name_len] = '\0';
}

static const struct object *object_of(const struct node *n)
{
	if (n->type == NODE_KEY)
		return (const struct object *)((const char *)n - offsetof(struct object, keynode));
	return (const struct object *)n;
}

/* What n names, for the next daemon (src/ns/revive.c reads it). */
static void describe(const struct node *n, struct held_node *d)
{
	memset(d, 0, sizeof(*d));
	atomic_store(&d->type, n->type);
	d->sub = n->sub;
	switch (n->type) {
	case NODE_VERSION:
		describe_version((const struct version *)n, d);
		break;
	case NODE_MATERIALIZE:
	case NODE_PUT:
		describe_version((const struct version *)n->owner, d);
		break;
	case NODE_OBJECT:
	case NODE_KEY: {
		const struct object *o = object_of(n);
		describe_version(o->ver, d);
		d->hash_len = o->hash_len;
		memcpy(d->hash, o->hash, o->hash_len);
		if (o->keyed)
			memcpy(d->key, o->key, 32);
		d->sub = o->state == OBJECT_PUBLISHING; /* a writer's own inode */
		break;
	}
	case NODE_CACHE_DIR:
	case NODE_CACHE_FILE:
		if (trees_describe)
			trees_describe(n, d);
		break;
	default:
		if (weights_describe)
			weights_describe(n, d);
		break;
	}
}

uint64_t ids_node_ref(struct tree *t, struct node *n)
{
	uint64_t id;

	pthread_mutex_lock(&t->ids_mu);
	id = atomic_load(&n->id);
	if (id >= HELD_NODE_BASE) {
		struct held_node *r = held_node_get(&t->held, id);
		if (r)
			atomic_fetch_add(&r->nlookup, 1);
	} else if (!id) {
		struct held_node d;
		describe(n, &d);
		atomic_store(&d.nlookup, 1);
		id = held_node_alloc(&t->held, &d);
		_Atomic(void *) *c = id ? node_cell(t, id, true) : NULL;
		if (c) {
			atomic_store(c, n);
			atomic_store(&n->id, id);
		} else {
			if (id)
				held_node_forget(&t->held, id, 1);
			id = 0;
			log_err("no room for another node id (%u are held); a lookup fails",
				(unsigned)HELD_NODES_MAX);
		}
	}
	pthread_mutex_unlock(&t->ids_mu);
	return id;
}

void ids_node_redescribe(struct tree *t, struct node *n, const struct held_node *d)
{
	pthread_mutex_lock(&t->ids_mu);
	uint64_t id = atomic_load(&n->id);
	struct held_node *r = id >= HELD_NODE_BASE ? held_node_get(&t->held, id) : NULL;
	if (r) {
		r->sub = d->sub;
		r->hash_len = d->hash_len;
		r->name_len = d->name_len;
		r->rank = d->rank;
		memcpy(r->hash, d->hash, sizeof(r->hash));
		memcpy(r->key, d->key, sizeof(r->key));
		memcpy(r->name, d->name, sizeof(r->name));
	}
	pthread_mutex_unlock(&t->ids_mu);
}

uint64_t node_id(struct tree *t, struct node *n)
{
	uint64_t id = atomic_load(&n->id);

	(void)t;
	if (id)
		return id;
	/* Above every id a slot can have: never one the kernel holds. */
	uint64_t made = (uint64_t)(uintptr_t)n;
	return made | (1ull << 62);
}

struct node *ids_node(struct tree *t, uint64_t id)
{
	switch (id) {
	case ID_ROOT: return &t->root;
	case ID_INFO_DIR: return &t->info_dir;
	case ID_KEYS_DIR: return &t->keys_dir;
	case ID_KEYS_PUT: return &t->keys_put;
	case ID_KEYS_GET: return &t->keys_get;
	case ID_ATTACH: return &t->attach_node;
	case ID_BLOCKS_PUT: return &t->blocks_put;
	case ID_BLOCKS_GET: return &t->blocks_get;
	default: break;
	}
	if (id >= ID_INFO_FILE0 && id < ID_INFO_FILE0 + INFO_COUNT)
		return &t->info_files[id - ID_INFO_FILE0];
	if (id < HELD_NODE_BASE || id - HELD_NODE_BASE >= HELD_NODES_MAX)
		return NULL;
	_Atomic(void *) *c = node_cell(t, id, false);
	return c ? atomic_load_explicit(c, memory_order_acquire) : NULL;
}

const struct held_node *ids_node_record(struct tree *t, uint64_t id)
{
	return held_node_get(&t->held, id);
}

struct node *ids_node_install(struct tree *t, uint64_t id, struct node *n)
{
	pthread_mutex_lock(&t->ids_mu);
	_Atomic(void *) *c = node_cell(t, id, true);
	struct held_node *r = held_node_get(&t->held, id);
	struct node *had = c ? atomic_load(c) : NULL;
	if (!had && c && r) {
		node_ref_many(n, atomic_load(&r->nlookup));
		atomic_store_explicit(c, n, memory_order_release);
		uint64_t none = 0;
		if (n->type != NODE_STALE) /* else n keeps its own id */
			atomic_compare_exchange_strong(&n->id, &none, id);
		had = n;
	}
	pthread_mutex_unlock(&t->ids_mu);
	return had ? had : n;
}

void ids_node_forget(struct tree *t, uint64_t id, uint64_t nlookup)
{
	struct node *n = NULL;

	pthread_mutex_lock(&t->ids_mu);
	if (id >= HELD_NODE_BASE && id - HELD_NODE_BASE < HELD_NODES_MAX) {
		_Atomic(void *) *c = node_cell(t, id, false);
		n = c ? atomic_load(c) : NULL;
		if (held_node_forget(&t->held, id, nlookup) && c) {
			atomic_store(c, NULL);
			uint64_t mine = id;
			if (n)
				atomic_compare_exchange_strong(&n->id, &mine, 0);
		}
	} else
		n = ids_node(t, id); /* a fixed node */
	pthread_mutex_unlock(&t->ids_mu);
	if (n)
		node_unref(n, nlookup);
}

/* ---- the request a thread serves ------------------------------------------------- */

static _Thread_local uint64_t request_unique;
static _Thread_local bool request_resent;

void ids_request_note(uint64_t unique, bool resent)
{
	request_unique = unique & ~(1ull << 63);
	request_resent = resent;
}

uint64_t ids_request_unique(void)
{
	return request_unique;
}

bool ids_request_resent(void)
{
	return request_resent;
}

/* ---- file handles ------------------------------------------------------------------ */

uint64_t ids_handle_bind(struct tree *t, struct handle *h, uint64_t node)
{
	uint64_t fh = held_handle_alloc(&t->held, (uint8_t)h->ops->held_kind, node, 0);
	_Atomic(void *) *c = fh ? handle_cell(t, fh, true) : NULL;

	if (!c) {
		if (fh)
			held_handle_free(&t->held, fh);
		log_err("no room for another open file (%u are open)", (unsigned)HELD_HANDLES_MAX);
		return 0;
	}
	h->fh = fh;
	h->tree = t;
	atomic_store_explicit(c, h, memory_order_release);
	return fh;
}

struct handle *ids_handle(struct tree *t, uint64_t fh)
{
	/* Only a live record's fh: a stale one (its slot taken since) names
	 * nothing, whatever handle its slot's cell holds now. */
	if (!held_handle_get(&t->held, fh))
		return NULL;
	_Atomic(void *) *c = handle_cell(t, fh, false);
	struct handle *h = c ? atomic_load_explicit(c, memory_order_acquire) : NULL;
	return h && h->fh == fh ? h : NULL;
}

struct held_handle *ids_handle_record(struct tree *t, uint64_t fh)
{
	return held_handle_get(&t->held, fh);
}

struct handle *ids_handle_install(struct tree *t, uint64_t fh, struct handle *h)
{
	_Atomic(void *) *c = handle_cell(t, fh, true);
	void *none = NULL;

	if (!c)
		return NULL;
	h->fh = fh; /* before it shows: ids_handle checks it */
	h->tree = t;
	if (!atomic_compare_exchange_strong(c, &none, h))
		return none; /* another thread revived it first (the caller drops h) */
	return h;
}

void ids_handle_unbind(struct tree *t, struct handle *h)
{
	if (!h->fh)
		return;
	_Atomic(void *) *c = handle_cell(t, h->fh, false);
	if (c)
		atomic_store(c, NULL);
	held_handle_free(&t->held, h->fh);
	h->fh = 0;
}

void revive_note(struct tree *t, struct handle *h, enum revive_state state)
{
	struct held_handle *rec = h->fh ? ids_handle_record(t, h->fh) : NULL;

	if (rec && atomic_load_explicit(&rec->state, memory_order_relaxed) != state)
		atomic_store_explicit(&rec->state, (uint8_t)state, memory_order_release);
}

void revive_note_commit(struct tree *t, struct handle *h, const uint8_t key[32],
			const uint8_t sha[32])
{
	struct held_handle *rec = h->fh ? ids_handle_record(t, h->fh) : NULL;

	if (!rec)
		return;
	memcpy(rec->key, key, 32);
	memcpy(rec->sha, sha, 32);
	atomic_store_explicit(&rec->state, REVIVE_COMMITTING, memory_order_release);
}

void revive_note_result(struct tree *t, struct handle *h, int result)
{
	struct held_handle *rec = h->fh ? ids_handle_record(t, h->fh) : NULL;

	if (!rec)
		return;
	rec->result = result;
	atomic_store_explicit(&rec->state, REVIVE_FINISHED, memory_order_release);
}
