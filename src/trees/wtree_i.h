/* SPDX-License-Identifier: Apache-2.0 */
/* What the files of src/trees/ share: the nodes of a write-once tree and
 * the tree itself and what a next daemon finds them by (nodes.c), its
 * store (disk.c), its open files (file.c), the namespace calls (ops.c),
 * names (names.h), the two trees' policies (policy.c), .blocks/'s batches
 * and expiry (blocks_*.c). Calls run blocks -> ops -> file -> disk -> nodes. */
#ifndef ARTFS_TREES_WTREE_I_H
#define ARTFS_TREES_WTREE_I_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "lib/counter.h"
#include "state/base.h"
#include "store/store.h"
#include "trees/wtree.h"

#define WTREE_HEADER 64
#define WTREE_MAGIC "ARTFSWO1" /* 8 bytes: the header's first */

/* The counters of a tree in .artfs/metrics (state/metrics.h). */
struct wcounters {
	counter_t *hits, *misses, *remote_hits, *commits, *collisions, *evictions, *damaged;
};

/* What sets the two trees apart (policy.c). */
struct wpolicy {
	const char *label;       /* logs: "cache", "blocks" */
	const char *mount_name;  /* ".cache" */
	const char *store_dir;   /* <store>/cache */
	const char *tmp_dir;     /* <store>/cache-tmp: files being written */
	const char *remote_kind; /* <prefix>:<kind>:<path> in the cluster */
	unsigned depth_max;      /* directories below the root */
	size_t path_max;         /* bytes of a path below the root */
	int (*name_check)(const char *name); /* one component */
	bool evict;              /* full: least recently opened files go (else ENOSPC) */
	bool damaged_is_miss;    /* a damaged file is dropped (else it stays, EIO) */
	bool check_every_open;   /* SHA-256 at every open (else when the store file changed) */
	bool renames;            /* rename within the tree (else EPERM) */
	bool cluster_sets;       /* directories named in sets of the cluster (listings) */
	bool cluster_required;   /* a commit the cluster did not take fails (EIO) */
	/* What a full tree frees before it refuses, under the tree's lock
	 * (.blocks/: idle namespace directories); NULL: nothing. */
	uint64_t (*collect_locked)(struct wtree *w, int64_t now);
};

const struct wpolicy *wpolicy_of(enum wtree_kind kind);
void wpolicy_counters(struct tree *t, enum wtree_kind kind, struct wcounters *c);

enum wnode_state {
	WNODE_PENDING = 1, /* a file being written: in no directory */
	WNODE_LIVE,        /* in its directory */
	WNODE_GONE,        /* unlinked, evicted, damaged, or a dropped rename source */
};

struct wdir;

struct wnode {
	struct node node;        /* NODE_CACHE_DIR or NODE_CACHE_FILE; its prev
				  * and next: every node of the tree (nodes.c) */
	struct wtree *tree;
	struct wnode *parent;    /* referenced; NULL for the root */
	struct wnode *chain;     /* next in the parent's bucket */
	struct wnode *lru_prev, *lru_next; /* committed files nobody holds open */
	struct wnode *ino_next;  /* chain of the tree's map by store inode */
	struct wdir *dir;        /* a directory's entries */
	uint8_t state;           /* enum wnode_state (tree lock) */
	bool damaged;            /* failed its check: open readers get EIO */
	bool counted;            /* a file being written, counted in its directory's pending */
	uint32_t open;           /* open handles (tree lock) */
	uint64_t ino;            /* its store file's inode number; 0: none yet */
	uint64_t gen;            /* a directory's store generation (disk.c), 0: none:
				  * with ino, which store directory it is (nodes.c) */
	uint64_t size;           /* bytes of a committed file */
	uint8_t sha[32];         /* their SHA-256 */
	/* The store file as last checked: a change since means checking again. */
	struct timespec checked_mtime, checked_ctime;
	bool checked;
	int64_t mtime;           /* seconds: commit, or a directory's last change */
	int64_t used;            /* seconds: a directory's last commit or open of a file in it */
	char *name;              /* its name in parent (tree lock) */
};

struct wdir {
	struct wnode **buckets;
	size_t nbuckets;         /* power of two */
	size_t count;            /* live entries */
	uint32_t pending;        /* files being written into it */
};

struct wtree {
	pthread_mutex_t mu;      /* the nodes, their names and states, the byte count */
	const struct wpolicy *p;
	enum wtree_kind kind;
	struct wcounters c;
	struct wnode *root;
	int root_fd;             /* <store>/cache (blocks) */
	int tmp_fd;              /* <store>/cache-tmp: files being written, by name, so that
				  * a next daemon opens them again (a crash, an upgrade) */
	struct wnode **inos;     /* by store inode number */
	size_t ninos, ino_count;
	struct wnode lru;        /* head: lru.lru_next is the least recently opened */
	pthread_mutex_t all_mu;  /* every node allocated, freed at the end */
	struct node all;
	uint64_t bytes;          /* committed bytes */
	uint64_t reserved;       /* bytes written to files not committed yet */
	uint64_t files;          /* committed files */
	uint64_t capacity, max_file;
	int64_t ttl;             /* .blocks/: seconds a namespace directory may stay idle; 0: ever */
	uint64_t seed;
	struct tree *t;          /* the tree it is part of (its metrics, its store) */
	/* Until when (CLOCK_MONOTONIC ns) the cluster is not asked: it was
	 * unreachable (cluster.c). */
	_Atomic int64_t cluster_down_until;
	_Atomic bool no_getversion; /* the store's file system keeps no inode generation (disk.c) */
};

