/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "lib/parallel.h"

/* A few worker threads, started at the first loop that wants them and kept
 * (starting a thread costs tens of microseconds, as much as a batch item):
 * each open loop is on a list; an idle worker joins the first one that has
 * items left and is below its share of helpers. The calling thread works on
 * its own loop too, so a loop finishes even when every worker is busy.
 * A new loop wakes one worker, which wakes the next as it joins: waking
 * them all at once cost the caller tens of microseconds (a wake-up each,
 * then each woken worker waited for the lock in turn).
 *
 * A caller that knows a loop is coming (a batch file was opened: its
 * write follows) warms the workers: they wake one after another now and
 * watch for a loop, without the lock, until it comes or the time is up,
 * so the loop finds them all awake instead of paying a chain of wake-ups
 * at its start, one after another (up to a tenth of a batch's time). */

static pthread_mutex_t mu = PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP; /* see mutex_init_adaptive */
static pthread_cond_t work = PTHREAD_COND_INITIALIZER;
static struct parallel_loop *open_loops;
static pthread_once_t started = PTHREAD_ONCE_INIT;
static unsigned workers;
static unsigned sleeping;               /* workers in pthread_cond_wait (under mu) */
static _Atomic uint64_t loops_begun;    /* what a warm worker watches */
static _Atomic int64_t warm_until;      /* CLOCK_MONOTONIC ns: workers watch until then */

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static bool loop_begun(void *seen)
{
	return atomic_load_explicit(&loops_begun, memory_order_relaxed) != *(uint64_t *)seen;
}

/* Under mu, entered and left so: a warm worker watches for a new loop
 * without the lock until one begins or the warm time ends; false when
 * it has ended (then the worker sleeps). The first to wake wakes the
 * next. */
static bool watch(void)
{
	int64_t until = atomic_load_explicit(&warm_until, memory_order_relaxed);

	if (now_ns() >= until)
		return false;
	uint64_t seen = atomic_load(&loops_begun);
	if (sleeping)
		pthread_cond_signal(&work);
	pthread_mutex_unlock(&mu);
	parallel_spin(loop_begun, &seen, until - now_ns());
	pthread_mutex_lock(&mu);
	return true;
}

bool parallel_spin(bool (*done)(void *ctx), void *ctx, int64_t ns)
{
	int64_t until = 0;

	for (unsigned spins = 1; !done(ctx); spins++) {
#if defined(__x86_64__) || defined(__i386__)
		__builtin_ia32_pause();
#endif
		if (spins % 64)
			continue;
		int64_t now = now_ns();
		if (!until)
			until = now + ns;
		else if (now >= until)
			return false;
	}
	return true;
}

static size_t run_items(struct parallel_loop *l)
{
	size_t count = 0;

	for (;;) {
		size_t i = atomic_fetch_add(&l->next, 1);
		if (i >= l->n)
			return count;
		l->fn(l->ctx, i);
		count++;
	}
}

/* Under mu: a loop still open to one more helper, or NULL. */
static struct parallel_loop *joinable(void)
{
	for (struct parallel_loop *l = open_loops; l; l = l->link)
		if (l->helpers < l->max_helpers && atomic_load(&l->next) < l->n)
			return l;
	return NULL;
}

static void finish(struct parallel_loop *l, size_t count, bool helper)
{
	l->done += count;
	if (helper)
		l->helpers--;
	if (l->done == l->n && l->helpers == 0)
		pthread_cond_signal(&l->finished);
}

static void *worker(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&mu);
	for (;;) {
		struct parallel_loop *l;
		while (!(l = joinable()))
			if (!watch()) {
				sleeping++;
				pthread_cond_wait(&work, &mu);
				sleeping--;
			}
		l->helpers++;
		if (joinable())
			pthread_cond_signal(&work); /* the next helper, if one sleeps */
		pthread_mutex_unlock(&mu);
		size_t count = run_items(l);
		pthread_mutex_lock(&mu);
		finish(l, count, true);
	}
	return NULL;
}

static void start_workers(void)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	unsigned want = cpus > 1 ? (unsigned)cpus - 1 : 0;
	pthread_attr_t attr;

	if (want > PARALLEL_THREADS_MAX - 1)
		want = PARALLEL_THREADS_MAX - 1;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	for (unsigned k = 0; k < want; k++) {
		pthread_t t;
		if (pthread_create(&t, &attr, worker, NULL) == 0)
			workers++;
	}
	pthread_attr_destroy(&attr);
}

void parallel_begin(struct parallel_loop *l, size_t n, size_t per_thread, size_t max_threads,
		    void (*fn)(void *ctx, size_t i), void *ctx)
{
	size_t want = n / (per_thread ? per_thread : 1) + 1;

	if (want > max_threads)
		want = max_threads;
	if (want > 1) {
		pthread_once(&started, start_workers); /* workers is set from here on */
		if (want > (size_t)workers + 1)
			want = (size_t)workers + 1;
	}
	l->fn = fn;
	l->ctx = ctx;
	l->n = n;
	l->done = 0;
	l->helpers = 0;
	l->max_helpers = want > 1 ? (unsigned)(want - 1) : 0;
	atomic_init(&l->next, 0);
	if (!l->max_helpers)
		return; /* the caller runs them all in parallel_end */
	pthread_cond_init(&l->finished, NULL);
	pthread_mutex_lock(&mu);
	l->link = open_loops;
	open_loops = l;
	atomic_fetch_add(&loops_begun, 1); /* warm workers see it */
	if (sleeping)
		pthread_cond_signal(&work); /* who joins wakes the next */
	pthread_mutex_unlock(&mu);
}

static bool awake;

static void decide_awake(void)
{
	const char *env = getenv("ARTFS_WAIT_AWAKE");

	if (env && (strcmp(env, "0") == 0 || strcmp(env, "1") == 0))
		awake = env[0] == '1';
	else
		awake = sysconf(_SC_NPROCESSORS_ONLN) >= PARALLEL_AWAKE_CPUS;
}

bool parallel_wait_awake(void)
{
	static pthread_once_t decided = PTHREAD_ONCE_INIT;

	pthread_once(&decided, decide_awake);
	return awake;
}

void parallel_warm(int64_t ns)
{
	int64_t until = now_ns() + ns;

	if (ns <= 0)
		return;
	if (!parallel_wait_awake())
		return;
	pthread_once(&started, start_workers);
	if (!workers)
		return;
	int64_t was = atomic_load(&warm_until);
	while (was < until && !atomic_compare_exchange_weak(&warm_until, &was, until))
		;
	pthread_mutex_lock(&mu);
	if (sleeping)
		pthread_cond_signal(&work); /* the first to wake wakes the next (watch) */
	pthread_mutex_unlock(&mu);
}

void parallel_end(struct parallel_loop *l)
{
	size_t count = run_items(l);

	if (!l->max_helpers)
		return;
	pthread_mutex_lock(&mu);
	for (struct parallel_loop **p = &open_loops; *p; p = &(*p)->link)
		if (*p == l) {
			*p = l->link; /* no new helper joins it now */
			break;
		}
	finish(l, count, false);
	while (l->done < l->n || l->helpers)
		pthread_cond_wait(&l->finished, &mu);
	pthread_mutex_unlock(&mu);
	pthread_cond_destroy(&l->finished);
}

void parallel_for(size_t n, size_t per_thread, size_t max_threads,
		  void (*fn)(void *ctx, size_t i), void *ctx)
{
	struct parallel_loop l;

	parallel_begin(&l, n, per_thread, max_threads, fn, ctx);
	parallel_end(&l);
}
