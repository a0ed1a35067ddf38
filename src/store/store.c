/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/key.h"
#include "lib/log.h"
#include "store/store.h"
#include "store/tmp_pool.h"

/* A sharded directory's path: <x>/<name>, an object name of at most
 * ARTFS_HASH_HEX_MAX digits. */
#define OBJECT_PATH_MAX 140

/* Where the object named name lies in its version directory: name itself,
 * or in a sharded one (the key-only version's) <x>/name, x being the
 * first digit of the name. */
static const char *object_path(const char *name, bool sharded, char buf[OBJECT_PATH_MAX])
{
	if (!sharded)
		return name;
	size_t n = strnlen(name, OBJECT_PATH_MAX - 3);
	buf[0] = name[0];
	buf[1] = '/';
	memcpy(buf + 2, name, n);
	buf[n + 2] = '\0';
	return buf;
}

/* Takes the store's exclusive lock on lock_fd: 0, or -EBUSY (another
 * holder has it, named in err) or another -errno. */
static int lock_take(int lock_fd, const char *path, char *err, size_t errlen)
{
	char pid[32];
	int rc;

	/* A mount that was just unmounted may still be finishing: give it a
	 * few seconds before calling the store busy. */
	for (int tries = 0;; tries++) {
		rc = flock(lock_fd, LOCK_EX | LOCK_NB);
		if (rc == 0 || errno != EWOULDBLOCK || tries == 100)
			break;
		usleep(50 * 1000);
	}
	if (rc == 0)
		return 0;
	int e = errno;
	ssize_t n = pread(lock_fd, pid, sizeof(pid) - 1, 0);
	pid[n > 0 ? n : 0] = '\0';
	pid[strcspn(pid, "\n")] = '\0';
	if (e == EWOULDBLOCK)
		snprintf(err, errlen,
			 "store %s is in use by another artfs daemon (pid %s); "
			 "unmount that one first or choose another store=",
			 path, pid[0] ? pid : "unknown");
	else
		snprintf(err, errlen, "store %s: cannot lock: %s", path, strerror(e));
	return e == EWOULDBLOCK ? -EBUSY : -e;
}

/* The lock file under root_fd, locked: its fd, or -errno. */
static int lock_open(int root_fd, const char *path, char *err, size_t errlen)
{
	int fd = openat(root_fd, "lock", O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);

	if (fd < 0) {
		int e = errno;
		snprintf(err, errlen, "store %s: cannot open its lock file: %s", path, strerror(e));
		return -e;
	}
	int rc = lock_take(fd, path, err, errlen);
	if (rc < 0) {
		close(fd);
		return rc;
	}
	store_lock_note_pid(fd);
	return fd;
}

void store_lock_note_pid(int lock_fd)
{
	char pid[32];
	int n = snprintf(pid, sizeof(pid), "%ld\n", (long)getpid());

	if (ftruncate(lock_fd, 0) < 0 || store_pwrite_all(lock_fd, pid, (size_t)n, 0) < 0)
		log_warn("store: cannot record the pid holding it in its lock file");
}

void store_note_pid(struct store *s)
{
	store_lock_note_pid(s->lock_fd);
}

/* A directory under dirfd, made if missing (mode 0700), opened without
 * following links: fd or -errno. */
static int subdir(int dirfd, const char *name)
{
	if (mkdirat(dirfd, name, 0700) < 0 && errno != EEXIST)
		return -errno;
	int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	return fd < 0 ? -errno : fd;
}

static int open_tmp_dirs(struct store *s, char *err, size_t errlen)
{
	int tmp = subdir(s->root_fd, "tmp");

	for (int k = 0; tmp >= 0 && k < STORE_TMP_DIRS; k++) {
		char name[16];
		snprintf(name, sizeof(name), "%d", k);
		s->tmp_fd[k] = subdir(tmp, name);
		if (s->tmp_fd[k] < 0) {
			snprintf(err, errlen, "store %s: tmp/%s: %s", s->path, name,
				 strerror(-s->tmp_fd[k]));
			close(tmp);
			return s->tmp_fd[k];
		}
	}
	if (tmp < 0) {
		snprintf(err, errlen, "store %s: tmp/: %s", s->path, strerror(-tmp));
		return tmp;
	}
	close(tmp);
	return 0;
}

/* <store>/<name>, made if missing (mode 0700) and opened without following
 * links: fd, or -errno with why in err. */