static inline struct wnode *wnode_of(struct node *n)
{
	return (struct wnode *)n;
}

/* nodes.c (the tree lock held where it says "locked") */
struct wnode *wnode_new(struct wtree *w, struct wnode *parent, const char *name, bool is_dir);
struct wnode *wnode_find_locked(struct wtree *w, struct wnode *dir, const char *name);
int wnode_insert_locked(struct wtree *w, struct wnode *dir, struct wnode *n);
void wnode_detach_locked(struct wtree *w, struct wnode *n);
void wnode_ino_set_locked(struct wtree *w, struct wnode *n, uint64_t ino);
void wnode_ino_unset_locked(struct wtree *w, struct wnode *n);
struct wnode *wnode_by_ino_locked(struct wtree *w, uint64_t ino);
void wnode_lru_touch_locked(struct wtree *w, struct wnode *n);
void wnode_lru_remove_locked(struct wtree *w, struct wnode *n);
/* The path of n below the tree's root into buf ("." for the root):
 * -ENAMETOOLONG past WTREE_PATH_MAX. */
int wnode_path_locked(const struct wnode *n, char *buf, size_t len);
/* Depth below the root (the root: 0). */
unsigned wnode_depth_locked(const struct wnode *n);
void wnode_free_hook(struct node *n);
void wnodes_destroy(struct wtree *w);

/* disk.c */
struct wheader {
	char magic[8];
	uint64_t size;
	uint8_t sha[32];
	uint8_t pad[WTREE_HEADER - 8 - 8 - 32];
};
int wdisk_open(struct tree *t, struct wtree *w, char *err, size_t errlen);
/* Indexes every committed file and directory under the root. */
int wdisk_scan(struct tree *t, struct wtree *w);
int wdisk_mkdir_locked(struct wtree *w, struct wnode *n);
int wdisk_remove_locked(struct wtree *w, struct wnode *n);
int wdisk_rename_locked(struct wtree *w, struct wnode *n, struct wnode *to_dir, const char *to);
/* Links the written temporary file fd (header written) in as n. */
int wdisk_link_locked(struct wtree *w, struct wnode *n, struct store_tmp *tmp);
/* A store file's header checked against its size; 0 or -EBADMSG. */
int wdisk_header_read(int fd, struct wheader *hd, uint64_t file_size);

/* long_names.c: the name of a file being written that is longer than the
 * holder's record of its node keeps (HELD_NAME_MAX), kept beside the
 * temporary files as n.<inode>, for a next daemon to make the file again
 * under it: keep (0 or -errno), read (0, or -errno: missing, or not a
 * name of w starting with the kept prefix), drop. */
int wlong_name_keep(struct wtree *w, uint64_t ino, const char *name);
int wlong_name_read(struct wtree *w, uint64_t ino, const char *prefix, char *name, size_t size);
void wlong_name_drop(struct wtree *w, uint64_t ino);
/* Whether file (an entry of the tmp directory) is a kept long name, and
 * of which inode. */
bool wlong_name_file(const char *file, uint64_t *ino);

/* tmp_orphans.c: for a daemon that takes over, before it serves: drops
 * the temporary files of w that no open handle names (a daemon made them
 * and ended before it answered the create, which the kernel then sent to
 * the next one) and the kept long names of files no longer written. */
void wtmp_orphans_drop(struct tree *t, struct wtree *w);
/* For a create the kernel sent again (ids_request_resent): the file a
 * daemon before made for it, and the record of its handle, whose answer
 * never reached the kernel, go. */
void wtmp_unanswered_drop(struct tree *t, struct wtree *w, uint64_t unique);

/* ops.c: dir/name as a directory here (made now, or by another call
 * meanwhile); *out referenced. */
int wdir_make(struct wtree *w, struct wnode *dir, const char *name, struct wnode **out);

/* nodes.c: what the next daemon finds n by (held.h), and that record
 * brought up to date after a commit or a rename (not under the tree's
 * lock: the ids' lock comes first). */
void wtree_describe_locked(const struct node *n, struct held_node *d);
/* n described as it will be once moved to parent/name (a rename's record,
 * written before the move). */
void wtree_describe_as_locked(const struct wnode *n, const struct wnode *parent,
			      const char *name, struct held_node *d);
void wtree_redescribe(struct wtree *w, struct wnode *n);

