/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "format/key.h"
#include "store/index.h"

/* Names come from clients, so the table hash is seeded per daemon. */
static uint64_t mix(uint64_t h)
{
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdULL;
	h ^= h >> 33;
	h *= 0xc4ceb9fe1a85ec53ULL;
	h ^= h >> 33;
	return h;
}

static uint64_t hash_bytes(uint64_t seed, const void *data, size_t len)
{
	const uint8_t *p = data;
	uint64_t h = seed ^ (len * 0x9e3779b97f4a7c15ULL);

	while (len >= 8) {
		uint64_t w;
		memcpy(&w, p, 8);
		h = mix(h ^ w) + 0x9e3779b97f4a7c15ULL;
		p += 8;
		len -= 8;
	}
	uint64_t w = 0;
	memcpy(&w, p, len);
	return mix(h ^ w ^ ((uint64_t)len << 56));
}

void index_init(struct index *idx)
{
	memset(idx, 0, sizeof(*idx));
	if (getrandom(&idx->seed, sizeof(idx->seed), 0) != sizeof(idx->seed))
		idx->seed = (uint64_t)getpid() * 0x9e3779b97f4a7c15ULL;
}

/* Every allocated version and object, so that shutdown can free them. */
static struct node registry = { .prev = &registry, .next = &registry };
/* Adaptive: every record of a batch adds and drops an object, on several
 * threads at once. */
static pthread_mutex_t registry_lock = PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP;

static void registry_add(struct node *n)
{
	pthread_mutex_lock(&registry_lock);
	n->next = &registry;
	n->prev = registry.prev;
	registry.prev->next = n;
	registry.prev = n;
	pthread_mutex_unlock(&registry_lock);
}

static void registry_del(struct node *n)
{
	pthread_mutex_lock(&registry_lock);
	n->prev->next = n->next;
	n->next->prev = n->prev;
	pthread_mutex_unlock(&registry_lock);
}

/* A node that is part of another (a version's .materialize, the files of
 * loaded weights) shares its owner's count. */
static struct node *counted(struct node *n)
{
	return n->owner ? n->owner : n;
}

void node_ref(struct node *n)
{
	atomic_fetch_add_explicit(&counted(n)->refs, 1, memory_order_relaxed);
}

void node_ref_many(struct node *n, uint64_t count)
{
	atomic_fetch_add_explicit(&counted(n)->refs, count, memory_order_relaxed);
}

static void version_free(struct version *v)
{
	registry_del(&v->node);
	if (v->dirfd >= 0)
		close(v->dirfd);
	free(v->objects.buckets);
	free(v);
}

static void object_free(struct object *o)
{
	struct version *v = o->ver;

	registry_del(&o->node);
	free(o);
	node_unref(&v->node, 1);
}

static void (*_Atomic weights_free_hook)(struct node *n); /* set from any load */

void index_set_weights_free(void (*fn)(struct node *n))
{
	weights_free_hook = fn;
}

static void (*_Atomic trees_free_hook)(struct node *n); /* set when a tree opens */

void index_set_trees_free(void (*fn)(struct node *n))
{
	trees_free_hook = fn;
}

void node_unref(struct node *n, uint64_t count)
{
	n = counted(n);
	uint64_t old = atomic_fetch_sub_explicit(&n->refs, count, memory_order_acq_rel);

	if (old != count)
		return;
	switch (n->type) {
	case NODE_VERSION:
		version_free((struct version *)n);
		break;
	case NODE_OBJECT:
		object_free((struct object *)n);
		break;
	case NODE_WEIGHTS:
		if (weights_free_hook)
			weights_free_hook(n);
		break;
	case NODE_CACHE_DIR:
	case NODE_CACHE_FILE:
		if (trees_free_hook)
			trees_free_hook(n);
		break;
	default:
		break; /* static nodes are never freed */
	}
}

struct version *version_new(const char *name, int dirfd, int64_t created)
{
	size_t len = strlen(name);
	struct version *v = calloc(1, sizeof(*v) + len + 1);

	if (!v)
		return NULL;
	v->node.type = NODE_VERSION;
	atomic_init(&v->node.refs, 1);
	atomic_init(&v->listed, true);
	v->materialize.type = NODE_MATERIALIZE;
	v->materialize.owner = &v->node;
	v->put.type = NODE_PUT;
	v->put.owner = &v->node;
	v->dirfd = dirfd;
	v->created = created;
	atomic_init(&v->last_active, created);
	memcpy(v->name, name, len + 1);
	registry_add(&v->node);
	return v;
}

struct object *object_new(struct version *ver, const uint8_t *hash, size_t hash_len)
{
	struct object *o = calloc(1, sizeof(*o) + hash_len);

	if (!o)
		return NULL;
	o->node.type = NODE_OBJECT;
	atomic_init(&o->node.refs, 1);
	o->keynode.type = NODE_KEY;
	o->keynode.owner = &o->node;
	o->ver = ver;
	node_ref(&ver->node);
	o->hash_len = (uint8_t)hash_len;
	memcpy(o->hash, hash, hash_len);
	registry_add(&o->node);
	return o;
}

