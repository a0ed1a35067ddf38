/* SPDX-License-Identifier: Apache-2.0 */
/* Release on scope exit (as lxcfs does): a variable declared with one of
 * these is freed or closed on every return, so an early return needs no
 * ladder of gotos. */
#ifndef ARTFS_CLEANUP_H
#define ARTFS_CLEANUP_H

#include <stdlib.h>
#include <unistd.h>

static inline void cleanup_free(void *p)
{
	free(*(void **)p);
}

static inline void cleanup_close(const int *fd)
{
	if (*fd >= 0)
		close(*fd);
}

#define _cleanup_free_ __attribute__((cleanup(cleanup_free)))
#define _cleanup_close_ __attribute__((cleanup(cleanup_close)))

#endif
