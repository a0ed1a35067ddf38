/* artfs's request loop: quick requests on the reading thread, slow ones on
 * workers (see loop.c). */
#ifndef ARTFS_FS_LOOP_H
#define ARTFS_FS_LOOP_H

#include "ops.h"

/* Runs until the session ends; up to max_workers threads for slow requests. */
int fs_loop(struct fuse_session *se, unsigned max_workers);
/* Runs fn(arg) on a worker; fn replies to its request. 0 or -ENOMEM. */
int fs_defer(void (*fn)(void *arg), void *arg);

#endif
