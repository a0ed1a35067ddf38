/* SPDX-License-Identifier: Apache-2.0 */
/* The calls of the namespace on a write-once tree (DESIGN.md §9): lookup,
 * attributes, mkdir, rmdir, unlink, rename (the first entry of a name
 * stays), create and open, listings, and the nodes a next daemon finds
 * again. Each change is made in the store and in the nodes under the
 * tree's lock. */
#include "autoconf.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lib/log.h"
#include "remote/remote.h"
#include "state/ids.h"
#include "trees/names.h"
#include "trees/wtree_i.h"

#define WTREE_DIR_ATTR_TIMEOUT 1.0
#define WTREE_LIST_REMOTE_MAX 4096 /* names of one directory a listing fetches */
#define WTREE_MOVED_MAX 100000     /* files of a renamed directory sent to the cluster */

/* ---- the tree --------------------------------------------------------------------- */

static struct wtree **slot_of(struct tree *t, enum wtree_kind kind)
{
	return kind == WTREE_CACHE ? &t->cache : &t->blocks;
}

int wtree_open(struct tree *t, enum wtree_kind kind, char *err, size_t errlen)
{
	const struct wpolicy *p = wpolicy_of(kind);
	struct wtree *w = calloc(1, sizeof(*w));

	if (!w) {
		snprintf(err, errlen, "the %s/ tree: out of memory", p->mount_name);
		return -ENOMEM;
	}
	pthread_mutex_init(&w->mu, NULL);
	pthread_mutex_init(&w->all_mu, NULL);
	w->all.next = w->all.prev = &w->all;
	w->lru.lru_next = w->lru.lru_prev = &w->lru;
	w->t = t;
	w->p = p;
	w->kind = kind;
	wpolicy_counters(t, kind, &w->c);
	w->root_fd = -1;
	w->tmp_fd = -1;
	w->capacity = kind == WTREE_CACHE ? t->cfg->cache_capacity : t->cfg->blocks_capacity;
	w->max_file = kind == WTREE_CACHE ? t->cfg->cache_max_file : t->cfg->max_object;
	w->ttl = kind == WTREE_BLOCKS ? (int64_t)t->cfg->ttl : 0;
	w->seed = (uint64_t)getpid() * 0x9e3779b97f4a7c15ull ^ (uint64_t)clock_now() ^ kind;
	index_set_trees_free(wnode_free_hook);
	w->root = wnode_new(w, NULL, p->mount_name, true);
	int rc = w->root ? wdisk_open(t, w, err, errlen) : -ENOMEM;
	if (rc == 0 && (rc = wdisk_scan(t, w)) < 0)
		snprintf(err, errlen, "%s/%s: %s", t->store.path, p->store_dir, strerror(-rc));
	*slot_of(t, kind) = w;
	if (rc < 0) {
		if (!w->root)
			snprintf(err, errlen, "the %s/ tree: out of memory", p->mount_name);
		wtree_close(t, kind);
		return rc;
	}
	return 0;
}

void wtrees_take_over(struct tree *t)
{
	if (t->cache)
		wtmp_orphans_drop(t, t->cache);
	if (t->blocks)
		wtmp_orphans_drop(t, t->blocks);
}

void wtree_close(struct tree *t, enum wtree_kind kind)
{
	struct wtree *w = *slot_of(t, kind);

	if (!w)
		return;
	wnodes_destroy(w);
	if (w->root_fd >= 0)
		close(w->root_fd);
	if (w->tmp_fd >= 0)
		close(w->tmp_fd);
	pthread_mutex_destroy(&w->mu);
	pthread_mutex_destroy(&w->all_mu);
	free(w);
	*slot_of(t, kind) = NULL;
}

struct node *wtree_root(struct wtree *w)
{
	node_ref(&w->root->node);
	return &w->root->node;
}

struct wtree *wtree_of(const struct node *n)
{
	return ((const struct wnode *)n)->tree;
}

bool wtree_is_blocks_root(const struct node *n)
{
	const struct wnode *w = (const struct wnode *)n;

	return n->type == NODE_CACHE_DIR && w->tree->kind == WTREE_BLOCKS && w == w->tree->root;
}

void wtree_gauges(struct wtree *w, uint64_t *bytes, uint64_t *files, uint64_t *capacity)
{
	pthread_mutex_lock(&w->mu);
	*bytes = w->bytes;
	*files = w->files;
	*capacity = w->capacity;
	pthread_mutex_unlock(&w->mu);
}

