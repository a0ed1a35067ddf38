/* SPDX-License-Identifier: Apache-2.0 */
/* Open files of a write-once tree: a file being written (into a temporary
 * file of <store>/cache-tmp/, named so that a next daemon opens it again;
 * its owner's close commits it, checked and linked in, or drops it where
 * another writer's bytes came first), and a
 * committed file read (checked against its SHA-256 before the first byte
 * when its store file changed since the last check, then served from a
 * mapping of it). */
#include "autoconf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "lib/log.h"
#include "lib/sha256.h"
#include "state/ids.h"
#include "store/store.h"
#include "trees/wtree_i.h"

/* ---- room ------------------------------------------------------------------------- */

void wfile_drop_locked(struct wtree *w, struct wnode *n)
{
	char path[WTREE_PATH_MAX + 2];
	int rc = wdisk_remove_locked(w, n);

	if (rc < 0 && wnode_path_locked(n, path, sizeof(path)) == 0)
		log_warn("%s: removing %s/%.400s from the store: %s", w->p->label,
			 w->p->mount_name, path, strerror(-rc));
	w->bytes -= n->size;
	w->files--;
	wnode_detach_locked(w, n);
}

static void evict_locked(struct tree *t, struct wtree *w, struct wnode *n)
{
	char path[WTREE_PATH_MAX + 2];

	(void)t;
	if (wnode_path_locked(n, path, sizeof(path)) < 0)
		strcpy(path, n->name);
	log_debug("%s: %.400s evicted (%llu bytes)", w->p->label, path, (unsigned long long)n->size);
	counter_inc(w->c.evictions);
	wfile_drop_locked(w, n);
}

/* .blocks/ evicts nothing: what does not fit is refused (counted). */
static int refuse_locked(struct wtree *w)
{
	counter_inc(w->c.evictions); /* blocks_refused */
	return -ENOSPC;
}

/* The file to evict: the least recently opened that was not committed in
 * the last WTREE_EVICT_GRACE seconds (a tool renames the file it just
 * closed into place: evicted in between, its rename fails), else the
 * least recently opened of all; NULL when none can go. */
#define WTREE_EVICT_GRACE 2
static struct wnode *victim_locked(struct wtree *w)
{
	int64_t fresh = clock_now() - WTREE_EVICT_GRACE;
	unsigned looked = 0;

	for (struct wnode *n = w->lru.lru_next; n != &w->lru && looked < 4096;
	     n = n->lru_next, looked++)
		if (n->mtime < fresh)
			return n;
	return w->lru.lru_next == &w->lru ? NULL : w->lru.lru_next;
}

int wfile_make_room_locked(struct tree *t, struct wtree *w, uint64_t need)
{
	if (need > w->capacity)
		return w->p->evict ? -ENOSPC : refuse_locked(w);
	while (w->bytes + w->reserved + need > w->capacity) {
		if (!w->p->evict && !(w->ttl && w->p->collect_locked &&
				      w->p->collect_locked(w, clock_now())))
			return refuse_locked(w);
		if (!w->p->evict)
			continue; /* collected: look again */
		struct wnode *n = victim_locked(w);
		if (!n)
			return -ENOSPC; /* every committed file is open */
		evict_locked(t, w, n);
	}
	return 0;
}

/* ---- writing ---------------------------------------------------------------------- */

struct wwrite {
	struct handle h;
	struct wnode *n;        /* referenced: the writer's node, pending until its commit */
	struct store_tmp tmp;
	uint64_t size;          /* bytes written (the highest end) */
	uint64_t reserved;      /* of the tree's room, for them */
	uint64_t owner;         /* the file table that wrote first (0: unknown) */
	bool written;
	int error;              /* the first failure: its commit answers it */
	bool ended;             /* committed or dropped */
	uint64_t long_name_ino; /* its name kept beside it (wlong_name_keep); 0: none */
};

static struct wtree *tree_of_node(struct wnode *n)
{
	return n->tree;
}

