/* SPDX-License-Identifier: Apache-2.0 */
/* A write-once tree in the store (<store>/cache/): what a start finds
 * there, and each change of the tree made there first, under the tree's
 * lock, so that the store and the nodes never disagree for another call. */
#include "autoconf.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lib/log.h"
#include "store/store.h"
#include "trees/names.h"
#include "trees/wtree_i.h"

/* What tells an open store directory apart, from one statx (and an ioctl
 * where the file system answers it): its inode number, mtime and
 * generation, 0 where its file system keeps none. A removed directory's
 * inode number goes to the next one made, often within the same clock
 * tick; the inode's generation (ext4, xfs, btrfs: drawn anew at each
 * allocation) tells them apart, and where there is none (tmpfs, whose
 * inode numbers only grow) its birth time. The tree stops asking for the
 * generation once its file system said it has none. */
static int dir_identify(struct wtree *w, int fd, uint64_t *ino, int64_t *mtime, uint64_t *gen)
{
	struct statx sx;
	uint64_t g = 0;
	long v = 0; /* the ioctl says long; file systems write an int */

	if (statx(fd, "", AT_EMPTY_PATH, STATX_INO | STATX_MTIME | STATX_BTIME, &sx) < 0)
		return -errno;
	if (sx.stx_mask & STATX_BTIME)
		g = (uint64_t)sx.stx_btime.tv_sec * 1000000000u + sx.stx_btime.tv_nsec;
	if (!atomic_load_explicit(&w->no_getversion, memory_order_relaxed)) {
		if (ioctl(fd, FS_IOC_GETVERSION, &v) == 0)
			g = (g * 0x9e3779b97f4a7c15ull) ^ (uint32_t)v;
		else if (errno == ENOTTY || errno == EOPNOTSUPP || errno == EINVAL)
			atomic_store_explicit(&w->no_getversion, true, memory_order_relaxed);
	}
	*ino = sx.stx_ino;
	*mtime = sx.stx_mtime.tv_sec;
	*gen = g;
	return 0;
}

static void remove_under(int fd, unsigned depth);

/* <store>/name, made if missing: its descriptor, or -errno with why in err. */
static int subdir_open(struct tree *t, const char *name, char *err, size_t errlen)
{
	int fd = mkdirat(t->store.root_fd, name, 0700) < 0 && errno != EEXIST
			 ? -1
			 : openat(t->store.root_fd, name,
				  O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

	if (fd < 0) {
		int e = errno;
		snprintf(err, errlen, "%s/%s: %s", t->store.path, name, strerror(e));
		return -e;
	}
	return fd;
}

int wdisk_open(struct tree *t, struct wtree *w, char *err, size_t errlen)
{
	if ((w->root_fd = subdir_open(t, w->p->store_dir, err, errlen)) < 0)
		return w->root_fd;
	if ((w->tmp_fd = subdir_open(t, w->p->tmp_dir, err, errlen)) < 0)
		return w->tmp_fd;
	if (t->held.fresh) /* no daemon before: no writer to take back */
		remove_under(w->tmp_fd, WTREE_DEPTH_MAX);
	return 0;
}

int wdisk_header_read(int fd, struct wheader *hd, uint64_t file_size)
{
	if (file_size < WTREE_HEADER || store_pread_all(fd, hd, sizeof(*hd), 0) < 0)
		return -EBADMSG;
	if (memcmp(hd->magic, WTREE_MAGIC, 8) != 0 || hd->size != file_size - WTREE_HEADER)
		return -EBADMSG;
	return 0;
}

/* ---- what a start finds ----------------------------------------------------------- */

struct scan {
	struct tree *t;
	struct wtree *w;
	uint64_t dropped;
};

static void scan_dir(struct scan *s, struct wnode *dir, int fd, unsigned depth);

static void drop_entry(struct scan *s, int dirfd, const char *name, bool is_dir,
		       const char *why)
{
	log_warn("%s: %.255s in the store: %s; dropped", s->w->p->label, name, why);
	if (!is_dir)
		unlinkat(dirfd, name, 0);
	s->dropped++;
}

static void scan_file(struct scan *s, struct wnode *dir, int dirfd, const char *name)
{
	struct stat st;
	struct wheader hd;
	int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);

	if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) ||
	    wdisk_header_read(fd, &hd, (uint64_t)st.st_size) < 0) {
		if (fd >= 0)
			close(fd);
		drop_entry(s, dirfd, name, false, "not a file artfs committed");
		return;
	}
	close(fd);
	struct wnode *n = wnode_new(s->w, dir, name, false);
	if (!n || wnode_insert_locked(s->w, dir, n) < 0) {
		if (n)
			node_unref(&n->node, 1);
		return;
	}
	n->size = hd.size;
	memcpy(n->sha, hd.sha, 32);
	n->mtime = st.st_mtim.tv_sec;
	wnode_ino_set_locked(s->w, n, st.st_ino);
	wnode_lru_touch_locked(s->w, n); /* the order of a start is the store's listing */
	s->w->bytes += n->size;
	s->w->files++;
	node_unref(&n->node, 1); /* its directory holds it */
}