bool wtree_pending(const struct node *n)
{
	return n->type == NODE_CACHE_FILE && ((const struct wnode *)n)->state == WNODE_PENDING;
}

/* ---- attributes ------------------------------------------------------------------- */

int wtree_getattr(struct tree *t, struct node *node, struct stat *st, double *timeout)
{
	struct wnode *n = wnode_of(node);
	struct wtree *w = wtree_of(node);
	mode_t mode = n->dir ? S_IFDIR | 0777 : S_IFREG | (n->state == WNODE_PENDING ? 0644 : 0444);

	memset(st, 0, sizeof(*st));
	st->st_ino = node_id(t, node);
	st->st_mode = (mode & S_IFMT) | (mode & 07777 & ~t->cfg->umask);
	st->st_nlink = n->dir ? 2 : 1;
	st->st_uid = t->cfg->uid;
	st->st_gid = t->cfg->gid;
	st->st_blksize = 128 * 1024;
	pthread_mutex_lock(&w->mu);
	st->st_size = n->dir ? 4096 : (off_t)n->size;
	st->st_atim.tv_sec = st->st_mtim.tv_sec = st->st_ctim.tv_sec = n->mtime;
	bool settled = !n->dir && n->state != WNODE_PENDING;
	pthread_mutex_unlock(&w->mu);
	st->st_blocks = (blkcnt_t)((st->st_size + 511) / 512);
	*timeout = settled ? CACHE_FOREVER : n->dir ? WTREE_DIR_ATTR_TIMEOUT : 0;
	return 0;
}

int wtree_setattr(struct tree *t, struct node *node, bool perm, const uint64_t *size)
{
	struct wnode *n = wnode_of(node);

	(void)t;
	if (perm)
		return -EPERM; /* the mount's options say who may do what */
	if (size && (n->dir || *size != n->size))
		return n->dir ? -EISDIR : -EPERM; /* written once: no truncation */
	return 0; /* times: kept as the tree's own (commit, last change) */
}

/* ---- names ------------------------------------------------------------------------ */

/* The live directory dir, or why not. */
static int dir_usable_locked(const struct wnode *dir)
{
	if (!dir->dir)
		return -ENOTDIR;
	return dir->state == WNODE_LIVE ? 0 : -ENOENT;
}

/* The path of dir/name below the tree into buf, when dir is live, the
 * name is not held here, and the path is within the tree's bounds. */
static int child_path(struct wtree *w, struct wnode *dir, const char *name, char *buf,
		      size_t len)
{
	char dpath[WTREE_PATH_MAX + 2];

	pthread_mutex_lock(&w->mu);
	int rc = dir_usable_locked(dir);
	if (rc == 0 && wnode_find_locked(w, dir, name))
		rc = -EEXIST;
	if (rc == 0 && wnode_depth_locked(dir) + 1 > w->p->depth_max)
		rc = -ENAMETOOLONG;
	if (rc == 0)
		rc = wnode_path_locked(dir, dpath, sizeof(dpath));
	pthread_mutex_unlock(&w->mu);
	if (rc < 0)
		return rc;
	if (strcmp(dpath, ".") == 0)
		dpath[0] = '\0';
	int n = snprintf(buf, len, "%s%s%s", dpath, dpath[0] ? "/" : "", name);
	return n < 0 || (size_t)n > w->p->path_max ? -ENAMETOOLONG : 0;
}

int wdir_make(struct wtree *w, struct wnode *dir, const char *name, struct wnode **out)
{
	struct wnode *n = NULL;

	pthread_mutex_lock(&w->mu);
	int rc = dir_usable_locked(dir);
	struct wnode *old = rc == 0 ? wnode_find_locked(w, dir, name) : NULL;
	if (old)
		node_ref(&(n = old)->node);
	else if (rc == 0 && !(n = wnode_new(w, dir, name, true)))
		rc = -ENOMEM;
	if (rc == 0 && !old && (rc = wdisk_mkdir_locked(w, n)) == 0)
		rc = wnode_insert_locked(w, dir, n);
	pthread_mutex_unlock(&w->mu);
	if (rc < 0 && n) {
		node_unref(&n->node, 1);
		n = NULL;
	}
	*out = n;
	return rc;
}

