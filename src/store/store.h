/* SPDX-License-Identifier: Apache-2.0 */
/* The on-disk store (DESIGN.md §3.5): a directory the daemon owns.
 *
 *   <store>/lock           flock'd by the running daemon, holds its pid
 *   <store>/v/<wv>/<hash>  one committed object: the envelope as published
 *   <store>/v/.keys/<x>/<key hex>  an object that has only its key, in the
 *                          shard named by the first digit of its key
 *   <store>/trash/<name>   a collected version being deleted (emptied at start)
 *   <store>/tmp/<k>/       where temporary files are made, one directory per
 *                          thread (k < STORE_TMP_DIRS); empty but for the
 *                          named ones of file systems without O_TMPFILE
 *
 * Objects are written to an unnamed temporary file and linked into their
 * version directory, so a name in the store always holds a whole object and
 * a crash leaves nothing half-written behind. Temporary files are made apart
 * from the directories they are linked into, each thread in its own: files
 * made side by side in one directory contend for it (on tmpfs, 15 threads
 * making files in the directory linked into took 27 us a file and slowed
 * every link to 20 us; each in a directory of its own, 5 us and 2.7 us).
 * Objects published by key alone all lie in the key-only version, so its
 * objects are spread over 16 shards: links into one directory run one at
 * a time, and a batch's records link side by side. */
#ifndef ARTFS_STORE_H
#define ARTFS_STORE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#define STORE_TMP_DIRS 16

struct store {
	char *path;
	int root_fd;
	int versions_fd;
	int trash_fd;   /* <store>/trash: versions being deleted */
	int lock_fd;
	int tmp_fd[STORE_TMP_DIRS]; /* <store>/tmp/<k> */
	/* Temporary files made ahead (tmp_pool.h) in the last tmp/<k>,
	 * started by the first store_tmp_open. */
	struct tmp_pool *_Atomic pool;
	atomic_bool pool_started;
};

/* mtime.tv_sec of a committed object file whose tv_nsec holds the size of
 * the .npy it serves (written at commit when it fits, read at a restart). */
#define STORE_NPY_MARK 1

/* Marks a committed object file with its .npy size (when below 1e9). */
int store_mark_npy_size(int fd, uint64_t npy_size);

/* A temporary object file, unnamed (O_TMPFILE) or, where the file system
 * lacks that, named ".tmp.*" (dropped again at the next start). */
struct store_tmp {
	int fd;
	int dirfd;      /* the tmp/<k> it was made in */
	char name[40];
};

#define STORE_TMP_PREFIX ".tmp."

/* Creates the directory (mode 0700) if missing, opens it without following
 * links, refuses one owned by another user, takes the exclusive lock (or,
 * lock_fd >= 0, adopts the one a holder took with store_lock: the store
 * then owns that descriptor; the directory is then not made, and one
 * whose lock file is not lock_fd's is refused, -ESTALE: it is not the
 * store the holder locked). Returns 0 or a negative errno with a message
 * in err. */
int store_open(struct store *s, const char *path, int lock_fd, char *err, size_t errlen);
void store_close(struct store *s);
/* Writes this process's pid into the lock file (again after daemonizing). */
void store_note_pid(struct store *s);

/* For a holder: the store's directory checked as store_open does and its
 * lock taken: the lock file's descriptor (close-on-exec), or a negative
 * errno with a message in err (-EBUSY: another holds it). */
int store_lock(const char *path, char *err, size_t errlen);
/* Writes this process's pid into the lock file. */
void store_lock_note_pid(int lock_fd);

int store_version_make(struct store *s, const char *wv);
int store_version_open(struct store *s, const char *wv);  /* fd or -errno */
int store_version_remove(struct store *s, const char *wv);
/* Moves a version directory into trash/ under trash_name, atomically: the
 * name is free again at once, its files are deleted afterwards. */
int store_version_trash(struct store *s, const char *wv, const char *trash_name);
/* Deletes trash/<trash_name> and its files; with NULL, all of trash/. */
int store_trash_empty(struct store *s, const char *trash_name);

/* A temporary file for an object of size bytes (0: unknown): one made
 * ahead, or made now in the calling thread's tmp/<k>. */
int store_tmp_open(struct store *s, struct store_tmp *tmp, uint64_t size);
/* Gives the temporary file the object name name in the version directory
 * dirfd (sharded: the key-only version's, whose shard is made at its first
 * object); -EEXIST if the name is taken. The fd stays open (the caller
 * closes it with store_tmp_close). */
int store_tmp_link(int dirfd, bool sharded, struct store_tmp *tmp, const char *name);
void store_tmp_close(struct store_tmp *tmp);
/* Drops what a crash left in tmp/ (named temporary files only); returns
 * how many. */
unsigned store_tmp_clean(struct store *s);

/* pwrite all of buf at off; -errno (ENOSPC when the store file system is full). */
int store_pwrite_all(int fd, const void *buf, size_t len, off_t off);
/* pread exactly len bytes at off; -EIO if the file is shorter. */
int store_pread_all(int fd, void *buf, size_t len, off_t off);

/* What store_object_open answers for a name that is not a regular file
 * (a link, a FIFO, a device): the store is damaged there. */
#define EFTYPE_STORE EUCLEAN
/* The committed object named name in the version directory dirfd (sharded:
 * the key-only version's, where the store finds its shard): its file,
 * read-only: fd or -errno; *st is its stat. */
int store_object_open(int dirfd, bool sharded, const char *name, struct stat *st);
/* The reason to log for a negative errno of store_object_open. */
const char *store_open_error(int rc);
/* The same object's stat without opening it, and its removal. */
int store_object_stat(int dirfd, bool sharded, const char *name, struct stat *st);
int store_object_remove(int dirfd, bool sharded, const char *name);
/* Moves the object from in one version directory to the name to in another
 * (an object that had only its key gains a name): 0 or -errno. */
int store_object_move(int from_dirfd, bool from_sharded, const char *from, int to_dirfd,
		      bool to_sharded, const char *to);

/* Calls fn for each entry of the directory fd (not "." or ".."); stops
 * when fn returns non-zero and returns that. d_type is DT_* */
typedef int (*store_entry_fn)(void *ctx, const char *name, unsigned char d_type);
int store_list(int dirfd, store_entry_fn fn, void *ctx);

/* The entries of a version directory, as store_list gives them; in a
 * sharded one the files of every shard, and a file at its top (a store
 * from before shards) is moved into its shard first. */
int store_objects_list(int dirfd, bool sharded, store_entry_fn fn, void *ctx);

#endif
