/* SPDX-License-Identifier: Apache-2.0 */
/* What the holder keeps in memory for the daemons (DESIGN.md §8): one
 * memfd that the holder makes at mount and every daemon it forks maps,
 * so that a daemon that dies leaves behind what the next one needs to
 * go on where it stopped:
 *
 *   header     the recorded FUSE INIT request, what the kernel offers,
 *              the count of daemons started
 *   in flight  per request thread, the request it is serving (unique,
 *              opcode): what a dead daemon leaves unanswered
 *   nodes      every node id the kernel holds: what it names (a version,
 *              an object by version and hash, a key...) and how many
 *              lookups the kernel holds of it
 *   handles    every open file handle: its kind, its node, and the little
 *              state that must outlive a daemon (a publish's outcome)
 *   text       the request texts of open transaction files (.materialize,
 *              .keys/.get), so that a request written before a crash is
 *              read after it
 *   keys       a filter of every key the store may hold (a Bloom filter:
 *              no false "absent"), and in the header a bound of the bytes
 *              it holds: a daemon that takes over publishes at once while
 *              it counts the store again, where without them it waits
 *
 * Records are written whole before they are marked live (type or kind
 * set last), so a daemon killed at any moment leaves each record live and
 * whole, or free. Only one daemon uses the tables at a time (an upgrade
 * hands them over once the old one drained); free lists are the using
 * daemon's own and are made again from the records by the next one.
 *
 * The same layout serves a daemon without a holder (unit tests, fuzz
 * targets): held_map_private makes it in anonymous memory. */
#ifndef ARTFS_HELD_H
#define ARTFS_HELD_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define HELD_MAGIC 0x314c444853465441ULL /* "ATFSHDL1", little-endian */
#define HELD_LAYOUT 2
#define HELD_INIT_MAX 4096
#define HELD_INFLIGHT 1024
#define HELD_NODES_MAX (8u << 20)
#define HELD_HANDLES_MAX (1u << 20)
#define HELD_TEXT_PAGE 4096u
#define HELD_TEXT_BYTES (1ull << 30)
/* Node ids below this are the fixed nodes (root 1, .artfs, .keys...). */
#define HELD_NODE_BASE 16
#define HELD_NAME_MAX 128
/* The key filter: 2^27 bits (16 MiB), 7 bits a key. Past 8 M keys ever
 * added 1 key in 1,400 that was never stored reads as "may be held". */
#define HELD_KEYS_BITS (1ull << 27)
#define HELD_KEYS_K 7

/* header flags */
#define HELD_KERNEL_RESEND 1u   /* the kernel's INIT offers FUSE_HAS_RESEND */
#define HELD_NO_RESEND     2u   /* resend=0: lost requests are answered EIO */

/* warm: what a daemon that takes over may trust while it counts the store */
#define HELD_WARM_BYTES 1u      /* bytes_bound is at least the store's bytes */
#define HELD_WARM_KEYS  2u      /* the key filter has every key the store holds */

struct held_header {
	uint64_t magic;
	uint32_t layout;
	uint32_t flags;
	uint64_t size;                 /* bytes of the memfd */
	uint64_t inflight_off, nodes_off, handles_off, text_off;
	_Atomic uint32_t nodes_high;   /* node slots ever used (a new daemon scans these) */
	_Atomic uint32_t handles_high;
	_Atomic uint64_t generation;   /* daemons started on this mount */
	uint64_t keys_off;             /* the key filter's region */
	_Atomic uint64_t bytes_bound;  /* >= the bytes of the store's objects and of those in flight */
	_Atomic uint32_t warm;         /* HELD_WARM_* */
	uint32_t init_len;
	uint8_t init[HELD_INIT_MAX];   /* the kernel's FUSE INIT request, whole */
};

struct held_inflight {
	_Atomic uint64_t unique;       /* 0: none */
	_Atomic uint32_t opcode;
	uint32_t pad;
};

/* What a node id names. type 0: a free slot. */
struct held_node {
	_Atomic uint64_t nlookup;      /* the kernel's lookups of this id */
	uint32_t gen;                  /* bumped at every reuse of the slot */
	_Atomic uint8_t type;          /* enum node_type (index.h) */
	uint8_t sub;                   /* which info file, weights file... */
	uint8_t hash_len;
	uint8_t name_len;
	uint32_t rank;
	uint8_t hash[64];              /* an object's block hash (key-only: its key) */
	uint8_t key[32];
	char name[HELD_NAME_MAX + 1];  /* its version's name */
	uint8_t pad[256 - 8 - 4 - 4 - 4 - 64 - 32 - HELD_NAME_MAX - 1];
};

/* An open file handle. kind 0: a free slot. Its fh is the slot + 1 in
 * the low 32 bits and gen in the high 32: a number the kernel still holds
 * for a closed file never names the file that took its slot since (a
 * RELEASE that a killed daemon handled, and the kernel sends again to the
 * next one, must not release another reader's file). */