static int write_reserve(struct tree *t, struct wwrite *f, uint64_t end)
{
	struct wtree *w = tree_of_node(f->n);
	int rc = 0;

	if (end <= f->reserved)
		return 0;
	if (end > w->max_file)
		return -EFBIG;
	pthread_mutex_lock(&w->mu);
	rc = wfile_make_room_locked(t, w, end - f->reserved);
	if (rc == 0) {
		w->reserved += end - f->reserved;
		f->reserved = end;
	}
	pthread_mutex_unlock(&w->mu);
	return rc;
}

static void write_unreserve(struct wwrite *f)
{
	struct wtree *w = tree_of_node(f->n);

	pthread_mutex_lock(&w->mu);
	w->reserved -= f->reserved;
	f->reserved = 0;
	pthread_mutex_unlock(&w->mu);
}

static int write_op(struct tree *t, struct handle *h, uint64_t off, const void *buf, size_t len,
		    uint64_t owner)
{
	struct wwrite *f = (struct wwrite *)h;

	if (f->ended)
		return -EACCES; /* committed: immutable */
	if (f->error)
		return f->error;
	if (off > UINT64_MAX - len)
		return -EFBIG;
	int rc = write_reserve(t, f, off + len);
	if (rc == 0)
		rc = store_pwrite_all(f->tmp.fd, buf, len, (off_t)(off + WTREE_HEADER));
	if (rc < 0) {
		if (rc != -EFBIG && rc != -ENOSPC)
			log_err("%s: writing %.255s: %s", f->n->tree->p->label, f->n->name,
				strerror(-rc));
		f->error = rc;
		return rc;
	}
	if (!f->written) {
		f->owner = owner;
		f->written = true;
		struct held_handle *rec = h->fh ? ids_handle_record(t, h->fh) : NULL;
		if (rec) { /* what a next daemon needs to tell its owner's close */
			rec->text_at = owner;
			atomic_store(&rec->state, 1);
		}
	}
	if (off + len > f->size) { /* the writer's own view of its size (getattr) */
		struct wtree *w = tree_of_node(f->n);
		pthread_mutex_lock(&w->mu);
		f->size = f->n->size = off + len;
		pthread_mutex_unlock(&w->mu);
	}
	return (int)len;
}

/* The SHA-256 of the written bytes, read back from the temporary file. */
static int write_digest(struct wwrite *f, uint8_t sha[32])
{
	static const size_t chunk = 1u << 20;
	struct sha256 s;
	char *buf = malloc(chunk);

	if (!buf || sha256_begin(&s) < 0) {
		free(buf);
		return -ENOMEM;
	}
	for (uint64_t at = 0; at < f->size;) {
		size_t n = f->size - at < chunk ? (size_t)(f->size - at) : chunk;
		int rc = store_pread_all(f->tmp.fd, buf, n, (off_t)(at + WTREE_HEADER));
		if (rc < 0) {
			sha256_abandon(&s);
			free(buf);
			return rc;
		}
		sha256_update(&s, buf, n);
		at += n;
	}
	sha256_end(&s, sha);
	free(buf);
	return 0;
}

/* Another entry holds the name: the first stays (DESIGN.md §9). */
static int commit_onto_locked(struct wtree *w, struct wwrite *f, struct wnode *old,
			      const uint8_t sha[32])
{
	char path[WTREE_PATH_MAX + 2];

	if (old->dir)
		return -EISDIR;
	if (old->size == f->size && memcmp(old->sha, sha, 32) == 0)
		return 0;
	counter_inc(w->c.collisions);
	if (wnode_path_locked(old, path, sizeof(path)) < 0)
		strcpy(path, old->name);
	log_info("%s: %.400s was committed first with other bytes; those stay", w->p->label, path);
	return 0;
}

