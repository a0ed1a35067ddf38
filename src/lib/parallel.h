/* SPDX-License-Identifier: Apache-2.0 */
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
#include <stdint.h>

#define PARALLEL_THREADS_MAX 8
/* With this many CPUs or more, a thread that waits a short while may wait
 * awake, spinning on its CPU (parallel_wait_awake). */
#define PARALLEL_AWAKE_CPUS 8

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

/* A loop is coming within about ns: the workers wake now, one after
 * another, and watch for it until then (each spinning on a CPU), so that
 * it starts with all of them awake. Nothing when parallel_wait_awake()
 * is false. */
void parallel_warm(int64_t ns);

/* Whether a thread that expects its wait to be short may spend it awake,
 * spinning (a wake-up costs tens of microseconds on a virtual machine):
 * with PARALLEL_AWAKE_CPUS or more CPUs, where one is to spare. The
 * environment variable ARTFS_WAIT_AWAKE=1 or =0 decides it instead (tests
 * on small machines; a crowded host). */
bool parallel_wait_awake(void);

/* Spins on the calling CPU until done(ctx) is true (then true) or about
 * ns have passed (false); done is asked between pauses. */
bool parallel_spin(bool (*done)(void *ctx), void *ctx, int64_t ns);

#endif