struct held_handle {
	_Atomic uint8_t kind;          /* enum handle_kind (base.h) */
	_Atomic uint8_t state;         /* the kind's own */
	uint16_t flags;                /* open flags that matter again (O_ACCMODE) */
	_Atomic uint32_t gen;          /* bumped at every reuse of the slot */
	int32_t result;                /* an outcome decided before a crash */
	uint32_t pad;
	uint64_t node;                 /* the node id it was opened on */
	uint64_t text_at;              /* its text: byte offset in the text region */
	uint64_t text_len, text_cap;   /* bytes written, bytes of room */
	uint8_t key[32];               /* a publish's key and payload digest */
	uint8_t sha[32];
};

/* One daemon's view of the held memory. */
struct held {
	struct held_header *hdr;
	uint8_t *base;
	size_t size;
	int fd;                        /* the memfd, -1 when private */
	bool fresh;                    /* made for this daemon: nothing to take over */
	pthread_mutex_t mu;            /* the free lists and the text bitmap */
	uint32_t *free_nodes, *free_handles;
	size_t nfree_nodes, nfree_handles, cap_nodes, cap_handles;
	/* Node slots below scan_end were taken over; those below
	 * scanned_nodes are known free or live by now (held_scan_nodes). */
	uint32_t scan_end, scanned_nodes;
	uint64_t *text_used;           /* a bit per text page */
	size_t text_pages, text_hint;
};

/* Holder: a memfd with the layout written (and init_len bytes of INIT).
 * fd (not close-on-exec, for the daemons) or -errno. */
int held_create(const void *init, size_t init_len, uint32_t flags);

/* Daemon: maps the holder's memfd (taken: closed with the held). 0,
 * -EINVAL (not this layout: logged), -errno. Nothing may be allocated in
 * it before held_take_over. */
int held_map(int fd, struct held *h);
/* This daemon is the one that uses the tables from now on (the daemon
 * before died or drained): the free handle slots and the text pages of
 * the live handles are learnt now, the free node slots by
 * held_scan_nodes. */
void held_take_over(struct held *h);
/* The same layout in memory of this process alone. */
int held_map_private(struct held *h);
void held_unmap(struct held *h);

struct held_inflight *held_inflight(struct held *h, unsigned slot);

/* ---- node ids ------------------------------------------------------------------- */

/* A free slot with desc written and marked live (nlookup as in desc): its
 * id, or 0 when the table is full. */
uint64_t held_node_alloc(struct held *h, const struct held_node *desc);
/* The live record of id, or NULL (a fixed id, out of range, free). */
struct held_node *held_node_get(struct held *h, uint64_t id);
/* Drops nlookup lookups of id; frees its slot when none is left. true
 * when it was freed. */
bool held_node_forget(struct held *h, uint64_t id, uint64_t nlookup);

/* After held_take_over: fn(id, its type, ctx) for each live node id that
 * a daemon before gave out (the slots taken over). */
void held_nodes_taken_over_each(struct held *h, void (*fn)(uint64_t id, uint8_t type, void *ctx),
				void *ctx);

/* ---- file handles ----------------------------------------------------------------- */

/* A free handle slot made live with kind and node: its fh (>= 1), or 0. */
uint64_t held_handle_alloc(struct held *h, uint8_t kind, uint64_t node, uint16_t flags);
/* The live record that fh names, or NULL (free, out of range, or its slot
 * reused since fh was closed). */
struct held_handle *held_handle_get(struct held *h, uint64_t fh);
/* fh's slot (the index of its record); fh must be one of held_handle_alloc. */
static inline uint32_t held_handle_slot(uint64_t fh)
{
	return (uint32_t)(fh & 0xffffffffu) - 1;
}
/* Frees fh's slot and its text (nothing when fh is not live). */
void held_handle_free(struct held *h, uint64_t fh);
/* fn(record, its fh, ctx) for each live handle of kind. */
void held_handles_each(struct held *h, uint8_t kind,
		       void (*fn)(const struct held_handle *r, uint64_t fh, void *ctx), void *ctx);

/* ---- request texts ------------------------------------------------------------------ */

/* Room for cap bytes of text for hh (what it held is kept). 0 or -ENOMEM
 * (the text region is full). */
int held_text_reserve(struct held *h, struct held_handle *hh, size_t cap);
/* The text of hh (NULL when it has none). */
uint8_t *held_text(struct held *h, const struct held_handle *hh);

/* ---- what the store holds ---------------------------------------------------------- */

/* The key goes into the filter: before its object can be in the store. */
void held_keys_add(struct held *h, const uint8_t key[32]);
/* false: no object of this key was ever added (so none is stored, where
 * HELD_WARM_KEYS is set); true: one may be. */
bool held_keys_may_hold(const struct held *h, const uint8_t key[32]);

/* After held_take_over: the free node slots below the mark are learnt
 * from the records while this daemon serves (new slots are taken above
 * the mark meanwhile): call once, on a thread of its own. */
void held_scan_nodes(struct held *h);

#endif