/* A name this node does not hold, asked of the cluster: a file some node
 * committed (fetched, checked, kept here), else a directory some file
 * under it names. Absent or damaged there: ENOENT; the cluster
 * unreachable: EIO (a miss for the caller too, but one that says asking
 * again now would wait again); held here meanwhile: EEXIST. */
static int lookup_remote(struct tree *t, struct wnode *dir, const char *name, struct wnode **out)
{
	struct wtree *w = dir->tree;
	char path[WTREE_PATH_MAX + 2];
	struct wvalue v = { 0 };
	char **names = NULL;
	size_t count = 0;

	*out = NULL;
	int rc = child_path(w, dir, name, path, sizeof(path));
	if (rc < 0)
		return rc;
	rc = wcluster_fetch(w, path, &v);
	if (rc == 0 && w->p->renames && !wcluster_named(w, path))
		wvalue_free(&v), rc = -ENOENT;
	if (rc == 0) {
		rc = wfile_adopt(t, dir, name, &v, true, out);
		wvalue_free(&v);
		return rc;
	}
	if (rc != -ENOENT) /* unreachable: asking again for the directory waits again */
		return rc == -EBADMSG ? -ENOENT : -EIO;
	if (!w->p->renames) /* .blocks/: a directory is named in its parent's set */
		return wcluster_named(w, path) ? wdir_make(w, dir, name, out) : -ENOENT;
	rc = wcluster_members(w, path, 1, &names, &count);
	remote_members_free(names, count);
	if (rc < 0 || count == 0)
		return rc < 0 ? -EIO : -ENOENT;
	return wdir_make(w, dir, name, out);
}

int wtree_lookup(struct tree *t, struct node *node, const char *name, struct node **out)
{
	struct wtree *w = wtree_of(node);
	struct wnode *dir = wnode_of(node);
	int rc = w->p->name_check(name);

	if (rc < 0)
		return rc == -EINVAL ? -ENOENT : rc;
	pthread_mutex_lock(&w->mu);
	rc = dir_usable_locked(dir);
	struct wnode *n = rc == 0 ? wnode_find_locked(w, dir, name) : NULL;
	if (n)
		node_ref(&n->node);
	pthread_mutex_unlock(&w->mu);
	if (rc == 0 && !n && t->remote) {
		rc = lookup_remote(t, dir, name, &n);
		if (rc == -EEXIST) /* placed here meanwhile: look again */
			return wtree_lookup(t, node, name, out);
		if (rc < 0 && rc != -ENOMEM) /* the cluster unreachable, a name it cannot
					      * hold, no room here: a miss, never an error */
			rc = -ENOENT;
	}
	if (rc == 0 && !n)
		rc = -ENOENT;
	if (rc == -ENOENT)
		counter_inc(w->c.misses);
	*out = n ? &n->node : NULL;
	return rc;
}

/* .blocks/.put and .get: names of the root of .blocks/ that no block takes. */
static bool wtree_reserved(const struct wnode *dir, const char *name)
{
	return wtree_is_blocks_root(&dir->node) && (strcmp(name, ".put") == 0 ||
						    strcmp(name, ".get") == 0);
}

/* A new name in dir: checked, free, and not too deep or long. */
static int name_free_locked(struct wtree *w, struct wnode *dir, const char *name)
{
	char path[WTREE_PATH_MAX + 2];
	int rc = dir_usable_locked(dir);

	if (rc == 0)
		rc = w->p->name_check(name);
	if (rc == 0 && wnode_depth_locked(dir) + 1 > w->p->depth_max)
		rc = -ENAMETOOLONG;
	if (rc == 0 && (wnode_path_locked(dir, path, sizeof(path)) < 0 ||
			strlen(path) + 1 + strlen(name) > w->p->path_max))
		rc = -ENAMETOOLONG;
	if (rc == 0 && (wnode_find_locked(w, dir, name) || wtree_reserved(dir, name)))
		rc = -EEXIST;
	return rc;
}

