/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "format/key.h"
#include "lib/log.h"
#include "restart/held.h"
#include "state/base.h"

int64_t clock_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return ts.tv_sec;
}

/* Spins before it sleeps: waking a thread that slept costs more than the
 * wait (tens of microseconds on a virtual machine's idle CPUs). */
void mutex_init_adaptive(pthread_mutex_t *m)
{
	pthread_mutexattr_t a;

	pthread_mutexattr_init(&a);
	pthread_mutexattr_settype(&a, PTHREAD_MUTEX_ADAPTIVE_NP);
	pthread_mutex_init(m, &a);
	pthread_mutexattr_destroy(&a);
}

pthread_mutex_t *commit_lock_of(struct tree *t, const uint8_t key[32])
{
	return &t->commit_locks[key[0] % COMMIT_STRIPES]; /* keys are SHA-256 digests */
}

void version_touch(struct version *v)
{
	atomic_store_explicit(&v->last_active, clock_now(), memory_order_relaxed);
}

void sizing_wait(struct tree *t)
{
	if (!atomic_load(&t->sizing))
		return; /* it only ever goes from true to false, under t->lock */
	pthread_mutex_lock(&t->lock);
	while (t->sizing)
		pthread_cond_wait(&t->sized_cv, &t->lock);
	pthread_mutex_unlock(&t->lock);
}

void sizing_wait_for_key(struct tree *t, const uint8_t key[32])
{
	if (!atomic_load(&t->sizing) || (t->warm_keys && !held_keys_may_hold(&t->held, key)))
		return;
	sizing_wait(t);
}

void sizing_counted_locked(struct tree *t, struct version *v, uint64_t bytes)
{
	t->bytes_used += bytes;
	v->bytes += bytes;
	t->unsized_bound = t->unsized_bound > bytes ? t->unsized_bound - bytes : 0;
}

/* The bound only rises at a reservation (a commit moves reserved bytes to
 * used ones, a count moves unsized ones to used ones, a removal lowers
 * it): noted there, it stays above the store's bytes at any moment a
 * daemon may die, a link of an object included. */
void sizing_note_bound_locked(struct tree *t)
{
	atomic_store(&t->held.hdr->bytes_bound,
		     t->bytes_used + t->bytes_reserved + t->unsized_bound);
}

void sizing_begin_locked(struct tree *t, bool takeover)
{
	uint32_t warm = takeover && t->sizing ? atomic_load(&t->held.hdr->warm) : 0;

	t->warm_bytes = warm & HELD_WARM_BYTES;
	t->warm_keys = warm & HELD_WARM_KEYS;
	t->unsized_bound = t->warm_bytes ? atomic_load(&t->held.hdr->bytes_bound) : 0;
	if (!t->sizing) /* nothing to count: known now */
		sizing_end_locked(t, true);
}

void sizing_end_locked(struct tree *t, bool complete)
{
	/* A count stopped or cut short keeps the bound of what it did not
	 * count (capacity= goes on counting it; the next daemon may trust the
	 * bound still, the holder's filter too: every key was in it before). */
	if (complete)
		t->unsized_bound = 0;
	t->warm_bytes = t->warm_keys = false;
	sizing_note_bound_locked(t);
	if (complete)
		atomic_store(&t->held.hdr->warm, HELD_WARM_BYTES | HELD_WARM_KEYS);
}

/* ---- open handles ---------------------------------------------------------- */

static struct handle open_handles = { .prev = &open_handles, .next = &open_handles };
/* Adaptive: every publish of a batch registers and drops its handle, on
 * several threads at once (mutex_init_adaptive). */
static pthread_mutex_t open_handles_lock = PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP;

void handle_init(struct handle *h, const struct handle_ops *ops)
{
	h->ops = ops;
	atomic_init(&h->users, 1);
	h->prev = h->next = NULL;
}

void handle_register(struct handle *h)
{
	pthread_mutex_lock(&open_handles_lock);
	h->next = &open_handles;
	h->prev = open_handles.prev;
	open_handles.prev->next = h;
	open_handles.prev = h;
	pthread_mutex_unlock(&open_handles_lock);
}

