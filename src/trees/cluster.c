/* SPDX-License-Identifier: Apache-2.0 */
/* A write-once tree across nodes (remote=, DESIGN.md §9). A committed
 * file is <prefix>:cache:<path> in the cluster, its SHA-256 then its
 * bytes, created once (SET NX: the first stays); each directory above it
 * names its child in the set <prefix>:cachedir:<dir path> (the root's is
 * <prefix>:cachedir:), so that a directory exists remotely when some file
 * under it does. Every call here waits on the cluster (bounded by
 * remote_timeout): never under the tree's lock, and only on threads that
 * may wait (the namespace answers "not quick" for the tree with remote=).
 * The cluster unreachable is a miss; the client logs and counts its
 * failures (artfs_remote_errors_total). */
#include "autoconf.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lib/log.h"
#include "lib/sha256.h"
#include "remote/remote.h"
#include "store/store.h"
#include "trees/names.h"
#include "trees/wtree_i.h"

#define SHA_LEN 32
#define DIR_MEMBERS_MAX 65536 /* names of one directory looked through for one */
/* After the cluster did not answer, the tree answers from this node alone
 * for this long: a compile's hundreds of misses would each wait
 * remote_timeout= otherwise. */
#define CLUSTER_PAUSE_NS (5 * 1000000000ll)

static int64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

/* Whether the cluster may be asked now. */
static bool cluster_usable(struct wtree *w)
{
	return mono_ns() >= atomic_load(&w->cluster_down_until);
}

/* What a call answered: no answer (EIO) pauses the asking. */
static int cluster_note(struct wtree *w, int rc)
{
	if (rc != -EIO)
		return rc;
	int64_t was = atomic_exchange(&w->cluster_down_until, mono_ns() + CLUSTER_PAUSE_NS);
	if (was == 0 || mono_ns() - was > CLUSTER_PAUSE_NS) /* once an outage */
		log_warn("cache: the cluster does not answer; .cache/ answers from this node "
			 "alone, asking it again every %lld s", CLUSTER_PAUSE_NS / 1000000000ll);
	return rc;
}

/* "<kind>:<path>", the root's path "." as "": malloc'd, or NULL. */
static char *key_name(const char *kind, const char *path)
{
	if (strcmp(path, ".") == 0)
		path = "";
	size_t len = strlen(kind) + 1 + strlen(path) + 1;
	char *name = malloc(len);

	if (name)
		snprintf(name, len, "%s:%s", kind, path);
	return name;
}

int wcluster_fetch(struct wtree *w, const char *path, struct wvalue *out)
{
	char *name = key_name("cache", path);
	uint8_t *val = NULL;
	size_t len = 0;
	uint8_t sha[SHA_LEN];

	if (!name)
		return -ENOMEM;
	int rc = cluster_usable(w) ? cluster_note(w, remote_get_named(w->t->remote, name, &val,
								     &len))
				   : -EIO;
	free(name);
	if (rc < 0)
		return rc;
	/* From outside: its length and digest are checked before any use. */
	if (len < SHA_LEN || len - SHA_LEN > w->max_file) {
		log_warn("cache: .cache/%.400s in the cluster is %zu bytes, not a SHA-256 and at "
			 "most %llu bytes; not served", path, len, (unsigned long long)w->max_file);
		free(val);
		return -EBADMSG;
	}
	sha256_once(val + SHA_LEN, len - SHA_LEN, sha);
	if (memcmp(sha, val, SHA_LEN) != 0) {
		log_warn("cache: .cache/%.400s in the cluster fails its SHA-256 check; not served",
			 path);
		free(val);
		return -EBADMSG;
	}
	out->val = val;
	out->size = len - SHA_LEN;
	return 0;
}

void wvalue_free(struct wvalue *v)
{
	free(v->val);
	v->val = NULL;
}

/* Each directory above path names its child: one SADD per level, in one
 * pipelined call. Best effort: a failure is the client's to log. */
static void publish_dirs(struct wtree *w, const char *path)
{
	char *names[WTREE_DEPTH_MAX + 2], *members[WTREE_DEPTH_MAX + 2];
	int results[WTREE_DEPTH_MAX + 2];
	size_t n = 0, start = 0;
	bool ok = true;

	while (ok && n < WTREE_DEPTH_MAX + 2) {
		const char *slash = strchr(path + start, '/');
		size_t end = slash ? (size_t)(slash - path) : strlen(path);
		/* The set of the directory above: the path before this component. */
		size_t dir_len = start ? start - 1 : 0;
		names[n] = malloc(sizeof("cachedir:") + dir_len);
		members[n] = strndup(path + start, end - start);
		if (names[n])
			snprintf(names[n], sizeof("cachedir:") + dir_len, "cachedir:%.*s",
				 (int)dir_len, path);
		ok = names[n] && members[n];
		n++;
		if (!slash)
			break;
		start = end + 1;
	}
	if (ok && cluster_usable(w))
		cluster_note(w, remote_sadd_named(w->t->remote, n, (const char *const *)names,
						  (const char *const *)members, results));
	for (size_t i = 0; i < n; i++) {
		free(names[i]);
		free(members[i]);
	}
}