/* ---- versions ---------------------------------------------------------- */

static int versions_grow(struct index *idx)
{
	struct version_table *t = &idx->versions;
	size_t n = t->nbuckets ? t->nbuckets * 2 : 16;
	struct version **b = calloc(n, sizeof(*b));

	if (!b)
		return -ENOMEM;
	for (size_t i = 0; i < t->nbuckets; i++) {
		struct version *v = t->buckets[i], *next;
		for (; v; v = next) {
			next = v->next;
			size_t j = hash_bytes(idx->seed, v->name, strlen(v->name)) & (n - 1);
			v->next = b[j];
			b[j] = v;
		}
	}
	free(t->buckets);
	t->buckets = b;
	t->nbuckets = n;
	return 0;
}

struct version *index_version_find(struct index *idx, const char *name)
{
	struct version_table *t = &idx->versions;

	if (!t->nbuckets)
		return NULL;
	size_t i = hash_bytes(idx->seed, name, strlen(name)) & (t->nbuckets - 1);
	for (struct version *v = t->buckets[i]; v; v = v->next)
		if (strcmp(v->name, name) == 0)
			return v;
	return NULL;
}

int index_version_insert(struct index *idx, struct version *v)
{
	struct version_table *t = &idx->versions;

	if (t->count + 1 > t->nbuckets && versions_grow(idx) < 0)
		return -ENOMEM;
	size_t i = hash_bytes(idx->seed, v->name, strlen(v->name)) & (t->nbuckets - 1);
	v->next = t->buckets[i];
	t->buckets[i] = v;
	t->count++;
	node_ref(&v->node);
	return 0;
}

void index_version_remove(struct index *idx, struct version *v)
{
	struct version_table *t = &idx->versions;
	size_t i = hash_bytes(idx->seed, v->name, strlen(v->name)) & (t->nbuckets - 1);

	for (struct version **p = &t->buckets[i]; *p; p = &(*p)->next) {
		if (*p == v) {
			*p = v->next;
			v->next = NULL;
			v->removed = true;
			t->count--;
			node_unref(&v->node, 1);
			return;
		}
	}
}

static void key_remove(struct index *idx, struct object *o);

void index_version_detach(struct index *idx, struct version *v)
{
	struct object_table *t = &v->objects;

	node_ref(&v->node); /* freeing objects may drop the last other reference */
	for (size_t i = 0; i < t->nbuckets; i++) {
		struct object *o = t->buckets[i], *next;
		t->buckets[i] = NULL;
		for (; o; o = next) {
			next = o->next;
			o->next = NULL;
			key_remove(idx, o);
			o->state = OBJECT_REMOVED;
			node_unref(&o->node, 1);
		}
	}
	t->count = 0;
	index_version_remove(idx, v);
	node_unref(&v->node, 1);
}

void index_each_version(struct index *idx, void (*fn)(void *ctx, struct version *v), void *ctx)
{
	struct version_table *t = &idx->versions;

	for (size_t i = 0; i < t->nbuckets; i++)
		for (struct version *v = t->buckets[i]; v; v = v->next)
			fn(ctx, v);
}

/* ---- objects ----------------------------------------------------------- */

static size_t object_slot(const struct index *idx, const struct object_table *t,
			  const uint8_t *hash, size_t len)
{
	return hash_bytes(idx->seed, hash, len) & (t->nbuckets - 1);
}

static int objects_grow(struct index *idx, struct object_table *t)
{
	size_t n = t->nbuckets ? t->nbuckets * 2 : 64;
	struct object **b = calloc(n, sizeof(*b));

	if (!b)
		return -ENOMEM;
	struct object_table grown = { .buckets = b, .nbuckets = n, .count = t->count };
	for (size_t i = 0; i < t->nbuckets; i++) {
		struct object *o = t->buckets[i], *next;
		for (; o; o = next) {
			next = o->next;
			size_t j = object_slot(idx, &grown, o->hash, o->hash_len);
			o->next = b[j];
			b[j] = o;
		}
	}
	free(t->buckets);
	*t = grown;
	return 0;
}

static struct object *table_find(struct index *idx, struct object_table *t, const uint8_t *hash,
				 size_t hash_len)
{
	if (!t->nbuckets)
		return NULL;
	for (struct object *o = t->buckets[object_slot(idx, t, hash, hash_len)]; o; o = o->next)
		if (o->hash_len == hash_len && memcmp(o->hash, hash, hash_len) == 0)
			return o;
	return NULL;
}

static int table_insert(struct index *idx, struct object_table *t, struct object *o)
{
	if (t->count + 1 > t->nbuckets && objects_grow(idx, t) < 0)
		return -ENOMEM;
	size_t i = object_slot(idx, t, o->hash, o->hash_len);
	o->next = t->buckets[i];
	t->buckets[i] = o;
	t->count++;
	return 0;
}

