/* SPDX-License-Identifier: Apache-2.0 */
/* What every module of the namespace stands on: the daemon's shared state
 * (struct tree), open handles with their table of operations and the list
 * of them, the clock, node ids, and making a version. Modules include this,
 * never tree.h, so calls run one way: tree -> modules -> base -> index,
 * store, formats.
 *
 * Locking: t->lock guards the index, the version tables and the byte
 * accounting; it is held for table operations only, never across I/O. */
#ifndef ARTFS_BASE_H
#define ARTFS_BASE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "restart/held.h"
#include "restart/keeper.h"
#include "state/config.h"
#include "state/grant.h"
#include "state/metrics.h"
#include "store/index.h"
#include "store/store.h"

#define COMMIT_STRIPES 64
/* Ids a page of the maps from the kernel's ids to this daemon's nodes and
 * handles holds. */
#define IDS_PAGE 4096

enum info_file { INFO_METRICS = 0, INFO_CONFIG, INFO_CONTROL, INFO_COUNT };

struct handle;
struct wtree;

#define RESULTS_KEPT 4              /* result buffers kept for reuse */
#define RESULT_KEPT_MAX (8u << 20)   /* the largest kept */

struct tree {
	struct artfs_config *cfg;
	struct store store;
	struct metrics metrics;
	pthread_mutex_t lock;
	/* Held across a commit's existence check, link and indexing, and
	 * across a removal: a key is held by one object (taken before lock).
	 * One lock per stripe of keys (commit_lock_of), so that commits of
	 * different keys, a batch's records among them, run side by side. */
	pthread_mutex_t commit_locks[COMMIT_STRIPES];
	struct index idx;
	uint64_t objects;         /* committed objects, all versions */
	uint64_t bytes_used;      /* committed bytes, all versions */
	uint64_t bytes_reserved;  /* declared bytes of publishes in flight */
	uint64_t publishing;      /* publishes in flight */
	_Atomic uint64_t materialize_held; /* bytes held by open .materialize files */
	/* Result buffers of ended transactions kept for the next ones
	 * (src/state/transaction.c): a .get of 64 objects mapped and faulted
	 * in ~100 fresh pages and unmapped them again, every batch. */
	pthread_mutex_t results_mu;
	struct kept_result { void *bytes; size_t map; } results_kept[RESULTS_KEPT];
	unsigned nresults_kept;
	struct node root;
	struct node info_dir;
	struct node info_files[INFO_COUNT];
	struct node keys_dir;     /* .keys */
	struct node keys_put;     /* .keys/.put */
	struct node keys_get;     /* .keys/.get */
	struct node blocks_put;   /* .blocks/.put */
	struct node blocks_get;   /* .blocks/.get */
	/* .artfs/attach: a socket the daemon binds in its own mount, once per
	 * mount (the holder keeps it); it exists from its bind on. */
	struct node attach_node;
	_Atomic bool attach_bound;
	/* Attach tokens (src/state/grant.c), and the link on which the holder keeps
	 * descriptors for the next daemon (fd -1 without a holder). */
	struct grants grants;
	struct keeper_link keeper;
	int64_t started;          /* CLOCK_REALTIME seconds */
	struct expiry *expiry;    /* the janitor (src/state/expiry.c), NULL when not running */
	struct remote *remote;    /* the Redis Cluster tier (remote=), or NULL */
	struct wtree *cache;      /* the .cache/ tree (src/trees/), NULL until open */
	struct wtree *blocks;     /* the .blocks/ tree (src/trees/), NULL until open */
	/* Tells the kernel that parent/name is gone when the daemon itself
	 * removed it (collection); set by the FUSE layer, called only from the
	 * janitor thread. */
	void (*forget_entry)(void *ctx, uint64_t parent, const char *name);
	void *forget_ctx;
	/* What else the janitor collects on its timer (src/trees/: .blocks/'s
	 * idle namespace directories); set by the namespace, NULL: nothing. */
	uint64_t (*collect_more)(struct tree *t, int64_t now);
	/* Asks the holder for an upgrade (set by the daemon a holder runs):
	 * 0 or -errno. */
	int (*upgrade)(void *ctx);
	void *upgrade_ctx;
	/* Loaded weights (src/weights/weights.c). */
	pthread_mutex_t weights_mu;
	pthread_cond_t weights_cv;
	struct weights *weights;  /* every weights object not yet freed */
	unsigned loads_running;
	/* Objects found at start are sized in the background (scan.c): until
	 * then bytes_used is short and publishes wait on sized_cv, but in a
	 * daemon that took over from one whose store was counted (held.h,
	 * warm): it admits publishes against unsized_bound (at least the bytes
	 * of the objects not counted yet) and waits only for keys that the
	 * holder's key filter may hold. */
	_Atomic bool sizing;       /* read without the lock as a hint */
	bool warm_bytes, warm_keys;
	uint64_t unsized_bound;
	bool sizing_stop;
	pthread_cond_t sized_cv;
	struct sizer *sizer;
	/* What the holder keeps across daemons (held.h; a private copy without
	 * a holder), and this daemon's map of the ids in it (src/state/ids.c). */
	struct held held;
	pthread_mutex_t ids_mu;
	_Atomic(void *) *_Atomic node_pages[HELD_NODES_MAX / IDS_PAGE];
	_Atomic(void *) *_Atomic handle_pages[HELD_HANDLES_MAX / IDS_PAGE];
	struct node stale;        /* what an id resolves to whose node is gone */
	bool handing_over;        /* drained: what the kernel holds stays for the next daemon */
	bool closing;             /* the tree closes: open files are released, not closed */
	/* A released handle's number goes (src/state/ids.c sets it). */
	void (*handle_unbind)(struct tree *t, struct handle *h);
	bool scan_deferred;       /* the store is indexed at tree_take_over */
	bool took_over;           /* a daemon served this mount before */
	pthread_t node_scan;      /* learns the free node slots after a takeover */
	bool node_scan_started;
};