static int top_dir(struct store *s, const char *name, char *err, size_t errlen)
{
	if (mkdirat(s->root_fd, name, 0700) < 0 && errno != EEXIST) {
		int e = errno;
		snprintf(err, errlen, "store %s: cannot create %s/: %s", s->path, name, strerror(e));
		return -e;
	}
	int fd = openat(s->root_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		int e = errno;
		snprintf(err, errlen, "store %s: %s/: %s", s->path, name, strerror(e));
		return -e;
	}
	return fd;
}

/* The store's directory, made if missing (mode 0700; create false: not
 * made), opened without following links, this user's, mode 0700: its fd,
 * or -errno (err). */
static int root_open(const char *path, bool create, char *err, size_t errlen)
{
	struct stat st;
	int rc;

	if (create && mkdir(path, 0700) < 0 && errno != EEXIST) {
		rc = -errno;
		snprintf(err, errlen, "store %s: cannot create: %s", path, strerror(errno));
		return rc;
	}
	int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		rc = -errno;
		snprintf(err, errlen, "store %s: %s", path,
			 errno == ELOOP || errno == ENOTDIR ? "not a directory (links are not followed)"
			 : errno == ENOENT && !create ? "no such directory (moved or removed since the "
							"mount: this mount's store is elsewhere)"
			 : strerror(errno));
		return rc;
	}
	if (fstat(fd, &st) < 0) {
		rc = -errno;
		snprintf(err, errlen, "store %s: %s", path, strerror(errno));
	} else if (st.st_uid != geteuid()) {
		rc = -EPERM;
		snprintf(err, errlen, "store %s is owned by uid %u, not by this daemon (uid %u)",
			 path, (unsigned)st.st_uid, (unsigned)geteuid());
	} else if ((st.st_mode & 07777) != 0700) {
		log_warn("store %s had mode %04o; setting 0700", path, (unsigned)(st.st_mode & 07777));
		rc = fchmod(fd, 0700) < 0 ? -errno : 0;
		if (rc < 0)
			snprintf(err, errlen, "store %s: cannot set mode 0700: %s", path, strerror(-rc));
	} else
		rc = 0;
	if (rc < 0) {
		close(fd);
		return rc;
	}
	return fd;
}

int store_lock(const char *path, char *err, size_t errlen)
{
	int root = root_open(path, true, err, errlen);

	if (root < 0)
		return root;
	int fd = lock_open(root, path, err, errlen);
	close(root);
	return fd;
}

/* The directory opened at root_fd is the one whose lock file a holder
 * locked (lock_fd): 0, or -ESTALE with why in err. Every daemon of a mount
 * reopens the store by its path (store= of the command line or of the
 * config file, read again by each): a path edited or a directory renamed
 * or replaced since the mount names another store, unlocked, without the
 * objects acknowledged so far. The lock file's identity is the directory's:
 * it is opened, never made, here. */
static int root_is_locked_one(int root_fd, int lock_fd, const char *path, char *err,
			      size_t errlen)
{
	struct stat locked, here;

	if (fstat(lock_fd, &locked) < 0) {
		int e = errno;
		snprintf(err, errlen, "store %s: the holder's lock: %s", path, strerror(e));
		return -e;
	}
	if (fstatat(root_fd, "lock", &here, AT_SYMLINK_NOFOLLOW) == 0 &&
	    here.st_dev == locked.st_dev && here.st_ino == locked.st_ino)
		return 0;
	snprintf(err, errlen, "the store this mount's holder locked is not at %s (store= "
		 "changed, or the directory was renamed or replaced, since the mount); this daemon "
		 "does not serve another store", path);
	return -ESTALE;
}