static int commit_locked(struct tree *t, struct wtree *w, struct wwrite *f,
			 const uint8_t sha[32])
{
	struct wnode *n = f->n, *dir = n->parent;

	if (dir->state != WNODE_LIVE)
		return -ENOENT; /* its directory was removed meanwhile */
	struct wnode *old = wnode_find_locked(w, dir, n->name);
	if (old)
		return commit_onto_locked(w, f, old, sha);
	w->reserved -= f->reserved;
	f->reserved = 0;
	int rc = wfile_make_room_locked(t, w, f->size);
	if (rc == 0)
		rc = wdisk_link_locked(w, n, &f->tmp);
	if (rc == 0) {
		if (n->counted)
			dir->dir->pending--;
		n->counted = false;
		rc = wnode_insert_locked(w, dir, n); /* LIVE from here on */
	}
	if (rc < 0)
		return rc;
	n->size = f->size;
	memcpy(n->sha, sha, 32);
	dir->used = n->mtime = clock_now();
	w->bytes += n->size;
	w->files++;
	counter_inc(w->c.commits);
	if (!n->open)
		wnode_lru_touch_locked(w, n);
	return 0;
}

/* A file being written is no more (committed, dropped, or released). */
static void pending_end_locked(struct wnode *n)
{
	if (n->state != WNODE_PENDING)
		return;
	if (n->counted)
		n->parent->dir->pending--;
	n->counted = false;
	n->state = WNODE_GONE;
	wnode_ino_unset_locked(n->tree, n);
}

/* The path of n below the tree, when it is a name the tree does not hold
 * yet (what the cluster is asked about); -EEXIST when it holds it. */
static int path_if_absent(struct wtree *w, struct wnode *n, char *path, size_t len)
{
	pthread_mutex_lock(&w->mu);
	int rc = wnode_find_locked(w, n->parent, n->name) ? -EEXIST
							     : wnode_path_locked(n, path, len);
	pthread_mutex_unlock(&w->mu);
	return rc;
}

/* With remote=, the file goes to the cluster before it is linked in here:
 * if another node committed other bytes under its name first, those are
 * what this node commits instead (DESIGN.md §9: the first stays), so that
 * no reader here ever sees a second version of the name. */
static int commit_claim(struct wtree *w, struct wwrite *f, struct wheader *hd)
{
	char path[WTREE_PATH_MAX + 2];
	struct wvalue theirs = { 0 };

	if (path_if_absent(w, f->n, path, sizeof(path)) < 0)
		return 0; /* held here: the commit meets it (the first stays) */
	int claimed = wcluster_claim(w, path, f->tmp.fd, f->size, hd->sha, &theirs);
	if (claimed <= 0)
		return claimed; /* .blocks/: the cluster did not take it (nothing committed) */
	int rc = theirs.size ? store_pwrite_all(f->tmp.fd, theirs.val + 32, theirs.size,
						WTREE_HEADER) : 0;
	if (rc == 0 && ftruncate(f->tmp.fd, (off_t)(WTREE_HEADER + theirs.size)) < 0)
		rc = -errno;
	if (rc == 0) {
		pthread_mutex_lock(&w->mu);
		f->size = f->n->size = theirs.size;
		pthread_mutex_unlock(&w->mu);
		hd->size = theirs.size;
		memcpy(hd->sha, theirs.val, 32);
		counter_inc(w->c.collisions);
		log_info("%s: %s/%.400s was committed first by another node with other "
			 "bytes; those stay", w->p->label, w->p->mount_name, path);
	}
	wvalue_free(&theirs);
	return rc;
}

/* The file is no longer written: a name kept beside it goes with it (a
 * writer's close returns before the kernel sends the release). */
static void long_name_end(struct wtree *w, struct wwrite *f)
{
	if (f->long_name_ino)
		wlong_name_drop(w, f->long_name_ino);
	f->long_name_ino = 0;
}

static int commit(struct tree *t, struct wwrite *f)
{
	struct wtree *w = tree_of_node(f->n);
	struct wheader hd = { .size = f->size };
	int rc = f->error;

	f->ended = true;
	if (rc == 0)
		rc = write_digest(f, hd.sha);
	if (rc == 0 && t->remote)
		rc = commit_claim(w, f, &hd);
	memcpy(hd.magic, WTREE_MAGIC, 8);
	if (rc == 0)
		rc = store_pwrite_all(f->tmp.fd, &hd, sizeof(hd), 0);
	pthread_mutex_lock(&w->mu);
	if (rc == 0)
		rc = commit_locked(t, w, f, hd.sha);
	bool linked = f->n->state == WNODE_LIVE;
	pending_end_locked(f->n); /* dropped, when it did not become the entry */
	pthread_mutex_unlock(&w->mu);
	if (linked) /* the next daemon finds it by its digest too */
		wtree_redescribe(w, f->n);
	if (f->reserved)
		write_unreserve(f);
	store_tmp_close(&f->tmp);
	long_name_end(w, f);
	if (rc < 0 && rc != -ENOSPC && rc != -EFBIG && rc != -ENOENT)
		log_err("%s: committing %.255s: %s", w->p->label, f->n->name, strerror(-rc));
	return rc;
}