/* file.c */
/* A committed file leaves the store, the tree's counts and its directory
 * (unlink, eviction, a failed check, a dropped rename source). */
void wfile_drop_locked(struct wtree *w, struct wnode *n);
/* Files being written are <tmp_dir>/w.<pid>.<n>, named in their handle's
 * record (held_handle.key) once it is made. */
#define WFILE_TMP_PREFIX "w."
int wfile_create(struct tree *t, struct wnode *n, struct handle **h);
int wfile_open(struct tree *t, struct wnode *n, struct handle **h);
/* The bytes of the committed file n (size bytes, n->size when it was
 * found) into dst, checked against its SHA-256: 0, -EIO (damaged: logged
 * and counted), -ESTALE (gone meanwhile), -errno. */
int wfile_load(struct tree *t, struct wnode *n, uint8_t *dst, uint64_t size);
/* The temporary file of a handle wfile_create made. */
int wfile_fd(struct handle *h);
/* The pending file n's writer whose daemon died or drained: its handle
 * opened again from the record rec of it (its temporary file's name, its
 * owner). */
int wfile_reopen(struct tree *t, struct wnode *n, const struct held_handle *rec,
		 struct handle **h);
/* h (wfile_create's) has its number: its record names its temporary file. */
void wfile_recorded(struct tree *t, struct handle *h);
/* Frees committed files nobody holds open, least recently opened first,
 * until need more bytes fit; -ENOSPC when they cannot. */
int wfile_make_room_locked(struct tree *t, struct wtree *w, uint64_t need);
struct wvalue;
/* A file whose bytes are in memory (fetched from the cluster: fetched,
 * counted as a remote hit; a .blocks/.put record: counted as a commit),
 * checked, written to the store and linked in as dir/name as a local
 * commit would be; *out referenced. When the name was placed meanwhile,
 * that entry is *out. 0 or -errno. */
int wfile_adopt(struct tree *t, struct wnode *dir, const char *name, const struct wvalue *v,
		bool fetched, struct wnode **out);

/* blocks_expiry.c: .blocks/'s idle namespace directories collected
 * (ttl=); blocks removed. */
uint64_t wblocks_collect_locked(struct wtree *w, int64_t now);

/* cluster.c: the tree across nodes (remote=). Each call waits on the
 * cluster (at most remote_timeout): never under the tree's lock. */
struct wvalue {
	uint8_t *val;            /* SHA-256 (32 bytes), then size bytes; malloc'd */
	uint64_t size;
};
void wvalue_free(struct wvalue *v);
/* The file at path below the tree, fetched and checked (digest, at most
 * cache_max_file= bytes): 0, -ENOENT absent, -EBADMSG failed its check
 * (logged: never served), -EIO the cluster unreachable (the client logged). */
int wcluster_fetch(struct wtree *w, const char *path, struct wvalue *out);
/* Many at once (a .blocks/.get's misses), one pipelined round per node:
 * results[i] as wcluster_fetch answers for paths[i], out[i] its value
 * when 0. Returns -ENOMEM, -EIO (nothing answered), or 0 / the first
 * result that is not 0. */
int wcluster_fetch_many(struct wtree *w, size_t n, const char *const *paths,
			struct wvalue *out, int *results);
/* A file about to be committed at path (fd: its store file, header
 * first): written to the cluster once (SET NX) and named in the sets of
 * the directories above it. 0: its bytes stand (put, identical, or the
 * cluster unreachable: .cache/); 1: another node committed other bytes
 * first, and they are in *theirs, checked; -errno (.blocks/ only): the
 * cluster did not take it. */
int wcluster_claim(struct wtree *w, const char *path, int fd, uint64_t size,
		   const uint8_t sha[32], struct wvalue *theirs);
/* The same for a value in memory (a .blocks/.put record). For .blocks/
 * (cluster_required), a cluster that does not take it is -EIO (or the
 * client's errno: -ENOSPC), and nothing may be committed. */
int wcluster_claim_value(struct wtree *w, const char *path, const struct wvalue *v,
			 struct wvalue *theirs);
/* path's name leaves its directory's set in the cluster (a file renamed
 * away here: a temporary name other nodes need not list); its value stays
 * until it expires. */
void wcluster_forget(struct wtree *w, const char *path);
/* path removed here by its user (unlink, rmdir): its name leaves its
 * directory's set and a file's value goes (DEL), so that no node fetches
 * it again and the name can be written anew. Best effort (the client logs
 * a failure). */
void wcluster_remove(struct wtree *w, const char *path, bool is_file);
/* Whether the cluster's set of path's directory names it: a committed
 * entry. A file renamed away on its node left that set while its value
 * stays until it expires; such a value is never taken for an entry. */
bool wcluster_named(struct wtree *w, const char *path);
/* The names of the directory at path in the cluster (those that are names
 * of the tree), at most max: 0 or -errno (*names: remote_members_free). */
int wcluster_members(struct wtree *w, const char *path, size_t max, char ***names,
		     size_t *count);

#endif
