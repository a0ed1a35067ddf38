/* One loop spread over a few threads: the calling thread and up to
 * max_threads - 1 workers of one pool that the whole daemon shares (started
 * at the first loop that wants them, never more than the CPUs - 1, kept
 * for the next loop), each taking the next index until none is left. For
 * batches whose items each cost a few system calls (.materialize, .get,
 * caching what the cluster sent). Not to be used before a fork. */
#ifndef ARTFS_PARALLEL_H
#define ARTFS_PARALLEL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#define PARALLEL_THREADS_MAX 8

/* One loop in progress (fields are parallel.c's). */
struct parallel_loop {
	void (*fn)(void *ctx, size_t i);
	void *ctx;
	size_t n;
	_Atomic size_t next;           /* the next item to take */
	size_t done;                   /* items finished (under the pool's lock) */
	unsigned helpers;              /* workers inside the loop now (same) */
	unsigned max_helpers;          /* 0: the caller runs every item at the end */
	struct parallel_loop *link;    /* the open loops (same) */
	pthread_cond_t finished;       /* done == n and no helper left */
};

/* Calls fn(ctx, i) once for every i < n, on one thread per per_thread
 * items (at least one, at most max_threads); returns when all are done. */
void parallel_for(size_t n, size_t per_thread, size_t max_threads,
		  void (*fn)(void *ctx, size_t i), void *ctx);

/* The same loop in two halves, for a caller with work of its own while
 * the workers take items: parallel_begin returns at once, parallel_end
 * runs the items left on the calling thread and returns when all are
 * done. An item may wait for work the caller does in between (a batch
 * record still being read), so long as that wait ends. */
void parallel_begin(struct parallel_loop *l, size_t n, size_t per_thread, size_t max_threads,
		    void (*fn)(void *ctx, size_t i), void *ctx);
void parallel_end(struct parallel_loop *l);

#endif
