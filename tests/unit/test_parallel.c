#include "autoconf.h"

#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "parallel.h"
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

Suite *parallel_suite(void)
{
	Suite *s = suite_create("parallel");
	TCase *tc = tcase_create("parallel_for");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, every_item_once);
	tcase_add_test(tc, concurrent_loops);
	tcase_add_test(tc, nested_loops);
	suite_add_tcase(s, tc);
	return s;
}
