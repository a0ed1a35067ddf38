/* artfs's request loop: one thread reads and answers requests; a slow one
 * hands the reading to another thread first (see loop.c). */
#ifndef ARTFS_FS_LOOP_H
#define ARTFS_FS_LOOP_H

#include "ops.h"

/* Runs until the session ends, on up to max_threads threads. */
int fs_loop(struct fuse_session *se, unsigned max_threads);
/* Called by a request that may take long, before it runs: another thread
 * reads the next requests meanwhile. Nothing under -s (libfuse's loop). */
void fs_hand_off(void);

#endif
