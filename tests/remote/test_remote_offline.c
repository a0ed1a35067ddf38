/* SPDX-License-Identifier: Apache-2.0 */
/* Tests of the Redis Cluster client that need no cluster: CRC16 and key
 * slots, addresses and seed lists, the metrics text, the checks of
 * remote_open's configuration, and a seed nothing listens on. */
#include "autoconf.h"

#include <check.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "remote/cluster.h"
#include "remote/remote.h"
#include "remote/stats.h"
#include "remote_fixture.h"

START_TEST(crc16_and_slots_follow_the_spec)
{
	/* The specification's check value, and slots that CLUSTER KEYSLOT of
	 * redis-server 7.0 gave for these keys. */
	ck_assert_uint_eq(cluster_crc16("123456789", 9), 0x31c3);
	static const struct { const char *key; unsigned slot; } cases[] = {
		{ "123456789", 12739 }, { "foo", 12182 }, { "bar", 5061 },
		{ "{user1000}.following", 3443 }, { "foo{}{bar}", 8363 },
		{ "foo{{bar}}zap", 4015 }, { "foo{bar}{zap}", 5061 }, { "{}", 15257 },
		{ "a{b", 13340 },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		ck_assert_msg(cluster_key_slot(cases[i].key, strlen(cases[i].key)) == cases[i].slot,
			      "%s", cases[i].key);
	ck_assert_uint_eq(cluster_key_slot("{user1000}.following", 20),
			  cluster_key_slot("{user1000}.followers", 20));
}
END_TEST

START_TEST(addresses_and_seed_lists)
{
	struct cluster_addr a;
	ck_assert_int_eq(cluster_addr_parse("127.0.0.1:7000", 14, &a), 0);
	ck_assert_str_eq(a.host, "127.0.0.1");
	ck_assert_int_eq(a.port, 7000);
	ck_assert_int_eq(cluster_addr_parse("[::1]:6379", 10, &a), 0);
	ck_assert_str_eq(a.host, "::1");
	ck_assert_int_eq(a.port, 6379);
	/* Redis writes IPv6 without brackets in MOVED. */
	ck_assert_int_eq(cluster_addr_parse("fe80::1:6380", 12, &a), 0);
	ck_assert_str_eq(a.host, "fe80::1");
	ck_assert_int_eq(a.port, 6380);
	const char *bad[] = { "", "host", "host:", ":7000", "host:0", "host:65536", "host:12x",
			      "[::1]7000", "[::1]:", "a b:1", "host:-1", "host:123456" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		ck_assert_msg(cluster_addr_parse(bad[i], strlen(bad[i]), &a) == -EINVAL, "%s", bad[i]);

	struct cluster_addr *s;
	size_t n;
	ck_assert_int_eq(cluster_seeds_parse("10.0.0.1:7000, redis-b:7001 ,[::1]:7002", &s, &n), 0);
	ck_assert_uint_eq(n, 3);
	ck_assert_str_eq(s[1].host, "redis-b");
	ck_assert_int_eq(s[1].port, 7001);
	ck_assert_str_eq(s[2].host, "::1");
	free(s);
	const char *bad_lists[] = { "", ",", "a:1,", "a:1,,b:2", "a:1 b:2", "a" };
	for (size_t i = 0; i < sizeof(bad_lists) / sizeof(bad_lists[0]); i++)
		ck_assert_msg(cluster_seeds_parse(bad_lists[i], &s, &n) == -EINVAL, "%s",
			      bad_lists[i]);
}
END_TEST

START_TEST(metrics_text)
{
	static struct remote_metrics m;
	uint64_t us[] = { 50, 100, 101, 3000, 1500000, 2000001, 9000000 };
	for (size_t i = 0; i < sizeof(us) / sizeof(us[0]); i++)
		remote_metrics_observe(&m, us[i]);
	counter_inc(&m.hits);
	counter_add(&m.bytes_in, 42);
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	remote_metrics_print(&m, f);
	fclose(f);
	ck_assert_double_eq(fixture_sample(text, "artfs_remote_hits_total"), 1);
	ck_assert_double_eq(fixture_sample(text, "artfs_remote_misses_total"), 0);
	ck_assert_double_eq(fixture_sample(text, "artfs_remote_errors_total"), 0);
	ck_assert_double_eq(fixture_sample(text, "artfs_remote_bytes_total{dir=\"in\"}"), 42);
	ck_assert_double_eq(fixture_sample(text, "artfs_remote_bytes_total{dir=\"out\"}"), 0);
	ck_assert_double_eq(
		fixture_sample(text, "artfs_remote_latency_seconds_bucket{le=\"0.0001\"}"), 2);
	ck_assert_double_eq(
		fixture_sample(text, "artfs_remote_latency_seconds_bucket{le=\"0.005\"}"), 4);
	ck_assert_double_eq(
		fixture_sample(text, "artfs_remote_latency_seconds_bucket{le=\"2\"}"), 5);
	ck_assert_double_eq(
		fixture_sample(text, "artfs_remote_latency_seconds_bucket{le=\"+Inf\"}"), 7);
	ck_assert_double_eq(fixture_sample(text, "artfs_remote_latency_seconds_count"), 7);
	ck_assert_double_eq_tol(fixture_sample(text, "artfs_remote_latency_seconds_sum"), 12.503252,
				1e-6);
	ck_assert_ptr_nonnull(strstr(text, "# TYPE artfs_remote_latency_seconds histogram\n"));
	ck_assert_ptr_nonnull(strstr(text, "# TYPE artfs_remote_hits_total counter\n"));
	free(text);
}
END_TEST

#ifndef HAVE_HIREDIS
START_TEST(without_hiredis_open_says_so)
{
	struct remote_config cfg = { .seeds = "127.0.0.1:7000" };
	struct remote *r = (struct remote *)1;
	ck_assert_int_eq(remote_open(&cfg, &r), -ENOTSUP);
	ck_assert_ptr_null(r);
}
END_TEST
#else

START_TEST(open_checks_its_config)
{
	struct remote *r;
	struct remote_config cfg = { .seeds = "" };
	ck_assert_int_eq(remote_open(&cfg, &r), -EINVAL);
	cfg.seeds = "127.0.0.1";
	ck_assert_int_eq(remote_open(&cfg, &r), -EINVAL);
	cfg.seeds = "127.0.0.1:1";
	cfg.prefix = "has space";
	ck_assert_int_eq(remote_open(&cfg, &r), -EINVAL);
	cfg.prefix = NULL;
	cfg.ttl_s = UINT64_MAX / 1000;
	ck_assert_int_eq(remote_open(&cfg, &r), -EINVAL);
	cfg.ttl_s = 0;
	cfg.timeout_ms = 3600001;
	ck_assert_int_eq(remote_open(&cfg, &r), -EINVAL);
	cfg.timeout_ms = 0;
	cfg.auth_file = "/nonexistent/artfs-redis-password";
	ck_assert_int_eq(remote_open(&cfg, &r), -ENOENT);
	char path[] = "/tmp/artfs-remote-auth.XXXXXX";
	int fd = mkstemp(path);
	ck_assert_int_ge(fd, 0);
	close(fd);
	cfg.auth_file = path;
	ck_assert_int_eq(remote_open(&cfg, &r), -EINVAL);   /* empty file */
	unlink(path);
}
END_TEST

/* Nothing listens on port 1: every call fails with EIO, and within its time. */
START_TEST(unreachable_seed_is_eio_in_time)
{
	struct remote *r;
	struct remote_config cfg = { .seeds = "127.0.0.1:1", .timeout_ms = 300 };
	ck_assert_int_eq(remote_open(&cfg, &r), 0);
	char key[65];
	fixture_random_key(key);
	uint8_t *val = NULL;
	size_t len = 0;
	double t0 = fixture_now_s();
	ck_assert_int_eq(remote_get(r, key, &val, &len), -EIO);
	ck_assert_ptr_null(val);
	ck_assert_int_eq(remote_put(r, key, "x", 1), -EIO);
	double took = fixture_now_s() - t0;
	ck_assert_msg(took >= 0.25 && took < 2 * 0.9, "two calls took %.3f s", took);
	struct remote_stats st;
	remote_stats(r, &st);
	ck_assert_uint_eq(st.errors, 2);
	/* Keys are 64 lowercase hex digits. */
	char upper[65];
	memset(upper, 'A', 64);
	ck_assert_int_eq(remote_get(r, upper, &val, &len), -EINVAL);
	char short_key[REMOTE_KEY_HEX + 1] = "0123";   /* stops at the NUL */
	ck_assert_int_eq(remote_put(r, short_key, "x", 1), -EINVAL);
	remote_close(r);
}
END_TEST
#endif

void offline_tests(TCase *tc)
{
	tcase_add_test(tc, crc16_and_slots_follow_the_spec);
	tcase_add_test(tc, addresses_and_seed_lists);
	tcase_add_test(tc, metrics_text);
#ifdef HAVE_HIREDIS
	tcase_add_test(tc, open_checks_its_config);
	tcase_add_test(tc, unreachable_seed_is_eio_in_time);
#else
	tcase_add_test(tc, without_hiredis_open_says_so);
#endif
}