void wcluster_forget(struct wtree *w, const char *path)
{
	const char *slash = strrchr(path, '/');
	size_t dir_len = slash ? (size_t)(slash - path) : 0;
	char *name = malloc(sizeof("cachedir:") + dir_len);
	const char *member = slash ? slash + 1 : path;
	int result;

	if (!name)
		return;
	snprintf(name, sizeof("cachedir:") + dir_len, "cachedir:%.*s", (int)dir_len, path);
	if (cluster_usable(w))
		cluster_note(w, remote_srem_named(w->t->remote, 1, (const char *const *)&name,
						  &member, &result));
	free(name);
}

/* The value of a file for the cluster: its SHA-256 then its bytes, read
 * back from fd (a store file: header first). */
static int value_read(int fd, uint64_t size, const uint8_t sha[SHA_LEN], uint8_t **out)
{
	uint8_t *val = malloc(SHA_LEN + size);

	if (!val)
		return -ENOMEM;
	memcpy(val, sha, SHA_LEN);
	int rc = size ? store_pread_all(fd, val + SHA_LEN, size, WTREE_HEADER) : 0;
	if (rc < 0) {
		free(val);
		return rc;
	}
	*out = val;
	return 0;
}

bool wcluster_named(struct wtree *w, const char *path)
{
	const char *slash = strrchr(path, '/');
	const char *name = slash ? slash + 1 : path;
	char dir[WTREE_PATH_MAX + 2];
	char **names = NULL;
	size_t count = 0;
	bool found = false;

	snprintf(dir, sizeof(dir), "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
	if (wcluster_members(w, dir, DIR_MEMBERS_MAX, &names, &count) == 0)
		for (size_t i = 0; i < count && !found; i++)
			found = strcmp(names[i], name) == 0;
	remote_members_free(names, count);
	return found;
}

int wcluster_claim(struct wtree *w, const char *path, int fd, uint64_t size,
		   const uint8_t sha[SHA_LEN], struct wvalue *theirs)
{
	char *name = cluster_usable(w) ? key_name("cache", path) : NULL;
	uint8_t *val = NULL;

	if (!cluster_usable(w)) {
		free(name);
		return 0; /* the cluster does not answer: this node keeps its own */
	}
	if (!name || value_read(fd, size, sha, &val) < 0) {
		free(name);
		log_warn("cache: .cache/%.400s not written to the cluster: out of memory or "
			 "unreadable", path);
		return 0;
	}
	int rc = cluster_note(w, remote_put_named(w->t->remote, name, val, SHA_LEN + size));
	free(val);
	free(name);
	if (rc == 0) {
		publish_dirs(w, path);
		return 0;
	}
	if (rc != -EEXIST)
		return 0;   /* the client logged and counted it; this node keeps its own */
	/* Another node committed other bytes first: theirs stay (when they
	 * check out; a damaged value is not worth more than ours). */
	if (wcluster_fetch(w, path, theirs) < 0)
		return 0;
	if (theirs->size == size && memcmp(theirs->val, sha, SHA_LEN) == 0) {
		wvalue_free(theirs);
		publish_dirs(w, path);
		return 0;
	}
	if (!wcluster_named(w, path)) {
		/* A name renamed away where it was committed (a tool's temporary
		 * name, made again and again): its old value is no entry. Ours
		 * stays here only; no other node is told of it. */
		wvalue_free(theirs);
		return 0;
	}
	return 1;
}

int wcluster_members(struct wtree *w, const char *path, size_t max, char ***names, size_t *count)
{
	char *name = key_name("cachedir", path);

	*names = NULL;
	*count = 0;
	if (!name)
		return -ENOMEM;
	int rc = cluster_usable(w) ? cluster_note(w, remote_members_named(w->t->remote, name, max,
									 WTREE_NAME_MAX, names,
									 count))
				   : -EIO;
	free(name);
	if (rc < 0)
		return rc;
	/* Names from outside become names of the tree only when they are ones. */
	size_t kept = 0;
	for (size_t i = 0; i < *count; i++) {
		if (wtree_name_check((*names)[i]) == 0)
			(*names)[kept++] = (*names)[i];
		else
			free((*names)[i]);
	}
	*count = kept;
	return 0;
}
