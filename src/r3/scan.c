/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "format/key.h"
#include "lib/log.h"
#include "r3/scan.h"

struct scan {
	struct tree *t;
	struct version *v;
	uint64_t objects, bytes, versions, dropped, skipped;
	int error;
	bool objects_later;        /* versions only: objects by the sizing threads */
	struct object **batch;     /* a version listed in the background: objects to index */
	size_t nbatch;
	uint64_t removals;         /* v->unlisted_removals when its listing began */
};

#define SCAN_BATCH 4096

/* Indexes the batch's objects under the lock, but those a lookup found in
 * the store meanwhile (version_probe). */
static int index_batch(struct scan *s)
{
	struct tree *t = s->t;
	int rc = 0;

	pthread_mutex_lock(&t->lock);
	/* A name read before its object was removed is not indexed: where
	 * removals came meanwhile (rare), each is looked for in the store. */
	bool recheck = s->v->unlisted_removals != s->removals;
	for (size_t i = 0; i < s->nbatch; i++) {
		struct object *o = s->batch[i];
		char name[ARTFS_HASH_HEX_MAX + 1];
		struct stat st;
		if (recheck) {
			object_name(o, name);
			if (store_object_stat(s->v->dirfd, s->v->keyonly, name, &st) < 0)
				continue;
		}
		if (rc == 0 && !s->v->removed &&
		    !index_object_find(&t->idx, s->v, o->hash, o->hash_len)) {
			rc = index_object_insert(&t->idx, s->v, o);
			if (rc == 0) {
				t->objects++;
				s->objects++;
			}
		}
	}
	pthread_mutex_unlock(&t->lock);
	for (size_t i = 0; i < s->nbatch; i++)
		node_unref(&s->batch[i]->node, 1);
	s->nbatch = 0;
	return rc;
}

static int scan_object(void *ctx, const char *name, unsigned char d_type)
{
	struct scan *s = ctx;
	struct version *v = s->v;
	uint8_t hash[ARTFS_HASH_BYTES_MAX];
	size_t len;

	if (strncmp(name, STORE_TMP_PREFIX, sizeof(STORE_TMP_PREFIX) - 1) == 0) {
		unlinkat(v->dirfd, name, 0);
		s->dropped++;
		return 0;
	}
	if (key_hash_decode(name, hash, &len) < 0 || (v->keyonly && len != 32) ||
	    (d_type != DT_REG && d_type != DT_UNKNOWN)) {
		log_warn("store: ignoring %s/%s: not an object name", v->name, name);
		s->skipped++;
		return 0;
	}
	struct object *o = object_new_found(v, hash, len);
	if (!o)
		return -ENOMEM;
	if (s->batch) { /* indexed by the batch, under the lock */
		s->batch[s->nbatch++] = o;
		return s->nbatch == SCAN_BATCH ? index_batch(s) : 0;
	}
	int rc = index_object_insert(&s->t->idx, v, o);
	node_unref(&o->node, 1);
	if (rc < 0)
		return rc;
	s->objects++;
	return 0;
}

static int scan_version(void *ctx, const char *name, unsigned char d_type)
{
	struct scan *s = ctx;
	struct tree *t = s->t;
	struct stat st;

	bool keyonly = strcmp(name, KEYONLY_VERSION) == 0;
	if ((!keyonly && !key_version_name_valid(name)) || (d_type != DT_DIR && d_type != DT_UNKNOWN)) {
		log_warn("store: ignoring v/%s: not a weight version directory", name);
		return 0;
	}
	int fd = store_version_open(&t->store, name);
	if (fd < 0) {
		log_warn("store: ignoring v/%s: %s", name, strerror(-fd));
		return 0;
	}
	if (fstat(fd, &st) < 0)
		st.st_ctim.tv_sec = t->started;
	struct version *v = version_new(name, fd, st.st_ctim.tv_sec);
	if (!v) {
		close(fd);
		return -ENOMEM;
	}
	v->keyonly = keyonly;
	/* A restart counts as activity: ttl runs from now, not from before. */
	atomic_store(&v->last_active, t->started);
	int rc = index_version_insert(&t->idx, v);
	node_unref(&v->node, 1);
	if (rc < 0)
		return rc;
	s->versions++;
	if (s->objects_later) {
		atomic_store(&v->listed, false);
		return 0;
	}
	s->v = v;
	rc = store_objects_list(fd, keyonly, scan_object, s);
	s->v = NULL;
	return rc;
}

