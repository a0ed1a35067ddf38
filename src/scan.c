#include "autoconf.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "key.h"
#include "log.h"
#include "scan.h"

struct scan {
	struct tree *t;
	struct version *v;
	uint64_t objects, bytes, versions, dropped, skipped;
	int error;
};

static int scan_object(void *ctx, const char *name, unsigned char d_type)
{
	struct scan *s = ctx;
	struct version *v = s->v;
	uint8_t hash[ARTFS_HASH_BYTES_MAX];
	size_t len;
	struct stat st;

	if (strncmp(name, STORE_TMP_PREFIX, sizeof(STORE_TMP_PREFIX) - 1) == 0) {
		unlinkat(v->dirfd, name, 0);
		s->dropped++;
		return 0;
	}
	if (key_hash_decode(name, hash, &len) < 0 || (d_type != DT_REG && d_type != DT_UNKNOWN)) {
		log_warn("store: ignoring %s/%s: not an object name", v->name, name);
		s->skipped++;
		return 0;
	}
	if (store_object_stat(v->dirfd, name, &st) < 0) {
		log_warn("store: ignoring %s/%s: not a regular file", v->name, name);
		s->skipped++;
		return 0;
	}
	struct object *o = object_new(v, hash, len);
	if (!o)
		return -ENOMEM;
	atomic_store(&o->file_size, (uint64_t)st.st_size);
	atomic_store(&o->ctime_ns, (uint64_t)st.st_ctim.tv_sec * 1000000000u +
				       (uint64_t)st.st_ctim.tv_nsec);
	int rc = index_object_insert(&s->t->idx, v, o);
	node_unref(&o->node, 1);
	if (rc < 0)
		return rc;
	v->bytes += (uint64_t)st.st_size;
	s->objects++;
	s->bytes += (uint64_t)st.st_size;
	return 0;
}

static int scan_version(void *ctx, const char *name, unsigned char d_type)
{
	struct scan *s = ctx;
	struct tree *t = s->t;
	struct stat st;

	if (!key_version_name_valid(name) || (d_type != DT_DIR && d_type != DT_UNKNOWN)) {
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
	/* A restart counts as activity: ttl runs from now, not from before. */
	atomic_store(&v->last_active, t->started);
	int rc = index_version_insert(&t->idx, v);
	node_unref(&v->node, 1);
	if (rc < 0)
		return rc;
	s->v = v;
	s->versions++;
	rc = store_list(fd, scan_object, s);
	s->v = NULL;
	return rc;
}

int scan_store(struct tree *t, char *err, size_t errlen)
{
	struct scan s = { .t = t };
	struct timespec a, b;

	clock_gettime(CLOCK_MONOTONIC, &a);
	store_trash_empty(&t->store, NULL); /* collections a crash interrupted */
	pthread_mutex_lock(&t->lock);
	int rc = store_list(t->store.versions_fd, scan_version, &s);
	t->objects = s.objects;
	t->bytes_used = s.bytes;
	pthread_mutex_unlock(&t->lock);
	if (rc < 0) {
		snprintf(err, errlen, "store %s: cannot index it: %s", t->store.path, strerror(-rc));
		return rc;
	}
	clock_gettime(CLOCK_MONOTONIC, &b);
	double ms = (double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) / 1e6;
	log_info("store %s: indexed %llu objects (%llu bytes) in %llu versions in %.0f ms; "
		 "dropped %llu temporary files", t->store.path, (unsigned long long)s.objects,
		 (unsigned long long)s.bytes, (unsigned long long)s.versions, ms,
		 (unsigned long long)s.dropped);
	return 0;
}