int wtree_mkdir(struct tree *t, struct node *node, const char *name, struct node **out)
{
	struct wtree *w = wtree_of(node);
	struct wnode *dir = wnode_of(node), *n = NULL;

	pthread_mutex_lock(&w->mu);
	int rc = name_free_locked(w, dir, name);
	if (rc == 0 && !(n = wnode_new(w, dir, name, true)))
		rc = -ENOMEM;
	if (rc == 0)
		rc = wdisk_mkdir_locked(w, n);
	if (rc == 0)
		rc = wnode_insert_locked(w, dir, n);
	pthread_mutex_unlock(&w->mu);
	if (rc < 0 && n)
		node_unref(&n->node, 1);
	if (rc < 0 && rc != -EEXIST && rc != -ENOENT && rc != -ENAMETOOLONG && rc != -EINVAL)
		log_err("%s: mkdir %.255s: %s", w->p->label, name, strerror(-rc));
	*out = rc == 0 ? &n->node : NULL; /* its creation reference becomes the kernel's */
	return rc;
}

/* A directory and everything under it leave the tree (the store's copy
 * is removed by the caller). */
static void drop_nodes_locked(struct wtree *w, struct wnode *dir)
{
	struct wdir *d = dir->dir;

	for (size_t i = 0; i < d->nbuckets; i++)
		while (d->buckets[i]) {
			struct wnode *n = d->buckets[i];
			if (n->dir) {
				drop_nodes_locked(w, n);
			} else {
				w->bytes -= n->size;
				w->files--;
				wnode_detach_locked(w, n);
			}
		}
	wnode_detach_locked(w, dir);
}

static void drop_tree_locked(struct wtree *w, struct wnode *dir)
{
	wdisk_remove_locked(w, dir);
	drop_nodes_locked(w, dir);
}

static int rmdir_check_locked(struct wnode *dir, const char *name, struct wnode **n)
{
	int rc = dir_usable_locked(dir);

	*n = rc == 0 ? wnode_find_locked(dir->tree, dir, name) : NULL;
	if (rc == 0)
		rc = !*n ? -ENOENT : !(*n)->dir ? -ENOTDIR
		     : (*n)->dir->count || (*n)->dir->pending ? -ENOTEMPTY : 0;
	return rc;
}

static int unlink_check_locked(struct wnode *dir, const char *name, struct wnode **n)
{
	int rc = dir_usable_locked(dir);

	*n = rc == 0 ? wnode_find_locked(dir->tree, dir, name) : NULL;
	if (rc == 0)
		rc = !*n ? -ENOENT : (*n)->dir ? -EISDIR : 0;
	return rc;
}

/* With remote=, a name removed here leaves the cluster first (its
 * directory's set; a file's value too), so that no node (this one
 * included, a lookup meanwhile) fetches it again: an operator's rm -rf
 * stays done, and the name can be written anew. Copies other nodes
 * fetched before stay theirs. .blocks/ names directories only (a block's
 * cluster value stays until it expires). Then the check again under the
 * lock, and the removal here. */
static void remove_from_cluster(struct tree *t, struct wtree *w, struct wnode *dir,
				const char *name, bool is_dir)
{
	char path[WTREE_PATH_MAX + 2];
	struct wnode *n;

	if (!t->remote || (!is_dir && !w->p->renames))
		return;
	pthread_mutex_lock(&w->mu);
	int rc = is_dir ? rmdir_check_locked(dir, name, &n) : unlink_check_locked(dir, name, &n);
	if (rc == 0)
		rc = wnode_path_locked(n, path, sizeof(path));
	pthread_mutex_unlock(&w->mu);
	if (rc == 0)
		wcluster_remove(w, path, !is_dir);
}

int wtree_rmdir(struct tree *t, struct node *node, const char *name)
{
	struct wtree *w = wtree_of(node);
	struct wnode *dir = wnode_of(node), *n;

	remove_from_cluster(t, w, dir, name, true);
	pthread_mutex_lock(&w->mu);
	int rc = rmdir_check_locked(dir, name, &n);
	if (rc == 0)
		rc = wdisk_remove_locked(w, n);
	if (rc == 0)
		wnode_detach_locked(w, n);
	pthread_mutex_unlock(&w->mu);
	return rc;
}

int wtree_unlink(struct tree *t, struct node *node, const char *name)
{
	struct wtree *w = wtree_of(node);
	struct wnode *dir = wnode_of(node), *n;

	remove_from_cluster(t, w, dir, name, false);
	pthread_mutex_lock(&w->mu);
	int rc = unlink_check_locked(dir, name, &n);
	if (rc == 0)
		wfile_drop_locked(w, n);
	pthread_mutex_unlock(&w->mu);
	return rc;
}