static void handle_free(struct tree *t, struct handle *h)
{
	if (h->prev) { /* registered by its open; a batch record's never is */
		pthread_mutex_lock(&open_handles_lock);
		h->prev->next = h->next;
		h->next->prev = h->prev;
		pthread_mutex_unlock(&open_handles_lock);
	}
	/* Its number goes with it (src/state/ids.c), unless the next daemon is to
	 * open it again (a drained daemon's handles that the kernel holds). */
	if (h->fh && !t->handing_over && t->handle_unbind)
		t->handle_unbind(t, h);
	if (h->ops->release)
		h->ops->release(t, h);
}

void handle_get(struct handle *h)
{
	atomic_fetch_add(&h->users, 1);
}

void handle_put(struct tree *t, struct handle *h)
{
	if (atomic_fetch_sub(&h->users, 1) == 1)
		handle_free(t, h);
}

void handles_hand_over(struct tree *t)
{
	pthread_mutex_lock(&open_handles_lock);
	for (struct handle *h = open_handles.next; h != &open_handles; h = h->next)
		if (h->ops->hand_over)
			h->ops->hand_over(t, h);
	pthread_mutex_unlock(&open_handles_lock);
}

void handles_release_all(struct tree *t)
{
	for (;;) {
		pthread_mutex_lock(&open_handles_lock);
		struct handle *h = open_handles.next == &open_handles ? NULL : open_handles.next;
		pthread_mutex_unlock(&open_handles_lock);
		if (!h)
			break;
		handle_free(t, h);
	}
}

void buffer_slice(const void *buf, size_t len, uint64_t off, size_t size, const void **data,
		  size_t *out_len)
{
	size_t at = off < len ? (size_t)off : len;

	*data = buf ? (const char *)buf + at : "";
	*out_len = len - at < size ? len - at : size;
}

/* ---- versions ---------------------------------------------------------------- */

struct version *version_find(struct tree *t, const char *name)
{
	pthread_mutex_lock(&t->lock);
	struct version *v = index_version_find(&t->idx, name);
	if (v)
		node_ref(&v->node);
	pthread_mutex_unlock(&t->lock);
	return v;
}

struct object *object_new_found(struct version *v, const uint8_t *hash, size_t len)
{
	struct object *o = object_new(v, hash, len);

	if (!o)
		return NULL;
	atomic_store(&o->file_size, OBJECT_SIZE_UNKNOWN);
	if (v->keyonly) { /* named by its key: indexed by key at once */
		memcpy(o->key, hash, 32);
		o->keyed = true;
	}
	return o;
}

void version_probe(struct tree *t, struct version *v, const uint8_t *hash, size_t len)
{
	char name[ARTFS_HASH_HEX_MAX + 1];
	struct stat st;

	if (atomic_load(&v->listed))
		return;
	key_hex(hash, len, name);
	if (store_object_stat(v->dirfd, v->keyonly, name, &st) < 0)
		return; /* not there (or not an object: the listing says so) */
	struct object *o = object_new_found(v, hash, len);
	if (!o)
		return;
	pthread_mutex_lock(&t->lock);
	if (!v->removed && !index_object_find(&t->idx, v, hash, len) &&
	    index_object_insert(&t->idx, v, o) == 0)
		t->objects++;
	pthread_mutex_unlock(&t->lock);
	node_unref(&o->node, 1);
}

void version_listed_wait(struct tree *t, struct version *v)
{
	if (atomic_load(&v->listed))
		return;
	pthread_mutex_lock(&t->lock);
	while (!atomic_load(&v->listed) && t->sizing)
		pthread_cond_wait(&t->sized_cv, &t->lock);
	pthread_mutex_unlock(&t->lock);
}

void (*version_object_find_hook)(struct tree *t, struct version *v);

struct object *version_object_find(struct tree *t, struct version *v, const uint8_t *hash,
				   size_t len)
{
	for (int pass = 0;; pass++) {
		/* Seen before the lookup: a miss is final only when v was listed
		 * before it looked. A listing that ends after the lookup indexed
		 * the object too late for it (ENOENT on a committed object after
		 * a restart); probing then finds it indexed. */
		bool listed = atomic_load(&v->listed);
		pthread_mutex_lock(&t->lock);
		struct object *o = index_object_find(&t->idx, v, hash, len);
		if (o)
			node_ref(&o->node);
		pthread_mutex_unlock(&t->lock);
		if (version_object_find_hook)
			version_object_find_hook(t, v);
		if (o || pass || listed)
			return o;
		version_probe(t, v, hash, len);
	}
}

