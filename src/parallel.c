#include "autoconf.h"

#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "parallel.h"

struct loop {
	void (*fn)(void *ctx, size_t i);
	void *ctx;
	size_t n;
	_Atomic size_t next;
};

static void *worker(void *arg)
{
	struct loop *l = arg;

	for (;;) {
		size_t i = atomic_fetch_add(&l->next, 1);
		if (i >= l->n)
			return NULL;
		l->fn(l->ctx, i);
	}
}

void parallel_for(size_t n, size_t per_thread, size_t max_threads,
		  void (*fn)(void *ctx, size_t i), void *ctx)
{
	struct loop l = { .fn = fn, .ctx = ctx, .n = n };
	pthread_t threads[PARALLEL_THREADS_MAX - 1];
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	size_t want = n / (per_thread ? per_thread : 1) + 1, started = 0;

	if (want > max_threads)
		want = max_threads;
	if (want > PARALLEL_THREADS_MAX)
		want = PARALLEL_THREADS_MAX;
	if (cpus > 0 && want > (size_t)cpus)
		want = (size_t)cpus;
	atomic_init(&l.next, 0);
	for (size_t k = 1; k < want; k++)
		if (pthread_create(&threads[started], NULL, worker, &l) == 0)
			started++;
	worker(&l);
	for (size_t k = 0; k < started; k++)
		pthread_join(threads[k], NULL);
}