/* Never committed: what was written goes. */
static void drop(struct wwrite *f)
{
	struct wtree *w = tree_of_node(f->n);

	f->ended = true;
	if (f->reserved)
		write_unreserve(f);
	store_tmp_close(&f->tmp);
	long_name_end(w, f);
	pthread_mutex_lock(&w->mu);
	pending_end_locked(f->n);
	pthread_mutex_unlock(&w->mu);
}

/* The close of a descriptor by the file table that wrote commits what it
 * wrote. A close before any write (a shell's dup2 and close of the
 * descriptor it redirects) commits nothing: the file is still to be
 * written, and one never written is committed empty at its release. A
 * close by a process being killed drops the file. */
static int flush_op(struct tree *t, struct handle *h, uint64_t owner)
{
	struct wwrite *f = (struct wwrite *)h;

	if (owner == TREE_OWNER_KILLED && !f->ended) {
		drop(f);
		log_info("%s: %.255s dropped: its writer was killed before it closed it",
			 f->n->tree->p->label, f->n->name);
		return 0;
	}
	if (f->ended || !f->written || (owner && f->owner && owner != f->owner))
		return 0; /* nothing written yet, or another file table's close */
	return commit(t, f);
}

static int fsync_op(struct tree *t, struct handle *h)
{
	struct wwrite *f = (struct wwrite *)h;

	return f->ended ? 0 : commit(t, f);
}

static void write_release(struct tree *t, struct handle *h)
{
	struct wwrite *f = (struct wwrite *)h;

	if (f->ended) {
	} else if (t->handing_over) { /* drained: its writer goes on with the next daemon */
		f->tmp.name[0] = '\0'; /* which opens the temporary file again by name */
		close(f->tmp.fd);
		f->tmp.fd = -1;
		f->ended = true; /* its long name stays, for the next daemon */
	} else if (!f->written && !t->closing) { /* an empty file: nothing to be partial */
		commit(t, f);
	} else { /* its writer's close never came (the daemon stops; another table closed) */
		drop(f);
		log_info("%s: %.255s dropped: released before its writer closed it",
			 f->n->tree->p->label, f->n->name);
	}
	struct wtree *w = tree_of_node(f->n);
	pthread_mutex_lock(&w->mu);
	pending_end_locked(f->n);
	pthread_mutex_unlock(&w->mu);
	node_unref(&f->n->node, 1);
	free(f);
}

static bool write_quick(struct tree *t, struct handle *h, size_t len)
{
	(void)t;
	(void)h;
	return len <= HANDLE_QUICK_BYTES;
}

static bool flush_quick(struct tree *t, struct handle *h)
{
	/* With remote=, a commit waits on the cluster. */
	return !t->remote && ((struct wwrite *)h)->size <= HANDLE_QUICK_BYTES;
}

static const struct handle_ops write_ops = {
	.kind = "cache file being written",
	.write = write_op,
	.flush = flush_op,
	.fsync = fsync_op,
	.release = write_release,
	.write_quick = write_quick,
	.flush_quick = flush_quick,
	.release_slow = true,
	.held_kind = HANDLE_CACHE_WRITE,
};