int store_open(struct store *s, const char *path, int lock_fd, char *err, size_t errlen)
{
	int rc;

	memset(s, 0, sizeof(*s));
	s->root_fd = s->versions_fd = s->trash_fd = s->lock_fd = -1;
	for (int k = 0; k < STORE_TMP_DIRS; k++)
		s->tmp_fd[k] = -1;
	s->path = strdup(path);
	if (!s->path)
		return -ENOMEM;
	s->root_fd = root_open(path, lock_fd < 0, err, errlen);
	if (s->root_fd < 0) {
		rc = s->root_fd;
		goto fail;
	}
	if (lock_fd >= 0) {
		rc = root_is_locked_one(s->root_fd, lock_fd, path, err, errlen);
		if (rc < 0)
			goto fail;
	}
	s->lock_fd = lock_fd >= 0 ? lock_fd : lock_open(s->root_fd, path, err, errlen);
	if (s->lock_fd < 0) {
		rc = s->lock_fd;
		goto fail;
	}
	s->versions_fd = top_dir(s, "v", err, errlen);
	if (s->versions_fd < 0) {
		rc = s->versions_fd;
		goto fail;
	}
	s->trash_fd = top_dir(s, "trash", err, errlen);
	if (s->trash_fd < 0) {
		rc = s->trash_fd;
		goto fail;
	}
	rc = open_tmp_dirs(s, err, errlen);
	if (rc < 0)
		goto fail;
	return 0;
fail:
	store_close(s);
	return rc;
}

void store_close(struct store *s)
{
	tmp_pool_stop(atomic_load(&s->pool)); /* before the directory it makes files in */
	if (s->versions_fd >= 0)
		close(s->versions_fd);
	if (s->trash_fd >= 0)
		close(s->trash_fd);
	if (s->lock_fd >= 0)
		close(s->lock_fd); /* releases the flock */
	if (s->root_fd >= 0)
		close(s->root_fd);
	for (int k = 0; k < STORE_TMP_DIRS; k++)
		if (s->tmp_fd[k] >= 0)
			close(s->tmp_fd[k]);
	free(s->path);
	memset(s, 0, sizeof(*s));
	s->root_fd = s->versions_fd = s->trash_fd = s->lock_fd = -1;
	for (int k = 0; k < STORE_TMP_DIRS; k++)
		s->tmp_fd[k] = -1;
}

int store_version_make(struct store *s, const char *wv)
{
	return mkdirat(s->versions_fd, wv, 0700) < 0 ? -errno : 0;
}

