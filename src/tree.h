/* The namespace of the mount (DESIGN.md §2) as a file system core without
 * FUSE: names resolve to nodes, nodes have attributes, files open into
 * handles. fs/ translates these calls and their negative errnos into
 * FUSE replies; tests and tools can drive them directly.
 *
 * Locking: t->lock guards the index, the version tables and the byte
 * accounting; it is held for table operations only, never across I/O. */
#ifndef ARTFS_TREE_H
#define ARTFS_TREE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>

#include "config.h"
#include "index.h"
#include "metrics.h"
#include "store.h"

enum info_file { INFO_METRICS = 0, INFO_CONFIG, INFO_CONTROL, INFO_COUNT };

struct tree {
	struct artfs_config *cfg;
	struct store store;
	struct metrics metrics;
	pthread_mutex_t lock;
	struct index idx;
	uint64_t objects;         /* committed objects, all versions */
	uint64_t bytes_used;      /* committed bytes, all versions */
	uint64_t bytes_reserved;  /* declared bytes of publishes in flight */
	uint64_t uploads;         /* publishes in flight */
	_Atomic uint64_t materialize_held; /* bytes held by open .materialize files */
	struct node root;
	struct node info_dir;
	struct node info_files[INFO_COUNT];
	int64_t started;          /* CLOCK_REALTIME seconds */
	struct expiry *expiry;    /* the janitor (src/expiry.c), NULL when not running */
	/* Tells the kernel that parent/name is gone when the daemon itself
	 * removed it (collection); set by the FUSE layer, called only from the
	 * janitor thread. */
	void (*forget_entry)(void *ctx, uint64_t parent, const char *name);
	void *forget_ctx;
	/* Loaded weights (src/weights.c). */
	pthread_mutex_t weights_mu;
	pthread_cond_t weights_cv;
	struct weights *weights;  /* every weights object not yet freed */
	unsigned loads_running;
	/* Objects found at start are sized in the background (scan.c): until
	 * then bytes_used is short and publishes wait on sized_cv. */
	bool sizing;
	bool sizing_stop;
	pthread_cond_t sized_cv;
	struct sizer *sizer;
};

/* Seconds for which the kernel may cache what never changes. */
#define TREE_FOREVER 1e9

struct tree_entry {
	struct node *node;      /* referenced (one kernel lookup); NULL: negative entry */
	struct stat st;
	double entry_timeout;
	double attr_timeout;
};

struct tree_open_reply {
	bool keep_cache;
	bool direct_io;
	bool noflush;
	bool nonseekable;
};

enum handle_type {
	HANDLE_UPLOAD = 1, HANDLE_OBJECT, HANDLE_TEXT, HANDLE_DIR, HANDLE_MATERIALIZE,
	HANDLE_CONTROL, HANDLE_WEIGHTS_RANK,
};

/* An open file or directory. Reads hand out pointers into handle memory,
 * so a handle lives until its release and every read reply are done. */
struct handle {
	uint8_t type;
	_Atomic uint32_t users;
	struct handle *prev, *next; /* every open handle, released at shutdown */
};

/* Every handle starts here: one user (its release), and a place in the
 * list of open handles (a RELEASE still queued when the daemon stops is
 * done by tree_close). */
void handle_init(struct handle *h, enum handle_type type);

struct tree_dirent {
	const char *name;
	uint64_t ino;
	unsigned char type;   /* DT_DIR, DT_REG */
};

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

/* Opens (or creates) the store and indexes every committed object in it. */
int tree_open(struct tree *t, struct artfs_config *cfg, char *err, size_t errlen);
void tree_close(struct tree *t);

uint64_t tree_node_id(struct tree *t, struct node *n);
struct node *tree_node_from_id(struct tree *t, uint64_t id);

int tree_lookup(struct tree *t, struct node *parent, const char *name, struct tree_entry *e);
void tree_forget(struct tree *t, struct node *n, uint64_t nlookup);
int tree_getattr(struct tree *t, struct node *n, struct stat *st, double *timeout);
int tree_setattr(struct tree *t, struct node *n, unsigned to_set, const struct stat *in,
		 struct stat *out, double *timeout);
int tree_mkdir(struct tree *t, struct node *parent, const char *name, struct tree_entry *e);
int tree_rmdir(struct tree *t, struct node *parent, const char *name);
int tree_unlink(struct tree *t, struct node *parent, const char *name);
int tree_statfs(struct tree *t, struct statvfs *sv);

int tree_create(struct tree *t, struct node *parent, const char *name, int flags,
		struct tree_entry *e, struct handle **h, struct tree_open_reply *r);
int tree_open_file(struct tree *t, struct node *n, int flags, struct handle **h,
		   struct tree_open_reply *r);
/* *data points into memory of the handle, valid until tree_read_done. */
int tree_read(struct tree *t, struct handle *h, uint64_t off, size_t size,
	      const void **data, size_t *len);
void tree_read_done(struct tree *t, struct handle *h);
/* owner identifies the writer's file table (threads share one, a forked
 * child has its own); 0 when unknown. */
int tree_write(struct tree *t, struct handle *h, uint64_t off, const void *buf, size_t len,
	       uint64_t owner);
/* A close by owner: commits a publish written by that owner. */
int tree_flush(struct tree *t, struct handle *h, uint64_t owner);
int tree_fsync(struct tree *t, struct handle *h);
void tree_release(struct tree *t, struct handle *h);

int tree_opendir(struct tree *t, struct node *n, struct handle **h);
/* Entry number i of the listing snapshot taken at opendir; -ENOENT past the end. */
int tree_readdir(struct tree *t, struct handle *h, size_t i, struct tree_dirent *de);
void tree_releasedir(struct tree *t, struct handle *h);

/* Whether a request can be answered at once, or may take long enough
 * (I/O of a large object, a materialized request, a command, a listing of a
 * large version) to be handed to a worker thread. */
bool tree_read_quick(struct tree *t, struct handle *h);
bool tree_write_quick(struct tree *t, struct handle *h, size_t len);
bool tree_flush_quick(struct tree *t, struct handle *h);
bool tree_opendir_quick(struct tree *t, struct node *n);
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

/* ---- shared by the modules of the core ---------------------------------- */

int64_t tree_now(void);
void tree_object_stat(struct tree *t, struct object *o, struct stat *st);
/* Waits until the store's bytes are all counted (after a start). */
void tree_wait_sized(struct tree *t);
/* Marks a version active now (publish or read). */
void tree_touch(struct version *v);

#endif