/* Seconds for which the kernel may cache what never changes. */
#define CACHE_FOREVER 1e9

struct tree_entry {
	struct node *node;      /* referenced (one kernel lookup); NULL: negative entry */
	uint64_t id;            /* the kernel's id of node */
	struct stat st;
	double entry_timeout;
	double attr_timeout;
};

struct open_reply {
	bool keep_cache;
	bool direct_io;
	bool noflush;
	bool nonseekable;
};

struct dir_entry {
	const char *name;
	uint64_t ino;
	unsigned char type;   /* DT_DIR, DT_REG */
};

struct handle;

/* What an open file is, as the holder's memory keeps it (held.h): a
 * daemon that takes over opens it again from that (src/ns/revive.c). */
enum handle_kind {
	HANDLE_OBJECT = 1,     /* <wv>/<hash> read */
	HANDLE_KEY,            /* .keys/<key> read */
	HANDLE_LISTING,        /* a directory */
	HANDLE_INFO,           /* .artfs/metrics, config */
	HANDLE_CONTROL,        /* .artfs/control */
	HANDLE_MATERIALIZE,
	HANDLE_GET,
	HANDLE_PUT,
	HANDLE_PUBLISH,        /* a publish by path or by key */
	HANDLE_WEIGHTS_FILE,   /* manifest.json, status */
	HANDLE_RANK,           /* rank<k> */
	HANDLE_WEIGHTS_PUBLISH, /* weights/.publish */
	HANDLE_CACHE_READ,     /* a committed .cache/ file */
	HANDLE_CACHE_WRITE,    /* a .cache/ file being written */
	HANDLE_BLOCKS_PUT,     /* .blocks/.put */
	HANDLE_BLOCKS_GET,     /* .blocks/.get */
	HANDLE_KINDS
};

