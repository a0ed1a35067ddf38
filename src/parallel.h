/* One loop spread over a few threads: the calling thread and up to
 * max_threads - 1 workers of one pool that the whole daemon shares (started
 * at the first loop that wants them, never more than the CPUs - 1, kept
 * for the next loop), each taking the next index until none is left. For
 * batches whose items each cost a few system calls (.materialize, .get,
 * caching what the cluster sent). Not to be used before a fork. */
#ifndef ARTFS_PARALLEL_H
#define ARTFS_PARALLEL_H

#include <stddef.h>

#define PARALLEL_THREADS_MAX 8

/* Calls fn(ctx, i) once for every i < n, on one thread per per_thread
 * items (at least one, at most max_threads); returns when all are done. */
void parallel_for(size_t n, size_t per_thread, size_t max_threads,
		  void (*fn)(void *ctx, size_t i), void *ctx);

#endif
