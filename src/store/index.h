/* SPDX-License-Identifier: Apache-2.0 */
/* The in-memory index of versions and committed objects.
 *
 * Every entity the kernel can hold an inode for is a `struct node` with a
 * reference count: the index holds one reference on each indexed version and
 * object, every kernel lookup one more (dropped by forget), every open
 * handle one more. Memory is freed when the count reaches zero, so an
 * unlinked object stays valid for whoever still has it open.
 *
 * Table operations (find, insert, remove, iterate) need the caller to hold
 * the tree lock; reference counting does not. */
#ifndef ARTFS_INDEX_H
#define ARTFS_INDEX_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "artfs/artfs.h"

enum node_type {
	NODE_ROOT = 1,
	NODE_INFO_DIR,     /* .artfs */
	NODE_INFO_FILE,    /* .artfs/<file> */
	NODE_VERSION,      /* <wv> */
	NODE_OBJECT,       /* <wv>/<hash>, committed or being published */
	NODE_KEY,          /* .keys/<key>: an object by its key (part of the object) */
	NODE_KEYS_DIR,     /* .keys */
	NODE_PUT,          /* <wv>/.put (part of the version), .keys/.put */
	NODE_GET,          /* .keys/.get */
	NODE_MATERIALIZE,  /* <wv>/.materialize */
	NODE_WEIGHTS,      /* loaded weights (owner of the three below, never seen by the kernel) */
	NODE_WEIGHTS_DIR,  /* <wv>/weights */
	NODE_WEIGHTS_FILE, /* <wv>/weights/manifest.json, status */
	NODE_WEIGHTS_RANK, /* <wv>/weights/rank<k> */
	NODE_STALE,        /* an id a daemon before this one gave, whose node is gone */
	NODE_SOCKET,       /* .artfs/attach, the socket of slab descriptors */
	NODE_CACHE_DIR,    /* .cache, .blocks and a directory under them (src/trees/) */
	NODE_CACHE_FILE,   /* a file under .cache (or .blocks) */
	NODE_BLOCKS_PUT,   /* .blocks/.put */
	NODE_BLOCKS_GET,   /* .blocks/.get */
};

struct weights;

struct node {
	_Atomic uint64_t refs;
	uint8_t type;
	uint8_t sub;       /* NODE_INFO_FILE, NODE_WEIGHTS_*: which one */
	struct node *owner; /* set: a part of owner, whose count it shares */
	struct node *prev, *next; /* registry of allocated nodes, for shutdown */
	_Atomic uint64_t id; /* the kernel's id of it (src/state/ids.c); 0: none yet */
};

struct object;

struct object_table {
	struct object **buckets;
	size_t nbuckets;    /* power of two, or 0 */
	size_t count;
};

struct version {
	struct node node;
	struct node materialize;  /* <wv>/.materialize, lives as long as the version */
	struct node put;          /* <wv>/.put, likewise */
	struct version *next;     /* hash chain */
	int dirfd;                /* <store>/v/<wv> */
	bool removed;
	bool keyonly;             /* ".keys": the objects that have only a key (hash = key) */
	/* Every object of its store directory is indexed. A daemon that takes
	 * over indexes them in the background (src/r3/scan.c); until then a name
	 * that is not indexed is looked for in the store (version_probe). */
	_Atomic bool listed;
	/* Objects removed from its directory while it was not listed (tree
	 * lock): a listing under way may have read their names already. */
	uint64_t unlisted_removals;
	struct weights *weights;  /* loaded weights, or NULL (tree lock) */
	struct object_table objects;
	uint64_t bytes;           /* committed bytes in this version */
	uint32_t publishing;      /* publishes in flight */
	uint32_t open_files;      /* open handles of any kind under this version */
	int64_t created;          /* CLOCK_REALTIME seconds */
	_Atomic int64_t last_active; /* CLOCK_REALTIME seconds of the last publish or read */
	char name[];
};

enum object_state { OBJECT_PUBLISHING = 0, OBJECT_COMMITTED, OBJECT_REMOVED };