/* ---- rename ----------------------------------------------------------------------- */

/* Whether dir is n or under it (a directory moved into itself). */
static bool is_under_locked(const struct wnode *dir, const struct wnode *n)
{
	for (; dir; dir = dir->parent)
		if (dir == n)
			return true;
	return false;
}

/* src onto the existing dst: the first entry stays, src goes (0); an
 * empty directory holds nothing to keep and is replaced (1). */
static int rename_onto_locked(struct wtree *w, struct wnode *src, struct wnode *dst)
{
	char path[WTREE_PATH_MAX + 2];

	if (src->dir && !dst->dir)
		return -ENOTDIR;
	if (!src->dir && dst->dir)
		return -EISDIR;
	if (src->dir && !dst->dir->count && !dst->dir->pending) {
		int rc = wdisk_remove_locked(w, dst);
		if (rc < 0)
			return rc;
		wnode_detach_locked(w, dst);
		return 1;
	}
	if (src->dir) {
		drop_tree_locked(w, src);
		return 0;
	}
	if (src->size != dst->size || memcmp(src->sha, dst->sha, 32) != 0) {
		counter_inc(w->c.collisions);
		if (wnode_path_locked(dst, path, sizeof(path)) < 0)
			strcpy(path, dst->name);
		log_info("%s: rename onto %s/%.400s, which holds other bytes: they stay",
			 w->p->label, w->p->mount_name, path);
	}
	wfile_drop_locked(w, src);
	return 0;
}

/* src moves to to_dir/to, a free name. */
static int rename_move_locked(struct wtree *w, struct wnode *src, struct wnode *to_dir,
			      const char *to)
{
	char *name = strdup(to);
	int rc = name ? wdisk_rename_locked(w, src, to_dir, to) : -ENOMEM;

	if (rc < 0) {
		free(name);
		return rc;
	}
	uint64_t ino = src->ino;
	node_ref(&src->node); /* across the move: the old directory's reference goes */
	wnode_detach_locked(w, src);
	free(src->name);
	src->name = name;
	rc = wnode_insert_locked(w, to_dir, src);
	if (rc == 0)
		wnode_ino_set_locked(w, src, ino); /* a rename keeps the store inode */
	if (rc == 0 && !src->dir && !src->open)
		wnode_lru_touch_locked(w, src);
	node_unref(&src->node, 1);
	return rc;
}

/* The committed file dir/name, referenced, with its store path; NULL when
 * it is not one. */
static struct wnode *file_find(struct wtree *w, struct wnode *dir, const char *name,
			       char *path, size_t len)
{
	pthread_mutex_lock(&w->mu);
	struct wnode *n = dir_usable_locked(dir) == 0 ? wnode_find_locked(w, dir, name) : NULL;
	if (n && (n->dir || wnode_path_locked(n, path, len) < 0))
		n = NULL;
	if (n)
		node_ref(&n->node);
	pthread_mutex_unlock(&w->mu);
	return n;
}

/* With remote=, a committed file renamed onto a name this node does not
 * hold goes to the cluster under that name first: when another node
 * committed other bytes there first, those become the name here and the
 * source goes (the first stays), 1; else 0 and the rename goes on.
 * spath: the source's path when it is a committed file, else "". */
static int rename_claim(struct tree *t, struct wnode *fdir, const char *from,
			struct wnode *tdir, const char *to, char spath[WTREE_PATH_MAX + 2])
{
	struct wtree *w = fdir->tree;
	char path[WTREE_PATH_MAX + 2];
	struct wvalue theirs = { 0 };
	struct wnode *src = file_find(w, fdir, from, spath, WTREE_PATH_MAX + 2), *n = NULL;

	if (!src)
		return 0;
	int claimed = 0;
	int fd = child_path(w, tdir, to, path, sizeof(path)) < 0 ? -1 :
		 openat(w->root_fd, spath, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd >= 0) {
		claimed = wcluster_claim(w, path, fd, src->size, src->sha, &theirs);
		close(fd);
	}
	if (claimed == 1 && wfile_adopt(t, tdir, to, &theirs, true, &n) == 0) {
		node_unref(&n->node, 1);
		pthread_mutex_lock(&w->mu);
		if (src->state == WNODE_LIVE && src->parent == fdir)
			wfile_drop_locked(w, src);
		pthread_mutex_unlock(&w->mu);
		counter_inc(w->c.collisions);
		log_info("%s: %s/%.400s was committed first by another node with other "
			 "bytes; those stay", w->p->label, w->p->mount_name, path);
	} else {
		claimed = 0;
	}
	wvalue_free(&theirs);
	node_unref(&src->node, 1);
	return claimed;
}