static bool table_remove(struct index *idx, struct object_table *t, struct object *o)
{
	if (!t->nbuckets)
		return false;
	for (struct object **p = &t->buckets[object_slot(idx, t, o->hash, o->hash_len)]; *p;
	     p = &(*p)->next) {
		if (*p == o) {
			*p = o->next;
			o->next = NULL;
			t->count--;
			return true;
		}
	}
	return false;
}

struct object *index_object_find(struct index *idx, struct version *v,
				 const uint8_t *hash, size_t hash_len)
{
	return table_find(idx, &v->objects, hash, hash_len);
}

/* ---- keys --------------------------------------------------------------- */

static size_t key_slot(const struct key_table *t, const uint8_t key[32])
{
	uint64_t h;

	memcpy(&h, key, sizeof(h)); /* a SHA-256: already uniform */
	return (size_t)h & (t->nbuckets - 1);
}

static int keys_grow(struct key_table *t)
{
	size_t n = t->nbuckets ? t->nbuckets * 2 : 64;
	struct object **b = calloc(n, sizeof(*b));

	if (!b)
		return -ENOMEM;
	struct key_table grown = { .buckets = b, .nbuckets = n, .count = t->count };
	for (size_t i = 0; i < t->nbuckets; i++) {
		struct object *o = t->buckets[i], *next;
		for (; o; o = next) {
			next = o->key_next;
			size_t j = key_slot(&grown, o->key);
			o->key_next = b[j];
			b[j] = o;
		}
	}
	free(t->buckets);
	*t = grown;
	return 0;
}

struct object *index_key_find(struct index *idx, const uint8_t key[32])
{
	struct key_table *t = &idx->keys;

	if (!t->nbuckets)
		return NULL;
	for (struct object *o = t->buckets[key_slot(t, key)]; o; o = o->key_next)
		if (memcmp(o->key, key, 32) == 0)
			return o;
	return NULL;
}

int index_key_insert(struct index *idx, struct object *o)
{
	struct key_table *t = &idx->keys;

	if (t->count + 1 > t->nbuckets && keys_grow(t) < 0)
		return -ENOMEM;
	size_t i = key_slot(t, o->key);
	o->key_next = t->buckets[i];
	t->buckets[i] = o;
	t->count++;
	o->keyed = true;
	return 0;
}

static void key_remove(struct index *idx, struct object *o)
{
	struct key_table *t = &idx->keys;

	if (!t->nbuckets || !o->keyed)
		return;
	for (struct object **p = &t->buckets[key_slot(t, o->key)]; *p; p = &(*p)->key_next)
		if (*p == o) {
			*p = o->key_next;
			o->key_next = NULL;
			t->count--;
			return;
		}
}

void index_each_key(struct index *idx, void (*fn)(void *ctx, struct object *o), void *ctx)
{
	struct key_table *t = &idx->keys;

	for (size_t i = 0; i < t->nbuckets; i++)
		for (struct object *o = t->buckets[i]; o; o = o->key_next)
			fn(ctx, o);
}

int index_object_insert(struct index *idx, struct version *v, struct object *o)
{
	int rc = table_insert(idx, &v->objects, o);

	if (rc == 0 && o->keyed && (rc = index_key_insert(idx, o)) < 0)
		table_remove(idx, &v->objects, o);
	if (rc == 0) {
		o->state = OBJECT_COMMITTED;
		node_ref(&o->node);
	}
	return rc;
}

void index_object_remove(struct index *idx, struct version *v, struct object *o)
{
	if (table_remove(idx, &v->objects, o)) {
		key_remove(idx, o);
		o->state = OBJECT_REMOVED;
		node_unref(&o->node, 1);
	}
}

void index_each_object(struct version *v, void (*fn)(void *ctx, struct object *o), void *ctx)
{
	struct object_table *t = &v->objects;

	for (size_t i = 0; i < t->nbuckets; i++)
		for (struct object *o = t->buckets[i]; o; o = o->next)
			fn(ctx, o);
}

void object_name(const struct object *o, char *out)
{
	key_hex(o->hash, o->hash_len, out);
}

void index_destroy(struct index *idx)
{
	struct version_table *t = &idx->versions;

	free(t->buckets);
	memset(t, 0, sizeof(*t));
	free(idx->keys.buckets);
	memset(&idx->keys, 0, sizeof(idx->keys));
	/* Objects first: freeing one drops its reference on its version. */
	for (int pass = 0; pass < 2; pass++) {
		pthread_mutex_lock(&registry_lock);
		struct node *n = registry.next;
		while (n != &registry) {
			struct node *next = n->next;
			if ((pass == 0) == (n->type == NODE_OBJECT)) {
				n->prev->next = n->next;
				n->next->prev = n->prev;
				n->prev = n->next = n;
				if (n->type == NODE_VERSION) {
					struct version *v = (struct version *)n;
					if (v->dirfd >= 0)
						close(v->dirfd);
					free(v->objects.buckets);
				}
				free(n);
			}
			n = next;
		}
		pthread_mutex_unlock(&registry_lock);
	}
}