static void scan_entry(struct scan *s, struct wnode *dir, int dirfd, unsigned depth,
		       const char *name, unsigned char type)
{
	uint64_t ino, gen;
	int64_t mtime;

	if (s->w->p->name_check(name) < 0) {
		drop_entry(s, dirfd, name, type == DT_DIR, "not a name of the tree");
		return;
	}
	if (type != DT_DIR) {
		scan_file(s, dir, dirfd, name);
		return;
	}
	int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0 || dir_identify(s->w, fd, &ino, &mtime, &gen) < 0 ||
	    depth + 1 > s->w->p->depth_max) {
		if (fd >= 0)
			close(fd);
		drop_entry(s, dirfd, name, true, "a directory deeper than the tree allows");
		return;
	}
	struct wnode *n = wnode_new(s->w, dir, name, true);
	if (n && wnode_insert_locked(s->w, dir, n) == 0) {
		n->mtime = mtime;
		n->gen = gen;
		wnode_ino_set_locked(s->w, n, ino);
		scan_dir(s, n, fd, depth + 1);
	}
	if (n)
		node_unref(&n->node, 1);
	close(fd);
}

/* The entries of the open directory fd (at its start), read with
 * getdents64 (no DIR stream: a start lists every directory of the tree,
 * and this takes two system calls a directory where opendir took six). */
static void scan_dir(struct scan *s, struct wnode *dir, int fd, unsigned depth)
{
	enum { BUF = 32 * 1024 };
	char *buf = malloc(BUF);
	ssize_t n = buf ? 0 : -1;

	while (n >= 0 && (n = getdents64(fd, buf, BUF)) > 0)
		for (ssize_t off = 0; off < n;) {
			const struct dirent64 *e = (const struct dirent64 *)(buf + off);
			off += e->d_reclen;
			if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
				scan_entry(s, dir, fd, depth, e->d_name, e->d_type);
		}
	if (n < 0)
		log_err("%s: cannot list a directory of the store: %s", s->w->p->label,
			buf ? strerror(errno) : "out of memory");
	free(buf);
}

int wdisk_scan(struct tree *t, struct wtree *w)
{
	struct scan s = { .t = t, .w = w };
	uint64_t ino, gen;
	int64_t mtime;

	int rc = dir_identify(w, w->root_fd, &ino, &mtime, &gen);
	if (rc == 0 && lseek(w->root_fd, 0, SEEK_SET) < 0) /* listed before: from its start */
		rc = -errno;
	if (rc < 0)
		return rc;
	pthread_mutex_lock(&w->mu);
	w->root->gen = gen;
	wnode_ino_set_locked(w, w->root, ino);
	scan_dir(&s, w->root, w->root_fd, 0);
	pthread_mutex_unlock(&w->mu);
	log_info("%s: %llu files, %llu bytes in the store%s", w->p->label,
		 (unsigned long long)w->files, (unsigned long long)w->bytes,
		 s.dropped ? " (some entries dropped: see above)" : "");
	return 0;
}

/* ---- changes ---------------------------------------------------------------------- */