/* The path of the directory dir/name into path; -ENOENT when it is not one. */
static int dir_find_path(struct wtree *w, struct wnode *dir, const char *name, char *path,
			 size_t len)
{
	pthread_mutex_lock(&w->mu);
	struct wnode *n = dir_usable_locked(dir) == 0 ? wnode_find_locked(w, dir, name) : NULL;
	int rc = n && n->dir ? wnode_path_locked(n, path, len) : -ENOENT;
	pthread_mutex_unlock(&w->mu);
	return rc;
}

/* A committed file under a directory renamed here, for the cluster. */
struct moved_file {
	char *path;
	uint64_t size;
	uint8_t sha[32];
};

struct moved_files {
	struct moved_file *v;
	size_t n, cap;
};

/* The committed files under dir, at most WTREE_MOVED_MAX. */
static void moved_collect_locked(struct wnode *dir, struct moved_files *m)
{
	struct wdir *d = dir->dir;
	char path[WTREE_PATH_MAX + 2];

	for (size_t i = 0; i < d->nbuckets; i++)
		for (struct wnode *n = d->buckets[i]; n && m->n < WTREE_MOVED_MAX; n = n->chain) {
			if (n->dir) {
				moved_collect_locked(n, m);
				continue;
			}
			if (m->n == m->cap) {
				size_t cap = m->cap ? 2 * m->cap : 64;
				struct moved_file *v = realloc(m->v, cap * sizeof(*v));
				if (!v)
					return;
				m->v = v;
				m->cap = cap;
			}
			if (wnode_path_locked(n, path, sizeof(path)) < 0 ||
			    !(m->v[m->n].path = strdup(path)))
				continue;
			m->v[m->n].size = n->size;
			memcpy(m->v[m->n].sha, n->sha, 32);
			m->n++;
		}
}

/* A directory renamed here: its committed files go to the cluster under
 * their new paths, as their commits did under the old ones (so that the
 * tools' temporary directory renamed into place is what other nodes
 * find). Bytes another node put under a new path first stay there; this
 * node keeps its own (counted, logged). */
