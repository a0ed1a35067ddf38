/* SPDX-License-Identifier: Apache-2.0 */
/* artfs's request loop: one thread reads and answers requests; a slow one
 * hands the reading to another thread first (see loop.c). */
#ifndef ARTFS_FS_LOOP_H
#define ARTFS_FS_LOOP_H

#include "fs/ops.h"

#include <stdbool.h>

#include "restart/held.h"

/* Runs until the session ends (or fs_loop_drain), on up to max_threads
 * threads. held: where each thread notes the request it serves (NULL:
 * nowhere). */
int fs_loop(struct fuse_session *se, unsigned max_threads, struct held *held);
/* Any thread: no request is read from now on; fs_loop returns once every
 * request read so far is answered (the others wait in the kernel for the
 * next daemon). */
void fs_loop_drain(void);
/* Whether fs_loop returned for fs_loop_drain. */
bool fs_loop_drained(void);
/* Called by a request that may take long, before it runs: another thread
 * reads the next requests meanwhile. Nothing under -s (libfuse's loop). */
void fs_hand_off(void);

#endif