/* A version found by a daemon that takes over: its objects indexed, on a
 * sizing thread, in batches under the lock. */
static void list_version(struct tree *t, struct version *v)
{
	struct scan s = { .t = t, .v = v, .batch = malloc(SCAN_BATCH * sizeof(struct object *)) };

	pthread_mutex_lock(&t->lock);
	s.removals = v->unlisted_removals;
	pthread_mutex_unlock(&t->lock);
	int rc = s.batch ? store_objects_list(v->dirfd, v->keyonly, scan_object, &s) : -ENOMEM;

	if (rc == 0 && s.nbatch)
		rc = index_batch(&s);
	for (size_t i = 0; i < s.nbatch; i++)
		node_unref(&s.batch[i]->node, 1);
	free(s.batch);
	if (rc < 0)
		log_err("store: cannot index version %s: %s; its names are looked for one by one",
			v->name, strerror(-rc));
	pthread_mutex_lock(&t->lock);
	if (rc == 0)
		atomic_store(&v->listed, true);
	pthread_cond_broadcast(&t->sized_cv);
	pthread_mutex_unlock(&t->lock);
}

int scan_store(struct tree *t, bool objects_later, char *err, size_t errlen)
{
	struct scan s = { .t = t, .objects_later = objects_later };
	struct timespec a, b;

	clock_gettime(CLOCK_MONOTONIC, &a);
	store_trash_empty(&t->store, NULL); /* collections a crash interrupted */
	s.dropped = store_tmp_clean(&t->store);
	pthread_mutex_lock(&t->lock);
	int rc = store_list(t->store.versions_fd, scan_version, &s);
	t->objects = s.objects;
	t->bytes_used = 0;
	t->sizing = s.objects > 0 || (objects_later && s.versions > 0);
	sizing_begin_locked(t, objects_later);
	bool warm = t->warm_bytes && t->warm_keys;
	pthread_mutex_unlock(&t->lock);
	if (warm)
		log_info("store %s: counted again in the background; publishes go on meanwhile "
			 "(against the holder's bound of its bytes and its key filter)", t->store.path);
	if (rc < 0) {
		snprintf(err, errlen, "store %s: cannot index it: %s", t->store.path, strerror(-rc));
		return rc;
	}
	clock_gettime(CLOCK_MONOTONIC, &b);
	double ms = (double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) / 1e6;
	if (objects_later)
		log_info("store %s: indexed %llu versions in %.0f ms; their objects are indexed "
			 "while the daemon serves", t->store.path, (unsigned long long)s.versions, ms);
	else
		log_info("store %s: indexed %llu objects in %llu versions in %.0f ms; "
			 "dropped %llu temporary files", t->store.path, (unsigned long long)s.objects,
			 (unsigned long long)s.versions, ms, (unsigned long long)s.dropped);
	return 0;
}

/* ---- sizing in the background --------------------------------------------------- */

#define SIZE_BATCH 4096

struct sizer {
	struct tree *t;
	struct version **versions;   /* referenced */
	size_t nversions;
	_Atomic size_t next;
	_Atomic uint64_t objects, bytes;
	_Atomic bool incomplete;     /* an object was not keyed: the filter lacks it */
	pthread_t threads[4];
	unsigned nthreads;
	int64_t started_ns;
};

static int64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

struct unsized {
	struct object **o;
	size_t n, cap;
	bool short_of_memory;        /* some were left out */
};

