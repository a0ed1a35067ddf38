/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "lib/parallel.h"
#include "suites.h"

struct counts {
	_Atomic unsigned *seen;
	size_t n;
};

static void count_one(void *ctx, size_t i)
{
	struct counts *c = ctx;

	ck_assert_uint_lt(i, c->n);
	atomic_fetch_add(&c->seen[i], 1);
}

static void check_loop(size_t n, size_t per_thread, size_t max_threads)
{
	struct counts c = { .seen = calloc(n ? n : 1, sizeof(*c.seen)), .n = n };

	ck_assert_ptr_nonnull(c.seen);
	parallel_for(n, per_thread, max_threads, count_one, &c);
	for (size_t i = 0; i < n; i++)
		ck_assert_uint_eq(atomic_load(&c.seen[i]), 1);
	free(c.seen);
}

START_TEST(every_item_once)
{
	check_loop(0, 1, PARALLEL_THREADS_MAX);
	check_loop(1, 1, PARALLEL_THREADS_MAX);
	check_loop(10000, 1, PARALLEL_THREADS_MAX);
	check_loop(777, 64, 3);
	check_loop(100, 0, 1);
}
END_TEST

static void *caller(void *arg)
{
	(void)arg;
	for (int k = 0; k < 50; k++)
		check_loop(2000, 8, PARALLEL_THREADS_MAX);
	return NULL;
}

/* Loops from several threads at once share the pool; each gets every one
 * of its items once and returns only when they are all done. */
START_TEST(concurrent_loops)
{
	pthread_t t[6];

	for (int i = 0; i < 6; i++)
		ck_assert_int_eq(pthread_create(&t[i], NULL, caller, NULL), 0);
	for (int i = 0; i < 6; i++)
		pthread_join(t[i], NULL);
}
END_TEST

static void nested_one(void *ctx, size_t i)
{
	(void)ctx;
	(void)i;
	check_loop(300, 4, PARALLEL_THREADS_MAX);
}

/* An item that runs a loop of its own finishes it too. */
START_TEST(nested_loops)
{
	parallel_for(64, 1, PARALLEL_THREADS_MAX, nested_one, NULL);
}
END_TEST

/* parallel_begin/_end as a .put's flush uses them: item i waits until the
 * caller has made i available (or says none will come), while the caller
 * goes on making them; every available item runs once, the others return. */
struct stream {
	_Atomic size_t avail;
	_Atomic bool closed;
	_Atomic unsigned *seen;
	_Atomic size_t ran;
};

static void wait_then_count(void *ctx, size_t i)
{
	struct stream *st = ctx;

	while (i >= atomic_load(&st->avail))
		if (atomic_load(&st->closed) && i >= atomic_load(&st->avail))
			return;
	atomic_fetch_add(&st->seen[i], 1);
	atomic_fetch_add(&st->ran, 1);
}

static void check_stream(size_t n, size_t made, size_t max_threads)
{
	struct stream st = { .seen = calloc(n, sizeof(*st.seen)) };
	struct parallel_loop l;

	ck_assert_ptr_nonnull(st.seen);
	atomic_init(&st.avail, 0);
	atomic_init(&st.closed, false);
	atomic_init(&st.ran, 0);
	parallel_begin(&l, n, 4, max_threads, wait_then_count, &st);
	for (size_t i = 1; i <= made; i++) {
		for (volatile int spin = 0; spin < 2000; spin++)
			; /* the caller's own work between items */
		atomic_store(&st.avail, i);
	}
	atomic_store(&st.closed, true);
	parallel_end(&l);
	for (size_t i = 0; i < n; i++)
		ck_assert_uint_eq(atomic_load(&st.seen[i]), i < made ? 1 : 0);
	ck_assert_uint_eq(atomic_load(&st.ran), made);
	free(st.seen);
}

START_TEST(begin_and_end_around_the_callers_work)
{
	for (int k = 0; k < 50; k++) {
		check_stream(64, 64, PARALLEL_THREADS_MAX);
		check_stream(64, 37, PARALLEL_THREADS_MAX);
		check_stream(64, 0, PARALLEL_THREADS_MAX);
		check_stream(64, 20, 1); /* no helper: the caller runs them at the end */
	}
}
END_TEST

static double cpu_seconds(void)
{
	struct rusage u;

	getrusage(RUSAGE_SELF, &u);
	return (double)(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
	       (double)(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

static void sleep_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000 };

	while (nanosleep(&ts, &ts) != 0)
		;
}

/* Warmed workers (ARTFS_WAIT_AWAKE=1, as on a machine with CPUs to spare)
 * take every item of the loops that come, streamed or not, from several
 * threads at once, while more warm calls come; and once the warm time is
 * over they sleep: the process uses next to no CPU. Each test runs in a
 * process of its own (Check forks), so the variable decides here. */
static void *warm_caller(void *arg)
{
	(void)arg;
	for (int k = 0; k < 40; k++) {
		parallel_warm(2000000);
		check_loop(500, 4, PARALLEL_THREADS_MAX);
		check_stream(64, 64, PARALLEL_THREADS_MAX);
	}
	return NULL;
}

START_TEST(warm_workers_take_the_loops_then_sleep)
{
	pthread_t t[4];

	setenv("ARTFS_WAIT_AWAKE", "1", 1);
	ck_assert(parallel_wait_awake());
	for (int k = 0; k < 20; k++) {
		parallel_warm(1000000);
		check_stream(64, 64 - k, PARALLEL_THREADS_MAX);
	}
	for (int i = 0; i < 4; i++)
		ck_assert_int_eq(pthread_create(&t[i], NULL, warm_caller, NULL), 0);
	for (int i = 0; i < 4; i++)
		pthread_join(t[i], NULL);
	/* Warm for 100 ms with no loop: the workers spin that long (they use
	 * CPU while the caller sleeps), then sleep. */
	double before = cpu_seconds();
	parallel_warm(100000000);
	sleep_ms(50);
	ck_assert_double_gt(cpu_seconds() - before, 0.01);
	sleep_ms(100);
	before = cpu_seconds();
	sleep_ms(200);
	ck_assert_double_lt(cpu_seconds() - before, 0.02);
	check_loop(1000, 1, PARALLEL_THREADS_MAX); /* and wake for the next loop */
}
END_TEST

START_TEST(asleep_when_told)
{
	setenv("ARTFS_WAIT_AWAKE", "0", 1);
	ck_assert(!parallel_wait_awake());
	parallel_warm(1000000000); /* nothing: no worker spins */
	sleep_ms(20);
	double before = cpu_seconds();
	sleep_ms(200);
	ck_assert_double_lt(cpu_seconds() - before, 0.02);
	check_loop(1000, 1, PARALLEL_THREADS_MAX);
}
END_TEST

Suite *parallel_suite(void)
{
	Suite *s = suite_create("parallel");
	TCase *tc = tcase_create("parallel_for");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, every_item_once);
	tcase_add_test(tc, concurrent_loops);
	tcase_add_test(tc, nested_loops);
	tcase_add_test(tc, begin_and_end_around_the_callers_work);
	tcase_add_test(tc, warm_workers_take_the_loops_then_sleep);
	tcase_add_test(tc, asleep_when_told);
	suite_add_tcase(s, tc);
	return s;
}
