/* SPDX-License-Identifier: Apache-2.0 */
/* Collection of idle versions (DESIGN.md §3.5, ttl=): a version with no
 * publish or read for ttl seconds, no open file and no loaded weights is
 * removed with its objects. A background thread (the janitor) collects on a
 * timer, deletes what was collected from the store and tells the kernel to
 * forget the names; a publish that finds the store full collects at once. */
#ifndef ARTFS_EXPIRY_H
#define ARTFS_EXPIRY_H

#include <stdbool.h>

#include "state/base.h"

int expiry_start(struct tree *t);
/* Stops and joins the collection thread, waiting at most ms milliseconds
 * (-1: for ever): false when it did not end in time (it is left alone). */
bool expiry_stop(struct tree *t, int ms);
/* Has the janitor tell the kernel to forget parent/name (the daemon removed
 * it by itself: unloaded weights). */
void expiry_forget(struct tree *t, uint64_t parent, const char *name);
/* Collects every expired version now; returns the bytes it freed. */
uint64_t expiry_collect(struct tree *t);

#endif