static void collect_unsized(void *ctx, struct object *o)
{
	struct unsized *u = ctx;

	if (atomic_load(&o->file_size) != OBJECT_SIZE_UNKNOWN)
		return;
	if (u->n == u->cap) {
		size_t cap = u->cap ? u->cap * 2 : 1024;
		struct object **grown = realloc(u->o, cap * sizeof(*grown));
		if (!grown) { /* the rest stays unsized: sized by unlink, or at the next start */
			u->short_of_memory = true;
			return;
		}
		u->o = grown;
		u->cap = cap;
	}
	node_ref(&o->node);
	u->o[u->n++] = o;
}

/* A committed object's .npy size, kept in its store file's mtime when it
 * fits (tv_sec STORE_NPY_MARK, tv_nsec the size), so that a restart knows it
 * without reading the header. */
static uint64_t npy_size_of(const struct stat *st)
{
	return st->st_mtim.tv_sec == STORE_NPY_MARK ? (uint64_t)st->st_mtim.tv_nsec : 0;
}

static void size_version(struct sizer *z, struct version *v)
{
	struct tree *t = z->t;
	struct unsized u = { 0 };
	char name[ARTFS_HASH_HEX_MAX + 1], key[ARTFS_KEY_LEN + 1];
	uint64_t sizes[SIZE_BATCH], npy[SIZE_BATCH];
	uint8_t (*keys)[32] = malloc(SIZE_BATCH * 32);
	struct stat st;

	if (!atomic_load(&v->listed))
		list_version(t, v);
	pthread_mutex_lock(&t->lock);
	if (!v->removed)
		index_each_object(v, collect_unsized, &u);
	if (u.short_of_memory || !keys || (!v->removed && !atomic_load(&v->listed)))
		z->incomplete = true; /* not every key of it is known */
	pthread_mutex_unlock(&t->lock);
	for (size_t i = 0; i < u.n; i += SIZE_BATCH) {
		size_t n = u.n - i < SIZE_BATCH ? u.n - i : SIZE_BATCH;
		for (size_t k = 0; k < n; k++) {
			struct object *o = u.o[i + k];
			object_name(o, name);
			int src = t->sizing_stop ? -ECANCELED
						 : store_object_stat(v->dirfd, v->keyonly, name, &st);
			bool ok = src == 0;
			if (src < 0 && src != -ENOENT && src != -ECANCELED)
				z->incomplete = true; /* neither counted nor keyed: not warm */
			sizes[k] = ok ? (uint64_t)st.st_size : OBJECT_SIZE_UNKNOWN;
			npy[k] = ok ? npy_size_of(&st) : 0;
			if (keys && !o->keyed) { /* the key index learns it here */
				version_object_key(v, o->hash, o->hash_len, key);
				key_sha256_decode(key + sizeof(ARTFS_KEY_PREFIX) - 1, keys[k]);
			}
			/* The holder's filter too (outside the lock: 7 bits spread
			 * over 16 MiB cost cache misses). */
			if (ok && (o->keyed || keys))
				held_keys_add(&t->held, o->keyed ? o->key : keys[k]);
		}
		pthread_mutex_lock(&t->lock);
		for (size_t k = 0; k < n; k++) {
			struct object *o = u.o[i + k];
			if (sizes[k] == OBJECT_SIZE_UNKNOWN || o->state != OBJECT_COMMITTED ||
			    atomic_load(&o->file_size) != OBJECT_SIZE_UNKNOWN)
				continue;
			atomic_store(&o->file_size, sizes[k]);
			if (npy[k] && !atomic_load(&o->npy_size))
				atomic_store(&o->npy_size, npy[k]);
			if (keys && !o->keyed) {
				memcpy(o->key, keys[k], 32);
				if (index_key_insert(&t->idx, o) < 0) {
					log_err("store: no memory to index the key of %s/%s", v->name, name);
					z->incomplete = true;
				}
			}
			sizing_counted_locked(t, v, sizes[k]);
			atomic_fetch_add(&z->objects, 1);
			atomic_fetch_add(&z->bytes, sizes[k]);
		}
		pthread_mutex_unlock(&t->lock);
	}
	for (size_t i = 0; i < u.n; i++)
		node_unref(&u.o[i]->node, 1);
	free(u.o);
	free(keys);
}