/* What one kind of open file does: each module of the namespace (object
 * reads, publishes, .materialize, info files, control, listings, rank<k>)
 * exports one table; the tree dispatches through it and names no module.
 * An operation left NULL is not supported (EBADF, ENOTTY), a *_quick left
 * NULL means always quick: may run on the thread that reads requests. */
struct handle_ops {
	const char *kind;     /* for logs */
	int (*read)(struct tree *t, struct handle *h, uint64_t off, size_t size,
		    const void **data, size_t *len);
	int (*write)(struct tree *t, struct handle *h, uint64_t off, const void *buf, size_t len,
		     uint64_t owner);
	/* A write in two halves (tree_write_begin/_end; optional): the first
	 * answers the write, the second does the rest after its reply, on
	 * the same thread, with the bytes still valid. */
	int (*write_begin)(struct tree *t, struct handle *h, uint64_t off, const void *buf,
			   size_t len, uint64_t owner);
	void (*write_end)(struct tree *t, struct handle *h);
	int (*flush)(struct tree *t, struct handle *h, uint64_t owner);
	int (*fsync)(struct tree *t, struct handle *h);
	int (*ioctl)(struct tree *t, struct handle *h, unsigned int cmd, const void *in,
		     size_t in_len, void *out, size_t out_len);
	unsigned (*poll)(struct tree *t, struct handle *h);
	/* Entry number i of a listing; -ENOENT past the end. */
	int (*readdir)(struct tree *t, struct handle *h, size_t i, struct dir_entry *de);
	/* The last user is gone: free everything the handle holds. */
	void (*release)(struct tree *t, struct handle *h);
	bool (*read_quick)(struct tree *t, struct handle *h);
	bool (*write_quick)(struct tree *t, struct handle *h, size_t len);
	bool (*flush_quick)(struct tree *t, struct handle *h);
	bool release_slow;    /* its release may block or take long (frees GPU memory; closes files) */
	enum handle_kind held_kind;
	/* A daemon that took over opened it again: it takes back what the
	 * holder's memory keeps of it (optional). */
	int (*resume)(struct tree *t, struct handle *h);
	/* The daemon drained for an upgrade: what the handle has taken that
	 * the next daemon cannot find again goes to its record in the holder's
	 * memory (optional: most handles are opened again from their node). */
	void (*hand_over)(struct tree *t, struct handle *h);
};

/* An open file or directory. Reads hand out pointers into handle memory,
 * so a handle lives until its release and every read reply are done. */
struct handle {
	const struct handle_ops *ops;
	_Atomic uint32_t users;
	struct handle *prev, *next; /* every open handle, released at shutdown */
	uint64_t fh;                /* the kernel's file handle (src/state/ids.c); 0: none */
	struct tree *tree;          /* set with fh */
};

/* What a read of size bytes at off returns of the len bytes at buf (NULL
 * when there are none): where it starts and how many. */
void buffer_slice(const void *buf, size_t len, uint64_t off, size_t size, const void **data,
		  size_t *out_len);

/* The owner a flush names when the process closing the file is being
 * killed (a .cache/ file is then dropped, not committed). */
#define TREE_OWNER_KILLED UINT64_MAX

/* Bytes of I/O that a request may do on the thread reading requests. */
#define HANDLE_QUICK_BYTES (256u << 10)

/* Every handle starts here: its operations and one user (its release).
 * It joins the list of open handles with handle_register once whole, so
 * that shutdown never meets a half-made one. */
void handle_init(struct handle *h, const struct handle_ops *ops);
void handle_register(struct handle *h);
/* One more user (a read reply in flight); handle_put drops one and
 * releases the handle with the last. */
void handle_get(struct handle *h);
void handle_put(struct tree *t, struct handle *h);
/* Releases the handles whose RELEASE the kernel never sent (shutdown). */
void handles_release_all(struct tree *t);
/* Calls every open handle's hand_over (a drained daemon's end). */
void handles_hand_over(struct tree *t);

