/* SPDX-License-Identifier: Apache-2.0 */
/* The ids the kernel holds (DESIGN.md §8): node ids and file handles are
 * numbered in the holder's memory (held.h), where each says what it names,
 * so that the next daemon gives every one the same meaning. This file
 * keeps that numbering and this daemon's map from the numbers to its own
 * nodes and handles; src/ns/revive.c finds the node or opens the handle again
 * for an id this daemon did not give out.
 *
 * Fixed nodes (root 1, .artfs 2, its files 3..5, .keys 6, .keys/.put 7,
 * .keys/.get 8) have fixed ids; every other node gets a slot when the
 * kernel first looks it up, and keeps it while the kernel holds lookups
 * of it (each one also a reference of the node). */
#ifndef ARTFS_IDS_H
#define ARTFS_IDS_H

#include <stdbool.h>
#include <stdint.h>

#include "state/base.h"

enum {
	ID_ROOT = 1,
	ID_INFO_DIR = 2,
	ID_INFO_FILE0 = 3,     /* + enum info_file */
	ID_KEYS_DIR = 6,
	ID_KEYS_PUT = 7,
	ID_KEYS_GET = 8,
	ID_ATTACH = 9,         /* .artfs/attach */
	ID_BLOCKS_PUT = 10,
	ID_BLOCKS_GET = 11,
};

/* Gives the fixed nodes their ids; maps nothing else yet. */
void ids_init(struct tree *t);
void ids_close(struct tree *t);

/* The kernel takes one lookup of n (which holds a reference for it): n's
 * id, made if n has none; 0 when the holder's table is full (logged). */
uint64_t ids_node_ref(struct tree *t, struct node *n);
/* n's id for st_ino and listings, taking no lookup: its own, or (none
 * given yet) one made up from its address, never one a slot can have. */
uint64_t node_id(struct tree *t, struct node *n);
/* This daemon's node of id: a fixed one, or one mapped; NULL when none is
 * (yet: an id a daemon before gave out). */
struct node *ids_node(struct tree *t, uint64_t id);
/* What id names, in the holder's memory; NULL for a fixed or unknown id. */
const struct held_node *ids_node_record(struct tree *t, uint64_t id);
/* Maps id (given out by a daemon before) to n, taking as many references of
 * n as the kernel holds lookups of id. Returns the node mapped (another
 * thread's, when it won: n is then left as it was). */
struct node *ids_node_install(struct tree *t, uint64_t id, struct node *n);
/* The kernel forgets nlookup lookups of id: the references go, and the id
 * with the last one. */
void ids_node_forget(struct tree *t, uint64_t id, uint64_t nlookup);

/* Numbers h (opened on node id) in the holder's memory: its fh, set in
 * h->fh too; 0 when the table is full (logged). */
uint64_t ids_handle_bind(struct tree *t, struct handle *h, uint64_t node);
/* The handle of fh, if this daemon has it. */
struct handle *ids_handle(struct tree *t, uint64_t fh);
/* What fh is, in the holder's memory; NULL when it is not an open handle. */
struct held_handle *ids_handle_record(struct tree *t, uint64_t fh);
/* Maps fh (given out by a daemon before) to h, opened again: the handle
 * mapped (another thread's, when it won: h is then left as it was). */
struct handle *ids_handle_install(struct tree *t, uint64_t fh, struct handle *h);
/* h is released: its number goes. */
void ids_handle_unbind(struct tree *t, struct handle *h);

/* The FUSE request this thread serves (fs/loop.c notes it): its unique,
 * less the kernel's resend bit (0: none), and whether the kernel sent it
 * again because a daemon before died with it unanswered. */
void ids_request_note(uint64_t unique, bool resent);
uint64_t ids_request_unique(void);
bool ids_request_resent(void);

/* Sets how weights nodes are described (src/weights/weights.c's). */
void ids_set_weights_describe(void (*fn)(const struct node *n, struct held_node *d));
/* The same for the nodes of the write-once trees (src/trees/). */
void ids_set_trees_describe(void (*fn)(const struct node *n, struct held_node *d));
/* What the holder keeps of n, if the kernel holds an id of it, becomes d
 * (its type and lookups stay): a node whose identity changed (a file
 * committed, a name moved). */
void ids_node_redescribe(struct tree *t, struct node *n, const struct held_node *d);

/* The state of a publish or batch handle, in its record's state field. */
enum revive_state {
	REVIVE_FRESH = 0,      /* nothing written yet: it can start again */
	REVIVE_BUSY,           /* written to: its state is this daemon's alone */
	REVIVE_COMMITTING,     /* a publish commits: key and payload digest in the record */
	REVIVE_FINISHED,       /* a publish's outcome is in the record's result */
	REVIVE_HANDED,         /* drained for an upgrade: its state is in the record's text */
};

/* Notes a publish's or batch's state in its record (nothing without one). */
void revive_note(struct tree *t, struct handle *h, enum revive_state state);
/* A publish begins its commit (REVIVE_COMMITTING): its key and payload. */
void revive_note_commit(struct tree *t, struct handle *h, const uint8_t key[32],
			const uint8_t sha[32]);
/* A publish's outcome is decided (REVIVE_FINISHED). */
void revive_note_result(struct tree *t, struct handle *h, int result);

#endif
