/* SPDX-License-Identifier: Apache-2.0 */
/* A write-once tree across nodes (remote=, DESIGN.md §9, §10). A
 * committed file is <prefix>:<kind>:<path> in the cluster (kind "cache"
 * or "blk"), its SHA-256 then its bytes, created once (SET NX: the first
 * stays); each directory above it names its child in the set
 * <prefix>:<kind>dir:<dir path> (the root's is <prefix>:<kind>dir:), so
 * that a directory exists remotely when some file under it does (a
 * .blocks/ block is named in no set: it is found by its key). Every call
 * here waits on the cluster (bounded by remote_timeout): never under the
 * tree's lock, and only on threads that may wait (the namespace answers
 * "not quick" for the tree with remote=). For .cache/ the cluster
 * unreachable is a miss, for .blocks/ an error (EIO); the client logs and
 * counts its failures (artfs_remote_errors_total). */
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
	if ((was == 0 || mono_ns() - was > CLUSTER_PAUSE_NS) && w->p->cluster_required)
		log_warn("%s: the cluster does not answer; %s/ refuses puts and misses (EIO), "
			 "asking it again every %lld s", w->p->label, w->p->mount_name,
			 CLUSTER_PAUSE_NS / 1000000000ll);
	else if (was == 0 || mono_ns() - was > CLUSTER_PAUSE_NS) /* once an outage */
		log_warn("%s: the cluster does not answer; %s/ answers from this node "
			 "alone, asking it again every %lld s", w->p->label, w->p->mount_name,
			 CLUSTER_PAUSE_NS / 1000000000ll);
	return rc;
}

/* "<kind>:<path>" (dir: "<kind>dir:<path>"), the root's path "." as "":
 * malloc'd, or NULL. */
static char *key_name(const struct wtree *w, bool dir, const char *path)
{
	char kind[32];

	snprintf(kind, sizeof(kind), "%s%s", w->p->remote_kind, dir ? "dir" : "");
	if (strcmp(path, ".") == 0)
		path = "";
	size_t len = strlen(kind) + 1 + strlen(path) + 1;
	char *name = malloc(len);

	if (name)
		snprintf(name, len, "%s:%s", kind, path);
	return name;
}

/* A value from the cluster (val, len: malloc'd, taken) checked before any
 * use: its length and digest. 0 (*out holds it) or -EBADMSG (logged). */
static int value_check(struct wtree *w, const char *path, uint8_t *val, size_t len,
		       struct wvalue *out)
{
	uint8_t sha[SHA_LEN];

	if (len < SHA_LEN || len - SHA_LEN > w->max_file) {
		log_warn("%s: %s/%.400s in the cluster is %zu bytes, not a SHA-256 and at "
			 "most %llu bytes; not served", w->p->label, w->p->mount_name, path, len,
			 (unsigned long long)w->max_file);
		free(val);
		return -EBADMSG;
	}
	sha256_once(val + SHA_LEN, len - SHA_LEN, sha);
	if (memcmp(sha, val, SHA_LEN) != 0) {
		log_warn("%s: %s/%.400s in the cluster fails its SHA-256 check; not served",
			 w->p->label, w->p->mount_name, path);
		free(val);
		return -EBADMSG;
	}
	out->val = val;
	out->size = len - SHA_LEN;
	return 0;
}

int wcluster_fetch_many(struct wtree *w, size_t n, const char *const *paths,
			struct wvalue *out, int *results)
{
	char **names = calloc(n ? n : 1, sizeof(*names));
	uint8_t **vals = calloc(n ? n : 1, sizeof(*vals));
	size_t *lens = calloc(n ? n : 1, sizeof(*lens));
	int rc = names && vals && lens ? 0 : -ENOMEM;

	for (size_t i = 0; i < n; i++)
		results[i] = rc ? rc : -EIO; /* until the cluster answers for it */
	for (size_t i = 0; rc == 0 && i < n; i++)
		if (!(names[i] = key_name(w, false, paths[i])))
			rc = -ENOMEM;
	if (rc == 0 && !cluster_usable(w))
		rc = -EIO;
	if (rc == 0)
		rc = cluster_note(w, remote_get_named_many(w->t->remote, n,
							   (const char *const *)names, vals,
							   lens, results));
	for (size_t i = 0; i < n; i++) {
		out[i] = (struct wvalue){ 0 };
		if (vals && vals[i] && results[i] == 0)
			results[i] = value_check(w, paths[i], vals[i], lens[i], &out[i]);
		else if (vals)
			free(vals[i]);
		if (rc == -ENOMEM && results[i] == -EIO)
			results[i] = -ENOMEM;
		if (names)
			free(names[i]);
	}
	free(names);
	free(vals);
	free(lens);
	return rc;
}