/* CLOCK_REALTIME seconds. */
int64_t clock_now(void);
/* A lock that many threads take for a few hundred nanoseconds at a time
 * (the tree's): one that finds it held spins a little before it sleeps. */
void mutex_init_adaptive(pthread_mutex_t *m);
/* The commit lock of a key (t->commit_locks). */
pthread_mutex_t *commit_lock_of(struct tree *t, const uint8_t key[32]);
/* Marks a version active now (publish, read or close). */
void version_touch(struct version *v);



/* Waits until the store's bytes are all counted (after a start). */
void sizing_wait(struct tree *t);
/* Waits until the keys of the store's objects are all indexed, unless the
 * holder's filter says that none holds key (a warm takeover). Call before
 * the key is added to the filter. */
void sizing_wait_for_key(struct tree *t, const uint8_t key[32]);
/* Under t->lock: bytes of an object of v found at start, counted now. */
void sizing_counted_locked(struct tree *t, struct version *v, uint64_t bytes);
/* Under t->lock: what the holder keeps as the bound of the store's bytes,
 * after a rise (a reservation) or once counted. */
void sizing_note_bound_locked(struct tree *t);
/* The count after a start: begins (a takeover learns what it may trust
 * meanwhile), ends (the holder learns that the next daemon may; complete:
 * every object found at start was counted and keyed). */
void sizing_begin_locked(struct tree *t, bool takeover);
void sizing_end_locked(struct tree *t, bool complete);

/* The indexed version of that name, referenced; NULL if none. */
struct version *version_find(struct tree *t, const char *name);

/* The committed object of v named hash, referenced; NULL if none (looked
 * for in the store too while v is not listed yet: version_probe). */
struct object *version_object_find(struct tree *t, struct version *v, const uint8_t *hash,
				   size_t len);
/* Unit tests only: runs between version_object_find's lookup and its
 * answer (a background listing that ends at the worst moment). */
extern void (*version_object_find_hook)(struct tree *t, struct version *v);
/* While v's objects are indexed in the background (a daemon that took
 * over), the object named hash is indexed now if its file is in the store. */
void version_probe(struct tree *t, struct version *v, const uint8_t *hash, size_t len);
/* Waits until every object of v is indexed. */
void version_listed_wait(struct tree *t, struct version *v);
/* An object found in the store (committed, its size not counted yet). */
struct object *object_new_found(struct version *v, const uint8_t *hash, size_t len);

/* Makes version name (store directory and index entry). Returns 0 with a
 * referenced *out, -EEXIST (*out is the existing one, referenced), -EINVAL
 * (not a version name), or another negative errno (logged). */
int version_make(struct tree *t, const char *name, struct version **out);

/* Memory that transaction files (.materialize, .keys/.get) hold for their
 * results and request text, all of them together under materialize_max=. */
bool transaction_memory_take(struct tree *t, uint64_t len);
void transaction_memory_give(struct tree *t, uint64_t len);


/* The objects that have only a key live in one hidden version (not a valid
 * version name, so never a directory of the mount): store v/.keys, their
 * "hash" is the 32 bytes of their key, and they share its expiry clock. */
#define KEYONLY_VERSION ".keys"

/* The version of key-only objects, made if missing; referenced. */
int version_keyonly(struct tree *t, struct version **out);

/* The key an object of v named hash must carry (key_derive, or for
 * key-only objects the hash itself). */
void version_object_key(const struct version *v, const uint8_t *hash, size_t len,
			char out[ARTFS_KEY_LEN + 1]);

/* The same key as its 32 bytes. */
void version_object_key_bin(const struct version *v, const uint8_t *hash, size_t len,
			    uint8_t out[32]);

/* The name of errno e (positive) in the result lines of batch and publish
 * files ("EEXIST"): those DESIGN.md gives and the few artfs adds; any
 * other is "EIO". */
const char *errno_name(int e);

#endif
