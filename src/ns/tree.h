/* SPDX-License-Identifier: Apache-2.0 */
/* The namespace of the mount (DESIGN.md §2) as a file system core without
 * FUSE: names resolve to nodes, nodes have attributes, files open into
 * handles. fs/ translates these calls and their negative errnos into
 * FUSE replies; tests and tools can drive them directly. What the modules
 * share lives in base.h. */
#ifndef ARTFS_TREE_H
#define ARTFS_TREE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>

#include "state/base.h"

/* setattr bits */
enum {
	TREE_SET_MODE = 1 << 0,
	TREE_SET_UID = 1 << 1,
	TREE_SET_GID = 1 << 2,
	TREE_SET_SIZE = 1 << 3,
	TREE_SET_ATIME = 1 << 4,
	TREE_SET_MTIME = 1 << 5,
	TREE_SET_CTIME = 1 << 6,
};

/* Opens (or creates) the store and indexes every committed object in it,
 * its ids in memory of this process alone (no holder). */
int tree_open(struct tree *t, struct artfs_config *cfg, char *err, size_t errlen);

/* How a daemon that a holder started opens its tree (DESIGN.md §8). */
struct tree_start {
	int held_fd;        /* the holder's memory (taken), or -1 */
	int keeper_fd;      /* the link for descriptors the holder keeps, or -1 */
	int lock_fd;        /* the store's lock the holder holds (taken), or -1 */
	bool takeover;      /* a daemon served before: the ids it gave out stay */
	bool defer_scan;    /* the daemon before still serves: the store is indexed
			     * by tree_take_over, once it drained */
};
int tree_open_start(struct tree *t, struct artfs_config *cfg, const struct tree_start *start,
		    char *err, size_t errlen);
void tree_close(struct tree *t);
/* This daemon uses the holder's tables from now on (the one before died
 * or drained; tree_open_start maps them but takes nothing), and indexes
 * the store if that was deferred. 0 or -errno (logged). */
int tree_take_over(struct tree *t);
/* At the end of a daemon that drained for the next one: what the kernel
 * holds (ids, open files) is left in the holder's memory as it is. */
void tree_hand_over(struct tree *t);

int tree_lookup(struct tree *t, struct node *parent, const char *name, struct tree_entry *e);
/* The kernel forgets nlookup lookups of id. */
void tree_forget(struct tree *t, uint64_t id, uint64_t nlookup);
/* The node of the kernel's id: this daemon's, or found again for an id a
 * daemon before gave out (src/ns/revive.c); a stale node when it names
 * nothing any more. */
struct node *tree_node(struct tree *t, uint64_t id);
/* The handle of the kernel's fh: this daemon's, or opened again for one a
 * daemon before gave out; a handle that fails every call (EBADF) for an
 * fh that is no open file. Never NULL. */
struct handle *tree_handle(struct tree *t, uint64_t fh);
/* The handle of fh for its release: this daemon's, or NULL when a daemon
 * before opened it and this one never did (its record is freed: there is
 * nothing to release). */
struct handle *tree_released(struct tree *t, uint64_t fh);
int tree_getattr(struct tree *t, struct node *n, struct stat *st, double *timeout);
int tree_setattr(struct tree *t, struct node *n, unsigned to_set, const struct stat *in,
		 struct stat *out, double *timeout);
int tree_mkdir(struct tree *t, struct node *parent, const char *name, struct tree_entry *e);
int tree_rmdir(struct tree *t, struct node *parent, const char *name);
/* by_self: the daemon itself asks (the attach socket's unlink). */
int tree_unlink(struct tree *t, struct node *parent, const char *name, bool by_self);
/* mknod: only of .artfs/attach, a socket, by the daemon itself (its bind). */
int tree_mknod(struct tree *t, struct node *parent, const char *name, mode_t mode, bool by_self,
	       struct tree_entry *e);
int tree_statfs(struct tree *t, struct statvfs *sv);
/* rename(2) of from in from_dir to to in to_dir; flags: RENAME_NOREPLACE.
 * Only in the .cache/ tree (EXDEV in and out of it, EPERM elsewhere). */
int tree_rename(struct tree *t, struct node *from_dir, const char *from, struct node *to_dir,
		const char *to, unsigned flags);

int tree_create(struct tree *t, struct node *parent, const char *name, int flags,
		struct tree_entry *e, struct handle **h, struct open_reply *r);
int tree_open_file(struct tree *t, struct node *n, int flags, struct handle **h,
		   struct open_reply *r);
/* *data points into memory of the handle, valid until tree_read_done. */
int tree_read(struct tree *t, struct handle *h, uint64_t off, size_t size,
	      const void **data, size_t *len);
void tree_read_done(struct tree *t, struct handle *h);
/* owner identifies the writer's file table (threads share one, a forked
 * child has its own); 0 when unknown. */
int tree_write(struct tree *t, struct handle *h, uint64_t off, const void *buf, size_t len,
	       uint64_t owner);
/* The same write in two halves, for the FUSE layer: tree_write_begin
 * answers what tree_write would; its reply may go out before
 * tree_write_end, which follows it on the same thread with buf still
 * valid and does the rest (a batch stages and commits the records the
 * write brought while its client goes on; the client's next request on
 * the file waits for that). Every begin is followed by its end. */
int tree_write_begin(struct tree *t, struct handle *h, uint64_t off, const void *buf, size_t len,
		     uint64_t owner);
void tree_write_end(struct tree *t, struct handle *h);
/* A close by owner: commits a publish written by that owner. */
int tree_flush(struct tree *t, struct handle *h, uint64_t owner);
int tree_fsync(struct tree *t, struct handle *h);
void tree_release(struct tree *t, struct handle *h);

int tree_opendir(struct tree *t, struct node *n, struct handle **h);
/* Entry number i of the listing snapshot taken at opendir; -ENOENT past the end. */
int tree_readdir(struct tree *t, struct handle *h, size_t i, struct dir_entry *de);
void tree_releasedir(struct tree *t, struct handle *h);

/* Whether a request can be answered at once, or may take long enough
 * (I/O of a large object, a materialized request, a command, a listing of a
 * large version) to be handed to a worker thread. */
bool tree_read_quick(struct tree *t, struct handle *h);
bool tree_write_quick(struct tree *t, struct handle *h, size_t len);
bool tree_flush_quick(struct tree *t, struct handle *h);
bool tree_opendir_quick(struct tree *t, struct node *n);
/* A lookup, create or unlink of a name in parent may ask the cluster
 * (remote=) or wait for the start-up count (.keys): then it goes to a worker. */
bool tree_name_quick(struct tree *t, struct node *parent);
bool tree_release_quick(struct tree *t, struct handle *h);

/* poll(): the events an open file reports. rank<k> never becomes ready, so
 * an engine can wait in poll() and learn that the daemon died (POLLERR). */
unsigned tree_poll(struct tree *t, struct handle *h);

/* ioctl on an open file: ARTFS_IOC_ATTACH on rank<k>. -ENOTTY otherwise. */
int tree_ioctl(struct tree *t, struct handle *h, unsigned int cmd, const void *in, size_t in_len,
	       void *out, size_t out_len);

/* Value of one attribute; with cap 0 only *len is set. -ENODATA, -ERANGE. */
int tree_getxattr(struct tree *t, struct node *n, const char *name, char *buf, size_t cap,
		  size_t *len);
int tree_listxattr(struct tree *t, struct node *n, char *buf, size_t cap, size_t *len);

/* The attributes of an object (committed: the .npy it serves). */
void tree_object_stat(struct tree *t, struct object *o, struct stat *st);

#endif