static void rename_dir_publish(struct tree *t, struct wnode *dir)
{
	struct wtree *w = dir->tree;
	struct moved_files m = { 0 };

	pthread_mutex_lock(&w->mu);
	if (dir->state == WNODE_LIVE)
		moved_collect_locked(dir, &m);
	pthread_mutex_unlock(&w->mu);
	for (size_t i = 0; i < m.n; i++) {
		struct wvalue theirs = { 0 };
		int fd = openat(w->root_fd, m.v[i].path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
		if (fd >= 0 && wcluster_claim(w, m.v[i].path, fd, m.v[i].size, m.v[i].sha,
					      &theirs) == 1) {
			counter_inc(w->c.collisions);
			log_info("%s: %s/%.400s is in the cluster with other bytes from another "
				 "node; this node keeps its own", w->p->label, w->p->mount_name, m.v[i].path);
		}
		wvalue_free(&theirs);
		if (fd >= 0)
			close(fd);
		free(m.v[i].path);
	}
	free(m.v);
}

/* A directory's record says where it goes before it moves: a daemon
 * killed after the move but before its answer leaves the kernel to send
 * the rename again, which the next daemon takes as done (the source is
 * gone), and the kernel's entry of the new name then names this node,
 * told by its name or its parent (nodes.c: is_described_locked). A file
 * is told by its digest whatever its name: nothing to write first. The
 * directory, referenced, or NULL. */
static struct wnode *rename_announce(struct wtree *w, struct wnode *fdir, const char *from,
				     struct wnode *tdir, const char *to)
{
	struct held_node d;

	memset(&d, 0, sizeof(d));
	pthread_mutex_lock(&w->mu);
	struct wnode *src = dir_usable_locked(fdir) == 0 && dir_usable_locked(tdir) == 0
				    ? wnode_find_locked(w, fdir, from) : NULL;
	if (src && !src->dir)
		src = NULL;
	if (src) {
		wtree_describe_as_locked(src, tdir, to, &d);
		node_ref(&src->node);
	}
	pthread_mutex_unlock(&w->mu);
	if (src)
		ids_node_redescribe(w->t, &src->node, &d);
	return src;
}

int wtree_rename(struct tree *t, struct node *from_node, const char *from, struct node *to_node,
		 const char *to, unsigned flags)
{
	struct wtree *w = wtree_of(from_node);
	struct wnode *fdir = wnode_of(from_node), *tdir = wnode_of(to_node), *moved = NULL;

	if (tdir->tree != w)
		return -EXDEV;
	if (!w->p->renames)
		return -EPERM; /* a block's name is its key */
	if (flags & ~1u) /* RENAME_NOREPLACE only: an exchange would unsettle committed names */
		return -EINVAL;
	char spath[WTREE_PATH_MAX + 2] = "";
	if (t->remote && !(flags & 1u) && rename_claim(t, fdir, from, tdir, to, spath) == 1) {
		wcluster_forget(w, spath);
		return 0;
	}
	if (t->remote && !spath[0] && dir_find_path(w, fdir, from, spath, sizeof(spath)) < 0)
		spath[0] = '\0';
	struct wnode *announced = rename_announce(w, fdir, from, tdir, to);
	pthread_mutex_lock(&w->mu);
	int rc = dir_usable_locked(fdir);
	struct wnode *src = rc == 0 ? wnode_find_locked(w, fdir, from) : NULL;
	if (rc == 0 && !src)
		rc = -ENOENT;
	struct wnode *dst = NULL;
	if (rc == 0 && (rc = name_free_locked(w, tdir, to)) == -EEXIST) {
		dst = wnode_find_locked(w, tdir, to);
		rc = 0;
	}
	if (rc == 0 && src->dir && is_under_locked(tdir, src))
		rc = -EINVAL;
	if (rc < 0 || dst == src)
		; /* onto itself: nothing changes */
	else if (dst && (flags & 1u))
		rc = -EEXIST;
	else if ((!dst || (rc = rename_onto_locked(w, src, dst)) == 1) &&
		 (rc = rename_move_locked(w, src, tdir, to)) == 0)
		node_ref(&(moved = src)->node);
	pthread_mutex_unlock(&w->mu);
	if (moved && moved->dir && t->remote)
		rename_dir_publish(t, moved);
	if (moved) { /* the next daemon finds it under its new name */
		wtree_redescribe(w, moved);
		node_unref(&moved->node, 1);
	}
	if (announced) { /* it did not move (or another did): as it is */
		if (announced != moved)
			wtree_redescribe(w, announced);
		node_unref(&announced->node, 1);
	}
	/* Other nodes list it by its new name only (a source dropped because
	 * the name held a directory already: by none). */
	if (rc == 0 && spath[0] && !(fdir == tdir && strcmp(from, to) == 0))
		wcluster_forget(w, spath);
	if (rc < 0 && rc != -ENOENT && rc != -EEXIST && rc != -EINVAL && rc != -ENOTDIR &&
	    rc != -EISDIR && rc != -ENAMETOOLONG)
		log_err("%s: rename %.255s to %.255s: %s", w->p->label, from, to, strerror(-rc));
	return rc;
}

/* ---- files ------------------------------------------------------------------------ */

int wtree_create(struct tree *t, struct node *node, const char *name, int flags,
		 struct node **out, struct handle **h, struct open_reply *r)
{
	struct wtree *w = wtree_of(node);
	struct wnode *dir = wnode_of(node), *n = NULL;

	*out = NULL;
	if (ids_request_resent())
		wtmp_unanswered_drop(t, w, ids_request_unique());
	pthread_mutex_lock(&w->mu);
	int rc = name_free_locked(w, dir, name);
	if (rc == -EEXIST) {
		struct wnode *old = wnode_find_locked(w, dir, name);
		/* written once; no old: a name of .blocks/'s batch files */
		rc = (flags & O_EXCL) || !old ? -EEXIST : old->dir ? -EISDIR : -EACCES;
	}
	if (rc == 0 && !(n = wnode_new(w, dir, name, false)))
		rc = -ENOMEM;
	if (rc == 0) {
		dir->dir->pending++;
		n->counted = true;
	}
	pthread_mutex_unlock(&w->mu);
	if (rc < 0)
		return rc;
	node_ref(&n->node); /* the handle's; the creation reference becomes the kernel's */
	rc = wfile_create(t, n, h);
	struct stat st;
	if (rc == 0 && fstat(wfile_fd(*h), &st) == 0) { /* the inode its commit links in */
		pthread_mutex_lock(&w->mu);
		wnode_ino_set_locked(w, n, st.st_ino);
		pthread_mutex_unlock(&w->mu);
	}
	if (rc < 0) {
		pthread_mutex_lock(&w->mu);
		dir->dir->pending--;
		n->counted = false;
		n->state = WNODE_GONE;
		pthread_mutex_unlock(&w->mu);
		node_unref(&n->node, 2);
		return rc;
	}
	memset(r, 0, sizeof(*r));
	r->direct_io = true; /* each write names its file table: its close is told apart */
	*out = &n->node;
	return 0;
}

int wtree_open_file(struct tree *t, struct node *node, int flags, struct handle **h,
		    struct open_reply *r)
{
	struct wnode *n = wnode_of(node);

	if (n->dir)
		return -EISDIR;
	if (n->state == WNODE_PENDING)
		return -ENOENT; /* another process's file, not committed yet */
	if (n->state == WNODE_GONE)
		return -ESTALE; /* the kernel looks the name up again */
	if ((flags & O_ACCMODE) != O_RDONLY || (flags & O_TRUNC))
		return -EACCES; /* written once */
	int rc = wfile_open(t, n, h);
	if (rc == 0) {
		memset(r, 0, sizeof(*r));
		r->keep_cache = true; /* immutable: its pages stay valid */
		r->noflush = true;    /* a reader's close has nothing to say */
	}
	return rc;
}

/* With remote=, a listing shows what other nodes committed too: the names
 * of the directory's set in the cluster that are not here are looked up
 * (fetched, kept) first, at most WTREE_LIST_REMOTE_MAX of them. */
static void list_remote(struct tree *t, struct wnode *dir)
{
	struct wtree *w = dir->tree;
	char path[WTREE_PATH_MAX + 2];
	char **names = NULL;
	size_t count = 0;

	pthread_mutex_lock(&w->mu);
	int rc = dir_usable_locked(dir);
	if (rc == 0)
		rc = wnode_path_locked(dir, path, sizeof(path));
	pthread_mutex_unlock(&w->mu);
	if (rc < 0 || wcluster_members(w, path, WTREE_LIST_REMOTE_MAX, &names, &count) < 0)
		return;
	for (size_t i = 0; i < count; i++) {
		struct wnode *n = NULL;
		rc = lookup_remote(t, dir, names[i], &n);
		if (rc == 0)
			node_unref(&n->node, 1);
		if (rc == -EIO)
			break; /* the cluster went away: each further name would wait too */
	}
	remote_members_free(names, count);
}

void wtree_list(struct tree *t, struct node *node, wtree_list_fn fn, void *ctx)
{
	struct wtree *w = wtree_of(node);
	struct wdir *d = wnode_of(node)->dir;

	if (t->remote && d && w->p->renames) /* .blocks/ lists what this node holds (§7) */
		list_remote(t, wnode_of(node));
	pthread_mutex_lock(&w->mu);
	for (size_t i = 0; d && i < d->nbuckets; i++)
		for (struct wnode *n = d->buckets[i]; n; n = n->chain)
			fn(ctx, n->name, node_id(t, &n->node), n->dir ? DT_DIR : DT_REG);
	pthread_mutex_unlock(&w->mu);
}

void wtree_handle_ready(struct tree *t, struct handle *h)
{
	wfile_recorded(t, h);
}

int wtree_reopen_write(struct tree *t, struct node *n, const struct held_handle *rec,
		       struct handle **h)
{
	if (n->type == NODE_CACHE_FILE && wnode_of(n)->state == WNODE_LIVE)
		return -EALREADY; /* committed before its daemon ended (fsync, a close) */
	if (n->type != NODE_CACHE_FILE || wnode_of(n)->state != WNODE_PENDING)
		return -ENOENT; /* dropped meanwhile: its writes are over */
	return wfile_reopen(t, wnode_of(n), rec, h);
}