/* The store directory of dir, opened: fd or -errno. */
static int dir_open_locked(struct wtree *w, const struct wnode *dir)
{
	char path[WTREE_PATH_MAX + 2];
	int rc = wnode_path_locked(dir, path, sizeof(path));

	if (rc < 0)
		return rc;
	int fd = openat(w->root_fd, path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	return fd < 0 ? -errno : fd;
}

int wdisk_mkdir_locked(struct wtree *w, struct wnode *n)
{
	int dirfd = dir_open_locked(w, n->parent);
	uint64_t ino;
	int64_t mtime;

	if (dirfd < 0)
		return dirfd;
	int rc = mkdirat(dirfd, n->name, 0700) < 0 && errno != EEXIST ? -errno : 0;
	int fd = -1;
	if (rc == 0 && (fd = openat(dirfd, n->name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW |
				    O_CLOEXEC)) < 0)
		rc = -errno;
	close(dirfd);
	if (rc == 0)
		rc = dir_identify(w, fd, &ino, &mtime, &n->gen);
	if (rc == 0)
		wnode_ino_set_locked(w, n, ino);
	if (fd >= 0)
		close(fd);
	return rc;
}

/* Removes what is under the directory fd, then nothing else. */
static void remove_under(int fd, unsigned depth)
{
	int dup_fd = dup(fd);
	DIR *d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
	struct dirent *e;

	if (!d) {
		if (dup_fd >= 0)
			close(dup_fd);
		return;
	}
	while ((e = readdir(d))) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		if (e->d_type == DT_DIR && depth < WTREE_DEPTH_MAX) {
			int sub = openat(fd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			if (sub >= 0) {
				remove_under(sub, depth + 1);
				close(sub);
			}
			unlinkat(fd, e->d_name, AT_REMOVEDIR);
		} else {
			unlinkat(fd, e->d_name, 0);
		}
	}
	closedir(d);
}

/* n (a file, or a directory with all under it) leaves the store. */
int wdisk_remove_locked(struct wtree *w, struct wnode *n)
{
	int dirfd = dir_open_locked(w, n->parent);

	if (dirfd < 0)
		return dirfd;
	int rc = 0;
	if (n->dir) {
		int fd = openat(dirfd, n->name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (fd >= 0) {
			remove_under(fd, wnode_depth_locked(n));
			close(fd);
		}
		rc = unlinkat(dirfd, n->name, AT_REMOVEDIR) < 0 ? -errno : 0;
	} else {
		rc = unlinkat(dirfd, n->name, 0) < 0 ? -errno : 0;
	}
	close(dirfd);
	return rc == -ENOENT ? 0 : rc;
}

int wdisk_rename_locked(struct wtree *w, struct wnode *n, struct wnode *to_dir, const char *to)
{
	int from = dir_open_locked(w, n->parent);
	int into = from < 0 ? -1 : dir_open_locked(w, to_dir);

	if (from < 0 || into < 0) {
		if (from >= 0)
			close(from);
		return from < 0 ? from : into;
	}
	int rc = renameat2(from, n->name, into, to, RENAME_NOREPLACE) < 0 ? -errno : 0;
	close(from);
	close(into);
	return rc;
}

int wdisk_link_locked(struct wtree *w, struct wnode *n, struct store_tmp *tmp)
{
	char path[WTREE_PATH_MAX + 2];
	struct stat st;
	int rc = wnode_path_locked(n, path, sizeof(path));

	/* By its path below the root: no directory opened per file (.blocks/
	 * links thousands a second). */
	if (rc == 0)
		rc = store_tmp_link(w->root_fd, false, tmp, path);
	if (rc == -EEXIST) { /* a file the tree does not know of (not one it indexed) */
		unlinkat(w->root_fd, path, 0);
		rc = store_tmp_link(w->root_fd, false, tmp, path);
	}
	if (rc == 0 && fstat(tmp->fd, &st) == 0) {
		wnode_ino_set_locked(w, n, st.st_ino);
		n->checked_mtime = st.st_mtim;
		n->checked_ctime = st.st_ctim;
		n->checked = true;
	}
	return rc;
}