static int make(struct tree *t, const char *name, bool keyonly, struct version **out)
{
	for (;;) {
		struct version *v = version_find(t, name);
		if (v) {
			*out = v;
			return -EEXIST;
		}
		int rc = store_version_make(&t->store, name);
		if (rc < 0 && rc != -EEXIST) {
			log_err("mkdir %s: cannot create it in the store: %s", name, strerror(-rc));
			return rc == -ENOSPC ? rc : -EIO;
		}
		int fd = store_version_open(&t->store, name);
		if (fd < 0) {
			log_err("mkdir %s: cannot open it in the store: %s", name, strerror(-fd));
			return -EIO;
		}
		v = version_new(name, fd, clock_now());
		if (!v) {
			close(fd);
			return -ENOMEM;
		}
		v->keyonly = keyonly;
		pthread_mutex_lock(&t->lock);
		if (index_version_find(&t->idx, name))
			rc = -EEXIST;
		else
			rc = index_version_insert(&t->idx, v);
		pthread_mutex_unlock(&t->lock);
		if (rc == -EEXIST) { /* made meanwhile: take that one */
			node_unref(&v->node, 1);
			continue;
		}
		if (rc < 0) {
			node_unref(&v->node, 1);
			return rc;
		}
		counter_inc(&t->metrics.versions_created);
		*out = v; /* the creation reference */
		return 0;
	}
}

int version_make(struct tree *t, const char *name, struct version **out)
{
	if (!key_version_name_valid(name)) {
		log_warn("mkdir %.200s: not a weight version name "
			 "([A-Za-z0-9][A-Za-z0-9._-]{0,127})", name);
		return -EINVAL;
	}
	return make(t, name, false, out);
}

int version_keyonly(struct tree *t, struct version **out)
{
	int rc = make(t, KEYONLY_VERSION, true, out);

	return rc == -EEXIST ? 0 : rc;
}

void version_object_key(const struct version *v, const uint8_t *hash, size_t len,
			char out[ARTFS_KEY_LEN + 1])
{
	char hex[ARTFS_HASH_HEX_MAX + 1];
	const size_t plen = sizeof(ARTFS_KEY_PREFIX) - 1;

	if (v->keyonly && len == 32) {
		key_hex(hash, len, hex);
		memcpy(out, ARTFS_KEY_PREFIX, plen);
		memcpy(out + plen, hex, 64);
		out[plen + 64] = '\0';
	} else
		key_derive(v->name, hash, len, out);
}

void version_object_key_bin(const struct version *v, const uint8_t *hash, size_t len,
			    uint8_t out[32])
{
	char key[ARTFS_KEY_LEN + 1];

	version_object_key(v, hash, len, key);
	key_sha256_decode(key + sizeof(ARTFS_KEY_PREFIX) - 1, out);
}

bool transaction_memory_take(struct tree *t, uint64_t len)
{
	uint64_t held = atomic_load(&t->materialize_held);

	do {
		if (len > t->cfg->materialize_max || held > t->cfg->materialize_max - len)
			return false;
	} while (!atomic_compare_exchange_weak(&t->materialize_held, &held, held + len));
	return true;
}

void transaction_memory_give(struct tree *t, uint64_t len)
{
	atomic_fetch_sub(&t->materialize_held, len);
}

const char *errno_name(int e)
{
	switch (e) {
	case 0: return "0";
	case EEXIST: return "EEXIST";
	case EBADMSG: return "EBADMSG";
	case ENOSPC: return "ENOSPC";
	case EFBIG: return "EFBIG";
	case ENOENT: return "ENOENT";
	case ENFILE: return "ENFILE";
	case ENOMEM: return "ENOMEM";
	case EINVAL: return "EINVAL";
	case ENODEV: return "ENODEV";
	default: return "EIO";
	}
}