static void *sizer_main(void *arg)
{
	struct sizer *z = arg;

	/* A warm takeover's publishes do not wait for the count: it yields
	 * the processors to them. */
	if (z->t->warm_bytes && z->t->warm_keys)
		setpriority(PRIO_PROCESS, (id_t)gettid(), 10);

	for (;;) {
		size_t i = atomic_fetch_add(&z->next, 1);
		if (i >= z->nversions || z->t->sizing_stop)
			break;
		size_version(z, z->versions[i]);
	}
	return NULL;
}

/* The last sizing thread to finish opens capacity to publishes. */
static void *sizer_boss(void *arg)
{
	struct sizer *z = arg;
	struct tree *t = z->t;

	unsigned started = 1;
	for (unsigned i = 1; i < z->nthreads; i++)
		if (pthread_create(&z->threads[started], NULL, sizer_main, z) == 0)
			started++;
	sizer_main(z);
	for (unsigned i = 1; i < started; i++)
		pthread_join(z->threads[i], NULL);
	pthread_mutex_lock(&t->lock);
	t->sizing = false;
	sizing_end_locked(t, !t->sizing_stop && !z->incomplete);
	pthread_cond_broadcast(&t->sized_cv);
	pthread_mutex_unlock(&t->lock);
	if (!t->sizing_stop)
		log_info("store %s: sized %llu objects, %llu bytes, in %.0f ms", t->store.path,
			 (unsigned long long)z->objects, (unsigned long long)z->bytes,
			 (double)(mono_ns() - z->started_ns) / 1e6);
	return NULL;
}

static void add_version_ref(void *ctx, struct version *v)
{
	struct sizer *z = ctx;

	node_ref(&v->node);
	z->versions[z->nversions++] = v;
}

int scan_size_start(struct tree *t)
{
	pthread_mutex_lock(&t->lock);
	bool needed = t->sizing;
	pthread_mutex_unlock(&t->lock);
	if (!needed)
		return 0;
	struct sizer *z = calloc(1, sizeof(*z));
	if (!z)
		return -ENOMEM;
	z->t = t;
	z->started_ns = mono_ns();
	pthread_mutex_lock(&t->lock);
	z->versions = calloc(t->idx.versions.count + 1, sizeof(*z->versions));
	if (z->versions)
		index_each_version(&t->idx, add_version_ref, z);
	pthread_mutex_unlock(&t->lock);
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	z->nthreads = cpus > 4 ? 4 : cpus < 1 ? 1 : (unsigned)cpus;
	t->sizer = z;
	if (!z->versions || pthread_create(&z->threads[0], NULL, sizer_boss, z) != 0) {
		t->sizer = NULL;
		free(z->versions);
		free(z);
		pthread_mutex_lock(&t->lock);
		t->sizing = false; /* publishes go on, counting from what is known */
		sizing_end_locked(t, false);
		pthread_cond_broadcast(&t->sized_cv);
		pthread_mutex_unlock(&t->lock);
		log_err("store %s: cannot size the store in the background", t->store.path);
		return -ENOMEM;
	}
	return 0;
}

void scan_size_stop(struct tree *t)
{
	struct sizer *z = t->sizer;

	if (!z)
		return;
	t->sizing_stop = true;
	pthread_join(z->threads[0], NULL);
	for (size_t i = 0; i < z->nversions; i++)
		node_unref(&z->versions[i]->node, 1);
	free(z->versions);
	free(z);
	t->sizer = NULL;
}