/* n: the pending node, referenced by the caller for the handle. */
int wfile_create(struct tree *t, struct wnode *n, struct handle **h)
{
	struct wwrite *f = calloc(1, sizeof(*f));

	if (!f)
		return -ENOMEM;
	static atomic_ulong counter;
	struct wtree *w = tree_of_node(n);

	snprintf(f->tmp.name, sizeof(f->tmp.name), WFILE_TMP_PREFIX "%ld.%lu", (long)getpid(),
		 atomic_fetch_add(&counter, 1));
	f->tmp.dirfd = w->tmp_fd;
	f->tmp.fd = openat(w->tmp_fd, f->tmp.name,
			   O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (f->tmp.fd < 0) {
		int rc = -errno;
		log_err("%s: a temporary file for %.255s: %s", w->p->label, n->name, strerror(-rc));
		free(f);
		return rc;
	}
	/* A name the holder's record cannot keep whole is kept beside the
	 * temporary file, for a next daemon (nodes.c: revive_pending_locked). */
	struct stat st;
	if (strlen(n->name) >= HELD_NAME_MAX && fstat(f->tmp.fd, &st) == 0) {
		int rc = wlong_name_keep(w, st.st_ino, n->name);
		if (rc == 0)
			f->long_name_ino = st.st_ino;
		else /* its writer gets EIO if a daemon takes over meanwhile */
			log_err("%s: %.255s: keeping its name for a next daemon: %s", w->p->label,
				n->name, strerror(-rc));
	}
	handle_init(&f->h, &write_ops);
	f->n = n;
	*h = &f->h;
	return 0;
}

int wfile_fd(struct handle *h)
{
	return ((struct wwrite *)h)->tmp.fd;
}

void wfile_recorded(struct tree *t, struct handle *h)
{
	struct wwrite *f = (struct wwrite *)h;
	struct held_handle *rec = h->fh ? ids_handle_record(t, h->fh) : NULL;

	if (!rec)
		return;
	uint64_t unique = ids_request_unique(); /* the create's: it may be sent again */

	memset(rec->key, 0, sizeof(rec->key));
	memcpy(rec->key, f->tmp.name, strnlen(f->tmp.name, sizeof(rec->key) - 1));
	memset(rec->sha, 0, sizeof(rec->sha));
	memcpy(rec->sha, &unique, sizeof(unique));
	rec->text_at = 0;
	atomic_store(&rec->state, 0);
}

int wfile_reopen(struct tree *t, struct wnode *n, const struct held_handle *rec,
		 struct handle **h)
{
	struct wtree *w = tree_of_node(n);
	struct wwrite *f = calloc(1, sizeof(*f));
	struct stat st;

	if (!f)
		return -ENOMEM;
	memcpy(f->tmp.name, rec->key, sizeof(rec->key) < sizeof(f->tmp.name) ? sizeof(rec->key)
									      : sizeof(f->tmp.name));
	f->tmp.name[sizeof(f->tmp.name) - 1] = '\0';
	f->tmp.dirfd = w->tmp_fd;
	f->tmp.fd = f->tmp.name[0] && !strchr(f->tmp.name, '/')
			    ? openat(w->tmp_fd, f->tmp.name, O_RDWR | O_NOFOLLOW | O_CLOEXEC) : -1;
	if (f->tmp.fd < 0 || fstat(f->tmp.fd, &st) < 0) {
		int rc = f->tmp.fd < 0 ? -ENOENT : -errno;
		if (f->tmp.fd >= 0)
			close(f->tmp.fd);
		free(f);
		return rc;
	}
	handle_init(&f->h, &write_ops);
	f->n = n;
	f->size = st.st_size > WTREE_HEADER ? (uint64_t)st.st_size - WTREE_HEADER : 0;
	f->owner = rec->text_at;
	f->written = atomic_load(&rec->state) != 0;
	f->long_name_ino = strlen(n->name) >= HELD_NAME_MAX ? n->ino : 0; /* revived by it */
	pthread_mutex_lock(&w->mu);
	n->size = f->size;
	if (n->state == WNODE_PENDING && !n->counted) {
		n->counted = true;
		n->parent->dir->pending++;
	}
	pthread_mutex_unlock(&w->mu);
	node_ref(&n->node);
	int rc = write_reserve(t, f, f->size);
	if (rc < 0)
		f->error = rc;
	*h = &f->h;
	return 0;
}

/* ---- reading ---------------------------------------------------------------------- */

struct wread {
	struct handle h;
	struct wnode *n;        /* referenced */
	void *map;              /* the store file, header included; NULL when empty */
	size_t map_len;
	uint64_t size;
};

static int read_op(struct tree *t, struct handle *h, uint64_t off, size_t size,
		   const void **data, size_t *len)
{
	struct wread *f = (struct wread *)h;

	(void)t;
	if (f->n->damaged)
		return -EIO;
	buffer_slice(f->map ? (char *)f->map + WTREE_HEADER : NULL, f->size, off, size, data, len);
	return 0;
}

static bool read_quick(struct tree *t, struct handle *h)
{
	(void)t;
	return ((struct wread *)h)->size <= HANDLE_QUICK_BYTES;
}

static void read_release(struct tree *t, struct handle *h)
{
	struct wread *f = (struct wread *)h;
	struct wtree *w = tree_of_node(f->n);

	(void)t;
	if (f->map)
		munmap(f->map, f->map_len);
	pthread_mutex_lock(&w->mu);
	if (--f->n->open == 0 && f->n->state == WNODE_LIVE)
		wnode_lru_touch_locked(w, f->n);
	pthread_mutex_unlock(&w->mu);
	node_unref(&f->n->node, 1);
	free(f);
}

static const struct handle_ops read_ops = {
	.kind = "cache file",
	.read = read_op,
	.release = read_release,
	.read_quick = read_quick,
	.held_kind = HANDLE_CACHE_READ,
};

/* The store file changed since its last check, or was never checked. */
static bool needs_check(const struct wnode *n, const struct stat *st)
{
	return !n->checked || (uint64_t)st->st_ino != n->ino ||
	       st->st_mtim.tv_sec != n->checked_mtime.tv_sec ||
	       st->st_mtim.tv_nsec != n->checked_mtime.tv_nsec ||
	       st->st_ctim.tv_sec != n->checked_ctime.tv_sec ||
	       st->st_ctim.tv_nsec != n->checked_ctime.tv_nsec;
}

/* The mapping's header and bytes against what the commit recorded. */
static bool map_matches(const struct wread *f, const struct wnode *n)
{
	const struct wheader *hd = f->map;
	uint8_t sha[32];

	if (f->map_len != WTREE_HEADER + n->size || memcmp(hd->magic, WTREE_MAGIC, 8) != 0 ||
	    hd->size != n->size || memcmp(hd->sha, n->sha, 32) != 0)
		return false;
	sha256_once((const char *)f->map + WTREE_HEADER, n->size, sha);
	return memcmp(sha, n->sha, 32) == 0;
}

/* A committed file failed its check. In .cache/: gone from the tree, a
 * miss from now on (the tool builds it again); open readers get EIO. In
 * .blocks/: it stays, and every open of it is EIO (fail closed: nothing
 * can build an R3 block again; unlink removes it). */
static void damaged(struct tree *t, struct wnode *n, const char *why)
{
	struct wtree *w = tree_of_node(n);
	char path[WTREE_PATH_MAX + 2];

	(void)t;
	pthread_mutex_lock(&w->mu);
	if (wnode_path_locked(n, path, sizeof(path)) < 0)
		strcpy(path, n->name);
	bool first = !n->damaged;
	n->damaged = true;
	if (n->state == WNODE_LIVE && w->p->damaged_is_miss) {
		log_err("%s: %s/%.400s %s in the store; dropped (a miss from now on)",
			w->p->label, w->p->mount_name, path, why);
		counter_inc(w->c.damaged);
		wfile_drop_locked(w, n);
	} else if (n->state == WNODE_LIVE && first) {
		log_err("%s: %s/%.400s %s in the store; served as EIO", w->p->label,
			w->p->mount_name, path, why);
		counter_inc(w->c.damaged);
	}
	pthread_mutex_unlock(&w->mu);
}

static int read_map(struct wread *f, int fd, const struct stat *st)
{
	f->map_len = (size_t)st->st_size;
	if (f->map_len == 0)
		return 0;
	f->map = mmap(NULL, f->map_len, PROT_READ, MAP_SHARED, fd, 0);
	if (f->map == MAP_FAILED) {
		f->map = NULL;
		return -errno;
	}
	return 0;
}

/* The store file of n, opened: fd or -errno. */
static int store_file_open(struct wtree *w, struct wnode *n)
{
	char path[WTREE_PATH_MAX + 2];

	pthread_mutex_lock(&w->mu);
	int rc = n->state != WNODE_LIVE ? -ESTALE : wnode_path_locked(n, path, sizeof(path));
	if (rc == 0) {
		n->open++; /* held open: not evicted from here on */
		n->parent->used = clock_now();
		wnode_lru_remove_locked(w, n);
	}
	pthread_mutex_unlock(&w->mu);
	if (rc < 0)
		return rc;
	int fd = openat(w->root_fd, path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	return fd < 0 ? -errno : fd;
}

static int read_check(struct tree *t, struct wread *f, int fd)
{
	struct wnode *n = f->n;
	struct stat st;

	if (fstat(fd, &st) < 0)
		return -errno;
	int rc = read_map(f, fd, &st);
	if (rc < 0)
		return rc;
	struct wtree *w = tree_of_node(n);
	if (!w->p->check_every_open && !needs_check(n, &st) &&
	    f->map_len == WTREE_HEADER + n->size)
		return 0;
	if (!f->map || !map_matches(f, n)) {
		damaged(t, n, f->map_len == WTREE_HEADER + n->size ? "failed its SHA-256 check"
								    : "has the wrong size");
		/* a miss: the kernel looks the name up again (ENOENT) */
		return w->p->damaged_is_miss ? -ESTALE : -EIO;
	}
	pthread_mutex_lock(&tree_of_node(n)->mu);
	n->checked_mtime = st.st_mtim;
	n->checked_ctime = st.st_ctim;
	n->checked = true;
	pthread_mutex_unlock(&tree_of_node(n)->mu);
	return 0;
}

int wfile_open(struct tree *t, struct wnode *n, struct handle **h)
{
	struct wtree *w = tree_of_node(n);
	struct wread *f = calloc(1, sizeof(*f));

	if (!f)
		return -ENOMEM;
	handle_init(&f->h, &read_ops);
	f->n = n;
	f->size = n->size;
	node_ref(&n->node);
	int fd = store_file_open(w, n);
	int rc = fd < 0 ? fd : read_check(t, f, fd);
	if (fd >= 0)
		close(fd);
	if (fd == -ENOENT) {
		damaged(t, n, "is missing");
		rc = w->p->damaged_is_miss ? -ESTALE : -EIO;
	}
	if (rc < 0) {
		if (fd != -ESTALE)
			read_release(t, &f->h); /* its open count goes again */
		else {
			node_unref(&n->node, 1);
			free(f);
		}
		return rc;
	}
	counter_inc(w->c.hits);
	*h = &f->h;
	return 0;
}

/* The bytes of the committed file n (size n->size) into dst, checked
 * against its SHA-256 (a .blocks/ .get): 0, -EIO (damaged: logged,
 * counted), -ESTALE (gone meanwhile), -errno. */
int wfile_load(struct tree *t, struct wnode *n, uint8_t *dst, uint64_t size)
{
	struct wtree *w = tree_of_node(n);
	struct wheader hd;
	uint8_t sha[32];
	struct stat st;
	int fd = store_file_open(w, n);
	int rc = fd < 0 ? fd : fstat(fd, &st) < 0 ? -errno : 0;

	if (rc == 0 && (uint64_t)st.st_size != WTREE_HEADER + size)
		rc = -EBADMSG;
	if (rc == 0)
		rc = wdisk_header_read(fd, &hd, (uint64_t)st.st_size);
	if (rc == 0 && size)
		rc = store_pread_all(fd, dst, size, WTREE_HEADER);
	if (rc == 0) {
		sha256_once(dst, size, sha);
		if (memcmp(sha, n->sha, 32) != 0 || memcmp(hd.sha, n->sha, 32) != 0)
			rc = -EBADMSG;
	}
	if (fd >= 0)
		close(fd);
	if (fd != -ESTALE) {
		pthread_mutex_lock(&w->mu);
		if (--n->open == 0 && n->state == WNODE_LIVE)
			wnode_lru_touch_locked(w, n);
		pthread_mutex_unlock(&w->mu);
	}
	if (rc == -EBADMSG || rc == -ENOENT) {
		damaged(t, n, rc == -ENOENT ? "is missing" : "failed its SHA-256 check");
		rc = -EIO;
	}
	if (rc == 0)
		counter_inc(w->c.hits);
	return rc;
}

/* ---- a file fetched from another node ---------------------------------------------- */

/* v's bytes and header into a new temporary file of the store. */
static int adopt_write(struct tree *t, const struct wvalue *v, struct store_tmp *tmp)
{
	struct wheader hd = { .size = v->size };
	int rc = store_tmp_open(&t->store, tmp, WTREE_HEADER + v->size); /* its pages ahead */

	if (rc < 0)
		return rc;
	memcpy(hd.magic, WTREE_MAGIC, 8);
	memcpy(hd.sha, v->val, 32);
	/* Header and bytes in one call (.blocks/ writes thousands a second). */
	struct iovec iov[2] = { { &hd, sizeof(hd) }, { v->val + 32, v->size } };
	ssize_t n = pwritev(tmp->fd, iov, 2, 0);
	if (n < 0)
		rc = -errno;
	else if ((size_t)n < sizeof(hd)) /* short: the rest one piece at a time */
		rc = store_pwrite_all(tmp->fd, &hd, sizeof(hd), 0);
	if (rc == 0 && (size_t)n < sizeof(hd) + v->size) {
		size_t done = (size_t)n > sizeof(hd) ? (size_t)n - sizeof(hd) : 0;
		rc = store_pwrite_all(tmp->fd, v->val + 32 + done, v->size - done,
				      (off_t)(WTREE_HEADER + done));
	}
	if (rc < 0)
		store_tmp_close(tmp);
	return rc;
}

/* n, a new node, linked in as dir/name, committed with v's bytes. */
static int adopt_locked(struct tree *t, struct wtree *w, struct wnode *n, struct store_tmp *tmp,
			const struct wvalue *v)
{
	int rc = wfile_make_room_locked(t, w, v->size);

	if (rc == 0)
		rc = wdisk_link_locked(w, n, tmp);
	if (rc == 0)
		rc = wnode_insert_locked(w, n->parent, n); /* LIVE from here on */
	if (rc < 0)
		return rc;
	n->size = v->size;
	memcpy(n->sha, v->val, 32);
	n->parent->used = clock_now();
	w->bytes += n->size;
	w->files++;
	wnode_lru_touch_locked(w, n);
	return 0;
}

int wfile_adopt(struct tree *t, struct wnode *dir, const char *name, const struct wvalue *v,
		bool fetched, struct wnode **out)
{
	struct wtree *w = dir->tree;
	struct store_tmp tmp;
	struct wnode *n = NULL;
	int rc = adopt_write(t, v, &tmp);

	if (rc < 0) {
		log_err("%s: keeping %.255s: %s", w->p->label, name, strerror(-rc));
		return rc;
	}
	pthread_mutex_lock(&w->mu);
	struct wnode *old = dir->state == WNODE_LIVE ? wnode_find_locked(w, dir, name) : NULL;
	if (dir->state != WNODE_LIVE)
		rc = -ENOENT;
	else if (old) /* another call placed it meanwhile: that one stays */
		node_ref(&(n = old)->node);
	else if (!(n = wnode_new(w, dir, name, false)))
		rc = -ENOMEM;
	else
		rc = adopt_locked(t, w, n, &tmp, v); /* its creation reference: the caller's */
	pthread_mutex_unlock(&w->mu);
	store_tmp_close(&tmp);
	if (rc < 0 && n && n != old) {
		pthread_mutex_lock(&w->mu);
		n->state = WNODE_GONE;
		wnode_ino_unset_locked(w, n);
		pthread_mutex_unlock(&w->mu);
		node_unref(&n->node, 1);
	}
	if (rc < 0) {
		if (rc != -ENOENT && rc != -ENOSPC)
			log_err("%s: keeping %.255s: %s", w->p->label, name, strerror(-rc));
		return rc;
	}
	if (n != old) {
		counter_inc(fetched ? w->c.remote_hits : w->c.commits);
		wtree_redescribe(w, n); /* the next daemon finds it as a local commit */
	}
	*out = n;
	return 0;
}