int store_version_open(struct store *s, const char *wv)
{
	int fd = openat(s->versions_fd, wv, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

	return fd < 0 ? -errno : fd;
}

int store_version_remove(struct store *s, const char *wv)
{
	return unlinkat(s->versions_fd, wv, AT_REMOVEDIR) < 0 ? -errno : 0;
}

int store_version_trash(struct store *s, const char *wv, const char *trash_name)
{
	return renameat(s->versions_fd, wv, s->trash_fd, trash_name) < 0 ? -errno : 0;
}

struct unlink_ctx {
	int dirfd;
	unsigned unlinked;
	bool nested;    /* in a shard: no directory below */
};

/* Unlinks a file; a directory (a shard) is emptied and removed. */
static int unlink_entry(void *ctx, const char *name, unsigned char d_type)
{
	struct unlink_ctx *u = ctx;

	if (unlinkat(u->dirfd, name, 0) == 0) {
		u->unlinked++;
		return 0;
	}
	if (u->nested || (errno != EISDIR && d_type != DT_DIR))
		return 0;
	int fd = openat(u->dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return 0;
	struct unlink_ctx sub = { fd, 0, true };
	store_list(fd, unlink_entry, &sub);
	close(fd);
	unlinkat(u->dirfd, name, AT_REMOVEDIR);
	u->unlinked += sub.unlinked;
	return 0;
}

unsigned store_tmp_clean(struct store *s)
{
	struct unlink_ctx u = { 0 };

	u.nested = true; /* nothing but files there */
	for (int k = 0; k < STORE_TMP_DIRS; k++) {
		u.dirfd = s->tmp_fd[k];
		store_list(u.dirfd, unlink_entry, &u);
	}
	return u.unlinked;
}

static int empty_one(void *ctx, const char *name, unsigned char d_type)
{
	struct store *s = ctx;

	(void)d_type;
	store_trash_empty(s, name);
	return 0;
}

int store_trash_empty(struct store *s, const char *trash_name)
{
	if (!trash_name)
		return store_list(s->trash_fd, empty_one, s);
	int fd = openat(s->trash_fd, trash_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return unlinkat(s->trash_fd, trash_name, 0) < 0 ? -errno : 0;
	struct unlink_ctx u = { fd, 0, false };
	store_list(fd, unlink_entry, &u);
	close(fd);
	return unlinkat(s->trash_fd, trash_name, AT_REMOVEDIR) < 0 ? -errno : 0;
}

/* The pool of files made ahead, started by the first caller (the daemon has
 * forked by then); NULL while it starts, or when it cannot be had. */
static struct tmp_pool *pool_of(struct store *s)
{
	struct tmp_pool *p = atomic_load(&s->pool);

	if (p || atomic_exchange(&s->pool_started, true))
		return p;
	p = tmp_pool_start(s->tmp_fd[STORE_TMP_DIRS - 1]);
	atomic_store(&s->pool, p);
	return p;
}

int store_tmp_open(struct store *s, struct store_tmp *tmp, uint64_t size)
{
	static atomic_ulong counter;
	static atomic_uint threads;
	static _Thread_local int slot = -1;
	struct tmp_pool *pool = pool_of(s);

	tmp->name[0] = '\0';
	tmp->dirfd = s->tmp_fd[STORE_TMP_DIRS - 1];
	if (pool && (tmp->fd = tmp_pool_take(pool, size)) >= 0)
		return 0;
	if (slot < 0) /* each thread its own directory, as far as they go */
		slot = (int)(atomic_fetch_add(&threads, 1) % STORE_TMP_DIRS);
	int dirfd = tmp->dirfd = s->tmp_fd[slot];
	tmp->fd = openat(dirfd, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0400);
	if (tmp->fd >= 0)
		return 0;
	if (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL)
		return -errno;
	/* File systems without O_TMPFILE: a dot-name that scans drop. */
	snprintf(tmp->name, sizeof(tmp->name), STORE_TMP_PREFIX "%ld.%lu", (long)getpid(),
		 atomic_fetch_add(&counter, 1));
	tmp->fd = openat(dirfd, tmp->name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0400);
	if (tmp->fd < 0) {
		tmp->name[0] = '\0';
		return -errno;
	}
	return 0;
}

static int link_once(int dirfd, struct store_tmp *tmp, const char *name)
{
	if (tmp->name[0]) {
		if (linkat(tmp->dirfd, tmp->name, dirfd, name, 0) < 0)
			return -errno;
		unlinkat(tmp->dirfd, tmp->name, 0);
		tmp->name[0] = '\0';
		return 0;
	}
	if (linkat(tmp->fd, "", dirfd, name, AT_EMPTY_PATH) == 0)
		return 0;
	if (errno != ENOENT && errno != EPERM)
		return -errno;
	/* Without CAP_DAC_READ_SEARCH, link through /proc instead. */
	char proc[64];
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", tmp->fd);
	return linkat(AT_FDCWD, proc, dirfd, name, AT_SYMLINK_FOLLOW) < 0 ? -errno : 0;
}

int store_tmp_link(int dirfd, bool sharded, struct store_tmp *tmp, const char *name)
{
	char buf[OBJECT_PATH_MAX];
	const char *path = object_path(name, sharded, buf);
	int rc = link_once(dirfd, tmp, path);

	if (rc != -ENOENT || !sharded)
		return rc;
	/* A shard is made at its first object. */
	char shard[2] = { name[0], '\0' };
	if (mkdirat(dirfd, shard, 0700) < 0 && errno != EEXIST)
		return -errno;
	return link_once(dirfd, tmp, path);
}

void store_tmp_close(struct store_tmp *tmp)
{
	if (tmp->fd >= 0)
		close(tmp->fd);
	if (tmp->name[0])
		unlinkat(tmp->dirfd, tmp->name, 0);
	tmp->fd = -1;
	tmp->name[0] = '\0';
}

int store_pwrite_all(int fd, const void *buf, size_t len, off_t off)
{
	const char *p = buf;

	while (len) {
		ssize_t n = pwrite(fd, p, len, off);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += n;
		len -= (size_t)n;
		off += n;
	}
	return 0;
}

int store_pread_all(int fd, void *buf, size_t len, off_t off)
{
	char *p = buf;

	while (len) {
		ssize_t n = pread(fd, p, len, off);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			return -EIO;
		p += n;
		len -= (size_t)n;
		off += n;
	}
	return 0;
}

int store_object_open(int dirfd, bool sharded, const char *name, struct stat *st)
{
	char buf[OBJECT_PATH_MAX];
	const char *path = object_path(name, sharded, buf);
	/* O_NONBLOCK: a FIFO put in the store must not hang the thread. */
	int fd = openat(dirfd, path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);

	if (fd < 0)
		return errno == ELOOP ? -EFTYPE_STORE : -errno;
	if (fstat(fd, st) < 0 || !S_ISREG(st->st_mode)) {
		close(fd);
		return -EFTYPE_STORE;
	}
	return fd;
}

const char *store_open_error(int rc)
{
	return rc == -EFTYPE_STORE ? "not a regular file" : strerror(-rc);
}

int store_object_stat(int dirfd, bool sharded, const char *name, struct stat *st)
{
	char buf[OBJECT_PATH_MAX];

	if (fstatat(dirfd, object_path(name, sharded, buf), st, AT_SYMLINK_NOFOLLOW) < 0)
		return -errno;
	return S_ISREG(st->st_mode) ? 0 : -EINVAL;
}

int store_object_remove(int dirfd, bool sharded, const char *name)
{
	char buf[OBJECT_PATH_MAX];

	return unlinkat(dirfd, object_path(name, sharded, buf), 0) < 0 ? -errno : 0;
}

int store_object_move(int from_dirfd, bool from_sharded, const char *from, int to_dirfd,
		      bool to_sharded, const char *to)
{
	char from_buf[OBJECT_PATH_MAX], to_buf[OBJECT_PATH_MAX];

	return renameat(from_dirfd, object_path(from, from_sharded, from_buf), to_dirfd,
			object_path(to, to_sharded, to_buf)) < 0 ? -errno : 0;
}

int store_list(int dirfd, store_entry_fn fn, void *ctx)
{
	int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	DIR *d = fdopendir(fd);
	if (!d) {
		int e = errno;
		close(fd);
		return -e;
	}
	struct dirent *de;
	int rc = 0;
	while ((de = readdir(d))) {
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		rc = fn(ctx, de->d_name, de->d_type);
		if (rc)
			break;
	}
	closedir(d);
	return rc;
}

int store_mark_npy_size(int fd, uint64_t npy_size)
{
	if (npy_size == 0 || npy_size >= 1000000000u)
		return 0;
	struct timespec ts[2] = {
		{ .tv_sec = 0, .tv_nsec = UTIME_OMIT },
		{ .tv_sec = STORE_NPY_MARK, .tv_nsec = (long)npy_size },
	};
	return futimens(fd, ts) < 0 ? -errno : 0;
}

struct objects_ctx {
	int dirfd;
	store_entry_fn fn;
	void *ctx;
};

/* The type of an entry of dirfd, where readdir did not say. */
static unsigned char entry_type(int dirfd, const char *name, unsigned char d_type)
{
	struct stat st;

	if (d_type != DT_UNKNOWN || fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return d_type;
	return S_ISDIR(st.st_mode) ? DT_DIR : S_ISREG(st.st_mode) ? DT_REG : DT_UNKNOWN;
}

/* A file of an object at the top of a sharded directory (a store from
 * before shards) moves into its shard. */
static int move_into_shard(void *ctx, const char *name, unsigned char d_type)
{
	struct objects_ctx *c = ctx;
	char shard[2] = { name[0], '\0' }, buf[OBJECT_PATH_MAX];

	if (!key_is_hex(name, 1) || entry_type(c->dirfd, name, d_type) != DT_REG)
		return 0;
	if (mkdirat(c->dirfd, shard, 0700) < 0 && errno != EEXIST)
		return -errno;
	if (renameat2(c->dirfd, name, c->dirfd, object_path(name, true, buf), RENAME_NOREPLACE) < 0)
		log_warn("store: cannot move %s into its shard %s/: %s", name, shard, strerror(errno));
	return 0;
}

/* An entry at the top of a sharded directory: a shard, listed; anything
 * else as it is. */
static int sharded_entry(void *ctx, const char *name, unsigned char d_type)
{
	struct objects_ctx *c = ctx;

	d_type = entry_type(c->dirfd, name, d_type);
	if (!key_is_hex(name, 1) || name[1] != '\0' || d_type != DT_DIR)
		return c->fn(c->ctx, name, d_type);
	int fd = openat(c->dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	int rc = store_list(fd, c->fn, c->ctx);
	close(fd);
	return rc;
}

int store_objects_list(int dirfd, bool sharded, store_entry_fn fn, void *ctx)
{
	struct objects_ctx c = { dirfd, fn, ctx };

	if (!sharded)
		return store_list(dirfd, fn, ctx);
	int rc = store_list(dirfd, move_into_shard, &c); /* first, so that none is listed twice */
	return rc ? rc : store_list(dirfd, sharded_entry, &c);
}