int wcluster_fetch(struct wtree *w, const char *path, struct wvalue *out)
{
	int result = 0;
	int rc = wcluster_fetch_many(w, 1, &path, out, &result);

	return rc == -ENOMEM || rc == -EIO ? rc : result;
}

void wvalue_free(struct wvalue *v)
{
	free(v->val);
	v->val = NULL;
}

/* Each directory above path names its child: one SADD per level, in one
 * pipelined call. Best effort: a failure is the client's to log. */
/* The set of the directory whose path is the first dir_len bytes of path:
 * malloc'd, or NULL. */
static char *dir_set_name(const struct wtree *w, const char *path, size_t dir_len)
{
	char *dir = strndup(path, dir_len);
	char *name = dir ? key_name(w, true, dir_len ? dir : ".") : NULL;

	free(dir);
	return name;
}

/* .blocks/ names directories only: a block is found by its key (GET),
 * and a namespace directory's set of every block would grow without end. */
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
		if (!slash && !w->p->renames)
			break;
		names[n] = dir_set_name(w, path, dir_len);
		members[n] = strndup(path + start, end - start);
		ok = names[n] && members[n];
		n++;
		if (!slash)
			break;
		start = end + 1;
	}
	if (ok && n && cluster_usable(w))
		cluster_note(w, remote_sadd_named(w->t->remote, n, (const char *const *)names,
						  (const char *const *)members, results));
	for (size_t i = 0; i < n; i++) {
		free(names[i]);
		free(members[i]);
	}
}

/* The set of path's directory (malloc'd, or NULL) and path's name in it. */
static char *parent_set(const struct wtree *w, const char *path, const char **member)
{
	const char *slash = strrchr(path, '/');

	*member = slash ? slash + 1 : path;
	return dir_set_name(w, path, slash ? (size_t)(slash - path) : 0);
}

void wcluster_forget(struct wtree *w, const char *path)
{
	const char *member;
	char *name = parent_set(w, path, &member);
	int result;

	if (name && cluster_usable(w))
		cluster_note(w, remote_srem_named(w->t->remote, 1, (const char *const *)&name,
						  &member, &result));
	free(name);
}

void wcluster_remove(struct wtree *w, const char *path, bool is_file)
{
	if (!is_file) {
		wcluster_forget(w, path);
		return;
	}
	const char *member;
	char *set = parent_set(w, path, &member), *key = key_name(w, false, path);

	if (set && key && cluster_usable(w)) /* one round: its set, then its value */
		cluster_note(w, remote_srem_del_named(w->t->remote, set, member, key));
	free(set);
	free(key);
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

int wcluster_claim_value(struct wtree *w, const char *path, const struct wvalue *v,
			struct wvalue *theirs)
{
	char *name = cluster_usable(w) ? key_name(w, false, path) : NULL;

	if (!cluster_usable(w)) {
		free(name);
		/* the cluster does not answer: this node keeps its own (.cache/),
		 * or nothing is committed (.blocks/) */
		return w->p->cluster_required ? -EIO : 0;
	}
	if (!name)
		return w->p->cluster_required ? -ENOMEM : 0;
	int rc = cluster_note(w, remote_put_named(w->t->remote, name, v->val, SHA_LEN + v->size));
	free(name);
	if (rc == 0) {
		publish_dirs(w, path);
		return 0;
	}
	if (rc != -EEXIST) /* the client logged and counted it */
		return w->p->cluster_required ? rc : 0; /* or this node keeps its own */
	/* Another node committed other bytes first: theirs stay (when they
	 * check out; a damaged value is not worth more than ours). */
	if (wcluster_fetch(w, path, theirs) < 0)
		return 0;
	if (theirs->size == v->size && memcmp(theirs->val, v->val, SHA_LEN) == 0) {
		wvalue_free(theirs);
		publish_dirs(w, path);
		return 0;
	}
	if (w->p->renames && !wcluster_named(w, path)) {
		/* A name renamed away where it was committed (a tool's temporary
		 * name, made again and again): its old value is no entry. Ours
		 * stays here only; no other node is told of it. */
		wvalue_free(theirs);
		return 0;
	}
	return 1;
}

int wcluster_claim(struct wtree *w, const char *path, int fd, uint64_t size,
		   const uint8_t sha[SHA_LEN], struct wvalue *theirs)
{
	struct wvalue v = { .size = size };

	if (!cluster_usable(w))
		return w->p->cluster_required ? -EIO : 0;
	if (value_read(fd, size, sha, &v.val) < 0) {
		log_warn("%s: %s/%.400s not written to the cluster: out of memory or "
			 "unreadable", w->p->label, w->p->mount_name, path);
		return w->p->cluster_required ? -ENOMEM : 0;
	}
	int rc = wcluster_claim_value(w, path, &v, theirs);
	wvalue_free(&v);
	return rc;
}

int wcluster_members(struct wtree *w, const char *path, size_t max, char ***names, size_t *count)
{
	char *name = key_name(w, true, path);

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