/* file_size of an object indexed at start and not yet sized (scan.c). */
#define OBJECT_SIZE_UNKNOWN UINT64_MAX

struct object {
	struct node node;
	struct node keynode;        /* .keys/<key>: the envelope as published */
	struct object *next;        /* hash chain */
	struct object *key_next;    /* chain of the key index */
	bool keyed;                 /* key is known (and indexed once committed) */
	uint8_t key[32];            /* sha256 part of the key */
	struct version *ver;        /* referenced */
	_Atomic uint64_t file_size; /* envelope bytes in the store (so far, while uploading) */
	_Atomic uint64_t npy_size;  /* bytes served; 0 until known */
	_Atomic uint64_t ctime_ns;  /* store file's ctime when indexed or last verified */
	_Atomic uint8_t verified;   /* payload verified while the file kept ctime_ns */
	uint8_t state;              /* enum object_state, changed under the tree lock */
	/* Its header once validated (object.c, object_header_learn): the first
	 * 16 bytes of the header's SHA-256, and where payload_sha256's hex
	 * digits start in it; 0 until known. Set once, under the tree lock,
	 * head_digest before sha_at (release). */
	_Atomic uint16_t sha_at;
	uint8_t head_digest[16];
	uint8_t hash_len;
	uint8_t hash[];             /* block hash bytes */
};

struct version_table {
	struct version **buckets;
	size_t nbuckets;
	size_t count;
};

struct key_table {
	struct object **buckets;
	size_t nbuckets;    /* power of two, or 0 */
	size_t count;
};

struct index {
	struct version_table versions;
	struct key_table keys;  /* every committed object with a known key, by key */
	uint64_t seed;
};

void index_init(struct index *idx);
/* Frees every allocated version and object, whoever still references it
 * (the kernel does not forget every inode before a session ends). Only at
 * shutdown, with no request in flight. */
void index_destroy(struct index *idx);

/* Frees what a NODE_WEIGHTS node owns when its last reference goes (set
 * by the module that owns weights, so the index names no module). */
void index_set_weights_free(void (*fn)(struct node *n));
/* The same for the nodes of the write-once trees (src/trees/). */
void index_set_trees_free(void (*fn)(struct node *n));

void node_ref(struct node *n);
/* count more references at once (a node the kernel looked up count times). */
void node_ref_many(struct node *n, uint64_t count);
void node_unref(struct node *n, uint64_t count);

struct version *version_new(const char *name, int dirfd, int64_t created);
struct object *object_new(struct version *ver, const uint8_t *hash, size_t hash_len);

struct version *index_version_find(struct index *idx, const char *name);
int index_version_insert(struct index *idx, struct version *v);  /* takes a reference */
void index_version_remove(struct index *idx, struct version *v); /* drops it */
/* Removes v and all its objects from the index at once (collection). */
void index_version_detach(struct index *idx, struct version *v);
/* Calls fn for every indexed version (tree lock held by the caller). */
void index_each_version(struct index *idx, void (*fn)(void *ctx, struct version *v), void *ctx);

struct object *index_object_find(struct index *idx, struct version *v,
				 const uint8_t *hash, size_t hash_len);
int index_object_insert(struct index *idx, struct version *v, struct object *o);
void index_object_remove(struct index *idx, struct version *v, struct object *o);
/* The committed object of a key (32 bytes), in any version; O(1). */
struct object *index_key_find(struct index *idx, const uint8_t key[32]);
/* Indexes a committed object's key once it is known (after a restart);
 * index_object_insert does it for objects whose key is set. */
int index_key_insert(struct index *idx, struct object *o);
/* Calls fn for every committed object with a known key. */
void index_each_key(struct index *idx, void (*fn)(void *ctx, struct object *o), void *ctx);

/* Calls fn for every committed object of v (tree lock held by the caller). */
void index_each_object(struct version *v, void (*fn)(void *ctx, struct object *o), void *ctx);

/* Name of an object ("<hex>") into out (ARTFS_HASH_HEX_MAX + 1 bytes). */
void object_name(const struct object *o, char *out);

#endif
