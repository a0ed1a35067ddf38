/* SPDX-License-Identifier: Apache-2.0 */
/* A daemon that takes over (DESIGN.md §8) meets ids it did not give out:
 * the node ids and file handles that a daemon before gave the kernel,
 * described in the holder's memory (held.h, src/state/ids.h). This file finds
 * the node an id names (a version, an object by version and hash, a key,
 * a version's .put or .materialize), and makes the handles that cannot be
 * opened again as they were: a file whose state died with the daemon
 * answers EIO, a publish whose outcome was decided answers that. reopen.c
 * opens every other kind again through the module that owns it. */
#ifndef ARTFS_REVIVE_H
#define ARTFS_REVIVE_H

#include <stdint.h>

#include "state/base.h"

/* The node that id (given by a daemon before) names, found by its kind's
 * revive (node_ops.h), mapped with the kernel's lookups; the tree's stale
 * node when it names nothing any more. */
struct node *revive_node(struct tree *t, uint64_t id);
/* At a takeover, before the first request: every directory id the kernel
 * holds mapped to its directory (or the stale node), so that a lookup of
 * the directory's name answers the id the kernel knows it by. A new id
 * for a directory the kernel holds under its old one makes the kernel
 * move the old one's dentry (d_splice_alias), which answers ESTALE to the
 * caller while another cross-directory rename runs. Files need not be:
 * the kernel takes a file's new id as a new inode. */
void revive_directories(struct tree *t);

/* A handle for fh whose reads, writes, flushes and ioctls fail with EIO:
 * what a daemon that died was writing. NULL when out of memory. */
struct handle *revive_dead(struct tree *t, enum handle_kind kind);
/* A publish handle whose flush and fsync answer result (decided before the
 * daemon that made it died); writes are EIO. */
struct handle *revive_finished(struct tree *t, int result);

/* The outcome of a publish that was committing when its daemon died: 0
 * when the store holds the key with that payload (it committed, or an
 * identical one did), -EEXIST when it holds other content, -EIO when it
 * holds nothing of the key (nothing was committed). */
int revive_commit_outcome(struct tree *t, const struct held_handle *rec);

#endif
