/* SPDX-License-Identifier: Apache-2.0 */
/* Tests of the Redis Cluster client against a healthy cluster: values in
 * and out (sizes, NX, absent keys, TTLs), keys spread over the masters,
 * batches of one round per node, threads sharing one client, a full
 * cluster (ENOSPC), and AUTH with a password file. */
#include "autoconf.h"

#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "remote/remote.h"
#include "remote/stats.h"
#include "remote_fixture.h"

#ifdef HAVE_HIREDIS
static void put_get_one(struct remote *r, const char *key, size_t len)
{
	uint8_t *val = malloc(len ? len : 1), *got = NULL;
	size_t got_len = 0;
	fixture_random_bytes(val, len);
	ck_assert_int_eq(remote_put(r, key, val, len), 0);
	ck_assert_int_eq(remote_get(r, key, &got, &got_len), 0);
	ck_assert_uint_eq(got_len, len);
	ck_assert_int_eq(memcmp(got, val, len), 0);
	free(got);
	free(val);
}

START_TEST(put_get_round_trip)
{
	struct remote *r = fixture_client(NULL, 2000);
	char key[65];
	size_t sizes[] = { 0, 1, 6144, 100000, 3 << 20 };
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		fixture_random_key(key);
		put_get_one(r, key, sizes[i]);
	}
	fixture_random_key(key);
	uint8_t *got = NULL;
	size_t got_len = 1;
	ck_assert_int_eq(remote_put(r, key, NULL, 0), 0);   /* empty value, no buffer */
	ck_assert_int_eq(remote_put(r, key, NULL, 0), 0);
	ck_assert_int_eq(remote_get(r, key, &got, &got_len), 0);
	ck_assert_uint_eq(got_len, 0);
	free(got);
	/* Many keys: routed by CRC16 straight to their master, never redirected. */
	for (int i = 0; i < 50; i++) {
		fixture_random_key(key);
		put_get_one(r, key, 32);
	}
	struct remote_stats st;
	remote_stats(r, &st);
	ck_assert_uint_eq(st.hits, 56);
	ck_assert_uint_eq(st.puts, 56);
	ck_assert_uint_eq(st.moved, 0);
	ck_assert_uint_eq(st.asked, 0);
	ck_assert_uint_eq(st.errors, 0);
	ck_assert_uint_ge(st.bytes_out, (3u << 20) + 100000);
	ck_assert_uint_ge(st.bytes_in, (3u << 20) + 100000);
	remote_close(r);
}
END_TEST

START_TEST(identical_again_is_0_different_is_eexist)
{
	struct remote *r = fixture_client(NULL, 2000);
	char key[65];
	fixture_random_key(key);
	ck_assert_int_eq(remote_put(r, key, "first", 5), 0);
	ck_assert_int_eq(remote_put(r, key, "first", 5), 0);
	ck_assert_int_eq(remote_put(r, key, "other", 5), -EEXIST);
	ck_assert_int_eq(remote_put(r, key, "firs", 4), -EEXIST);
	uint8_t *val;
	size_t len;
	ck_assert_int_eq(remote_get(r, key, &val, &len), 0);
	ck_assert_uint_eq(len, 5);
	ck_assert_int_eq(memcmp(val, "first", 5), 0);
	free(val);
	struct remote_stats st;
	remote_stats(r, &st);
	ck_assert_uint_eq(st.puts, 1);
	ck_assert_uint_eq(st.errors, 0);
	remote_close(r);
}
END_TEST

START_TEST(absent_is_enoent)
{
	struct remote *r = fixture_client(NULL, 2000);
	char key[65];
	fixture_random_key(key);
	uint8_t *val = (uint8_t *)1;
	size_t len = 1;
	ck_assert_int_eq(remote_get(r, key, &val, &len), -ENOENT);
	ck_assert_ptr_null(val);
	struct remote_stats st;
	remote_stats(r, &st);
	ck_assert_uint_eq(st.misses, 1);
	ck_assert_uint_eq(st.hits, 0);
	remote_close(r);
}
END_TEST

START_TEST(values_expire_after_the_ttl)
{
	char prefix[32];
	fixture_prefix(prefix, sizeof(prefix), false);
	struct remote *r = fixture_client(prefix, 2000);
	char key[65];
	fixture_random_key(key);
	ck_assert_int_eq(remote_put(r, key, "v", 1), 0);
	int port = fixture_master_of_slot(fixture_slot_of(prefix, key));
	redisReply *t = fixture_admin(port, "PTTL %s:%s", prefix, key);
	ck_assert_int_eq(t->type, REDIS_REPLY_INTEGER);
	ck_assert_msg(t->integer > 590000 && t->integer <= 600000, "PTTL %lld", t->integer);
	freeReplyObject(t);
	remote_close(r);

	struct remote_config cfg = { .seeds = fixture_seeds(), .prefix = prefix };   /* ttl 0 */
	ck_assert_int_eq(remote_open(&cfg, &r), 0);
	fixture_random_key(key);
	ck_assert_int_eq(remote_put(r, key, "v", 1), 0);
	port = fixture_master_of_slot(fixture_slot_of(prefix, key));
	t = fixture_admin(port, "PTTL %s:%s", prefix, key);
	ck_assert_int_eq(t->integer, -1);
	freeReplyObject(t);
	remote_close(r);
}
END_TEST

/* Each key is on the master CLUSTER KEYSLOT names, and the keys of one
 * prefix cover all three masters. */
START_TEST(keys_spread_over_all_masters)
{
	char prefix[32];
	fixture_prefix(prefix, sizeof(prefix), false);
	struct remote *r = fixture_client(prefix, 2000);
	int seen[NODES] = { 0 };
	for (int i = 0; i < 64; i++) {
		char key[65];
		fixture_random_key(key);
		ck_assert_int_eq(remote_put(r, key, key, 64), 0);
		redisReply *s = fixture_admin(fixture_base_port, "CLUSTER KEYSLOT %s:%s", prefix,
					      key);
		ck_assert_int_eq(s->integer, (long long)fixture_slot_of(prefix, key));
		freeReplyObject(s);
		int port = fixture_master_of_slot(fixture_slot_of(prefix, key));
		redisReply *g = fixture_admin(port, "GET %s:%s", prefix, key);
		ck_assert_int_eq(g->type, REDIS_REPLY_STRING);
		ck_assert_int_eq(memcmp(g->str, key, 64), 0);
		freeReplyObject(g);
		seen[port - fixture_base_port]++;
	}
	int m[3];
	fixture_masters(m);
	for (int i = 0; i < 3; i++)
		ck_assert_msg(seen[m[i] - fixture_base_port] > 0, "no key on master %d", m[i]);
	remote_close(r);
}
END_TEST

#define BATCH 300

START_TEST(batches_take_one_round_per_node)
{
	char prefix[32];
	fixture_prefix(prefix, sizeof(prefix), false);
	struct remote *r = fixture_client(prefix, 2000);
	static char keys[BATCH + 20][65];
	static uint8_t data[BATCH][100];
	const char *kp[BATCH + 20];
	const void *vp[BATCH];
	size_t lens[BATCH + 20];
	int results[BATCH + 20];
	uint8_t *vals[BATCH + 20];
	int port_used[NODES] = { 0 };

	for (int i = 0; i < BATCH + 20; i++) {
		fixture_random_key(keys[i]);
		kp[i] = keys[i];
	}
	for (int i = 0; i < BATCH; i++) {
		fixture_random_bytes(data[i], sizeof(data[i]));
		vp[i] = data[i];
		lens[i] = 1 + (size_t)i % 100;
		int port = fixture_master_of_slot(fixture_slot_of(prefix, keys[i]));
		port_used[port - fixture_base_port] = 1;
	}
	int nodes = 0;
	for (int i = 0; i < NODES; i++)
		nodes += port_used[i];
	ck_assert_int_eq(nodes, 3);

	struct remote_stats a, b;
	remote_stats(r, &a);
	ck_assert_int_eq(remote_put_many(r, BATCH, kp, vp, lens, results), 0);
	remote_stats(r, &b);
	for (int i = 0; i < BATCH; i++)
		ck_assert_int_eq(results[i], 0);
	ck_assert_uint_eq(b.rounds - a.rounds, (uint64_t)nodes);
	ck_assert_uint_eq(b.puts - a.puts, BATCH);

	/* Read back with 20 absent keys mixed in: still one round per node. */
	remote_stats(r, &a);
	ck_assert_int_eq(remote_get_many(r, BATCH + 20, kp, vals, lens, results), -ENOENT);
	remote_stats(r, &b);
	ck_assert_uint_eq(b.rounds - a.rounds, (uint64_t)nodes);
	ck_assert_uint_eq(b.hits - a.hits, BATCH);
	ck_assert_uint_eq(b.misses - a.misses, 20);
	for (int i = 0; i < BATCH; i++) {
		ck_assert_int_eq(results[i], 0);
		ck_assert_uint_eq(lens[i], 1 + (size_t)i % 100);
		ck_assert_int_eq(memcmp(vals[i], data[i], lens[i]), 0);
		free(vals[i]);
	}
	for (int i = BATCH; i < BATCH + 20; i++) {
		ck_assert_int_eq(results[i], -ENOENT);
		ck_assert_ptr_null(vals[i]);
	}

	/* The same batch again: refused by NX, compared with one GET round. */
	for (int i = 0; i < BATCH; i++)
		lens[i] = 1 + (size_t)i % 100;
	data[7][0] ^= 1;   /* one record differs */
	remote_stats(r, &a);
	ck_assert_int_eq(remote_put_many(r, BATCH, kp, vp, lens, results), -EEXIST);
	remote_stats(r, &b);
	for (int i = 0; i < BATCH; i++)
		ck_assert_int_eq(results[i], i == 7 ? -EEXIST : 0);
	ck_assert_uint_eq(b.rounds - a.rounds, 2 * (uint64_t)nodes);
	ck_assert_uint_eq(b.puts - a.puts, 0);
	remote_close(r);
}
END_TEST

struct worker {
	struct remote *r;
	int failures;
};

static void *hammer(void *arg)
{
	struct worker *w = arg;
	for (int i = 0; i < 100; i++) {
		char key[65];
		uint8_t val[256], *got = NULL;
		size_t len = 0;
		fixture_random_key(key);
		fixture_random_bytes(val, sizeof(val));
		if (remote_put(w->r, key, val, sizeof(val)) != 0 ||
		    remote_get(w->r, key, &got, &len) != 0 || len != sizeof(val) ||
		    memcmp(got, val, len) != 0)
			w->failures++;
		free(got);
	}
	return NULL;
}

START_TEST(many_threads_share_one_client)
{
	struct remote *r = fixture_client(NULL, 2000);
	pthread_t t[8];
	struct worker w[8];
	for (int i = 0; i < 8; i++) {
		w[i] = (struct worker){ r, 0 };
		ck_assert_int_eq(pthread_create(&t[i], NULL, hammer, &w[i]), 0);
	}
	for (int i = 0; i < 8; i++) {
		pthread_join(t[i], NULL);
		ck_assert_int_eq(w[i].failures, 0);
	}
	struct remote_stats st;
	remote_stats(r, &st);
	ck_assert_uint_eq(st.hits, 800);
	ck_assert_uint_eq(st.errors, 0);
	/* At most POOL_SIZE (4) connections per master, however many threads. */
	ck_assert_uint_le(st.connects, 3 * 4 + 2 * st.refreshes);

	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	remote_metrics_render(r, f);
	remote_metrics_render(NULL, f);
	fclose(f);
	ck_assert_double_eq(fixture_sample(text, "artfs_remote_hits_total"), 800);
	ck_assert_double_eq(fixture_sample(text, "artfs_remote_latency_seconds_count"), 1600);
	ck_assert_double_eq(
		fixture_sample(text, "artfs_remote_latency_seconds_bucket{le=\"+Inf\"}"), 1600);
	ck_assert_double_eq(fixture_sample(text, "artfs_remote_bytes_total{dir=\"out\"}"),
			    (double)st.bytes_out);
	free(text);
	remote_close(r);
}
END_TEST

START_TEST(cluster_out_of_memory_is_enospc)
{
	struct remote *r = fixture_client(NULL, 2000);
	char key[65], old[65];
	fixture_random_key(old);
	ck_assert_int_eq(remote_put(r, old, "kept", 4), 0);
	int m[3];
	fixture_masters(m);
	for (int i = 0; i < 3; i++)
		fixture_admin_ok(m[i], "CONFIG SET maxmemory",
				 fixture_admin(m[i], "CONFIG SET maxmemory 1"));
	fixture_random_key(key);
	int put = remote_put(r, key, "value", 5);
	uint8_t *val = NULL;
	size_t len;
	int get = remote_get(r, old, &val, &len);   /* reads still work */
	struct remote_stats st;
	remote_stats(r, &st);
	for (int i = 0; i < 3; i++)
		fixture_admin_ok(m[i], "CONFIG SET maxmemory",
				 fixture_admin(m[i], "CONFIG SET maxmemory 0"));
	ck_assert_int_eq(put, -ENOSPC);
	ck_assert_int_eq(get, 0);
	ck_assert_uint_eq(len, 4);
	free(val);
	ck_assert_uint_eq(st.errors, 1);
	ck_assert_int_eq(remote_put(r, key, "value", 5), 0);
	remote_close(r);
}
END_TEST

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	fputs(text, f);
	fclose(f);
	chmod(path, 0600);
}

START_TEST(auth_with_a_password_file)
{
	char good[512], wrong[512], key[65];
	snprintf(good, sizeof(good), "%s/password", fixture_cluster_dir);
	snprintf(wrong, sizeof(wrong), "%s/wrong-password", fixture_cluster_dir);
	write_file(good, "s3cret pass\r\n");
	write_file(wrong, "not it\n");
	fixture_set_password("s3cret pass");

	struct remote *r;
	struct remote_config cfg = { .seeds = fixture_seeds(), .timeout_ms = 500 };
	fixture_random_key(key);
	ck_assert_int_eq(remote_open(&cfg, &r), 0);   /* refused: logged, not fatal */
	int none = remote_put(r, key, "v", 1);
	remote_close(r);
	cfg.auth_file = wrong;
	ck_assert_int_eq(remote_open(&cfg, &r), 0);
	int bad = remote_put(r, key, "v", 1);
	remote_close(r);
	cfg.auth_file = good;
	cfg.timeout_ms = 2000;
	ck_assert_int_eq(remote_open(&cfg, &r), 0);
	int ok = remote_put(r, key, "v", 1);
	uint8_t *val = NULL;
	size_t len = 0;
	int got = remote_get(r, key, &val, &len);
	remote_close(r);
	free(val);
	fixture_set_password("");

	ck_assert_int_eq(none, -EIO);
	ck_assert_int_eq(bad, -EIO);
	ck_assert_int_eq(ok, 0);
	ck_assert_int_eq(got, 0);
	ck_assert_uint_eq(len, 1);
}
END_TEST

/* Keys by name: put and get as R3 keys are, names up to REMOTE_NAME_MAX
 * bytes (longer or empty: EINVAL), NX keeping the first value. */
START_TEST(named_keys_put_get_and_bounds)
{
	char prefix[32];
	fixture_prefix(prefix, sizeof(prefix), false);
	struct remote *r = fixture_client(prefix, 2000);
	char *name = malloc(REMOTE_NAME_MAX + 2);
	uint8_t *got = NULL;
	size_t len = 0;

	ck_assert_int_eq(remote_put_named(r, "cache:a/b c", "one", 3), 0);
	ck_assert_int_eq(remote_put_named(r, "cache:a/b c", "one", 3), 0);
	ck_assert_int_eq(remote_put_named(r, "cache:a/b c", "two", 3), -EEXIST);
	ck_assert_int_eq(remote_get_named(r, "cache:a/b c", &got, &len), 0);
	ck_assert_uint_eq(len, 3);
	ck_assert_int_eq(memcmp(got, "one", 3), 0);
	free(got);
	ck_assert_int_eq(remote_get_named(r, "cache:absent", &got, &len), -ENOENT);
	ck_assert_ptr_null(got);

	memset(name, 'n', REMOTE_NAME_MAX);
	name[REMOTE_NAME_MAX] = '\0';
	ck_assert_int_eq(remote_put_named(r, name, "x", 1), 0);
	ck_assert_int_eq(remote_get_named(r, name, &got, &len), 0);
	ck_assert_uint_eq(len, 1);
	free(got);
	name[REMOTE_NAME_MAX] = 'n';
	name[REMOTE_NAME_MAX + 1] = '\0';
	ck_assert_int_eq(remote_put_named(r, name, "x", 1), -EINVAL);
	ck_assert_int_eq(remote_get_named(r, name, &got, &len), -EINVAL);
	ck_assert_int_eq(remote_put_named(r, "", "x", 1), -EINVAL);
	free(name);
	remote_close(r);
}
END_TEST

static bool has_member(char **m, size_t n, const char *want)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(m[i], want) == 0)
			return true;
	return false;
}

/* SADD in one round for many sets, each given the TTL; SMEMBERS bounded
 * in count and in member size; an absent set is empty. */
START_TEST(sets_add_expire_and_list_bounded)
{
	char prefix[32];
	fixture_prefix(prefix, sizeof(prefix), false);
	struct remote *r = fixture_client(prefix, 2000);
	const char *names[] = { "cachedir:", "cachedir:a", "cachedir:a", "cachedir:a/b" };
	const char *members[] = { "a", "b", "c", "f" };
	int results[4];
	char **m = NULL;
	size_t n = 0;

	ck_assert_int_eq(remote_sadd_named(r, 4, names, members, results), 0);
	ck_assert_int_eq(remote_sadd_named(r, 4, names, members, results), 0);   /* again: 0 */
	ck_assert_int_eq(remote_members_named(r, "cachedir:a", 10, 255, &m, &n), 0);
	ck_assert_uint_eq(n, 2);
	ck_assert(has_member(m, n, "b") && has_member(m, n, "c"));
	remote_members_free(m, n);
	ck_assert_int_eq(remote_members_named(r, "cachedir:a", 1, 255, &m, &n), 0);
	ck_assert_uint_eq(n, 1);   /* at most max */
	remote_members_free(m, n);
	const char *rem_names[] = { "cachedir:a", "cachedir:gone" };
	const char *rem[] = { "b", "x" };
	ck_assert_int_eq(remote_srem_named(r, 2, rem_names, rem, results), 0);
	ck_assert_int_eq(remote_members_named(r, "cachedir:a", 10, 255, &m, &n), 0);
	ck_assert_uint_eq(n, 1);
	ck_assert_str_eq(m[0], "c");
	remote_members_free(m, n);
	const char *big[] = { "cachedir:z" };
	char long_member[300];
	memset(long_member, 'l', 299);
	long_member[299] = '\0';
	const char *lm[] = { long_member };
	ck_assert_int_eq(remote_sadd_named(r, 1, big, lm, results), 0);
	ck_assert_int_eq(remote_members_named(r, "cachedir:z", 10, 255, &m, &n), 0);
	ck_assert_uint_eq(n, 0);   /* longer than max_len: left out */
	remote_members_free(m, n);
	ck_assert_int_eq(remote_members_named(r, "cachedir:none", 10, 255, &m, &n), 0);
	ck_assert_uint_eq(n, 0);
	remote_members_free(m, n);

	int port = fixture_master_of_slot(fixture_slot_of(prefix, "cachedir:a"));
	redisReply *t = fixture_admin(port, "PTTL %s:cachedir:a", prefix);
	ck_assert_int_eq(t->type, REDIS_REPLY_INTEGER);
	ck_assert_msg(t->integer > 590000 && t->integer <= 600000, "PTTL %lld", t->integer);
	freeReplyObject(t);
	/* SREM and DEL in one call: the member leaves its set (the set's last:
	 * the set goes), the value goes; an absent key or member is 0 too. */
	ck_assert_int_eq(remote_put_named(r, "cache:a/f", "v", 1), 0);
	ck_assert_int_eq(remote_srem_del_named(r, "cachedir:a", "c", "cache:a/f"), 0);
	uint8_t *v = NULL;
	size_t vlen = 0;
	ck_assert_int_eq(remote_get_named(r, "cache:a/f", &v, &vlen), -ENOENT);
	ck_assert_int_eq(remote_members_named(r, "cachedir:a", 10, 255, &m, &n), 0);
	ck_assert_uint_eq(n, 0);
	remote_members_free(m, n);
	ck_assert_int_eq(remote_srem_del_named(r, "cachedir:gone", "x", "cache:never"), 0);
	ck_assert_int_eq(remote_put_named(r, "cache:a/f", "w", 1), 0); /* written anew */
	/* A key that holds no set: EIO, not a crash or a hang. */
	ck_assert_int_eq(remote_put_named(r, "cachedir:str", "v", 1), 0);
	const char *str[] = { "cachedir:str" };
	ck_assert_int_eq(remote_sadd_named(r, 1, str, members, results), -EIO);
	ck_assert_int_eq(remote_members_named(r, "cachedir:str", 10, 255, &m, &n), -EIO);
	remote_close(r);
}
END_TEST

void data_tests(TCase *tc)
{
	tcase_add_test(tc, put_get_round_trip);
	tcase_add_test(tc, identical_again_is_0_different_is_eexist);
	tcase_add_test(tc, absent_is_enoent);
	tcase_add_test(tc, values_expire_after_the_ttl);
	tcase_add_test(tc, keys_spread_over_all_masters);
	tcase_add_test(tc, batches_take_one_round_per_node);
	tcase_add_test(tc, many_threads_share_one_client);
	tcase_add_test(tc, cluster_out_of_memory_is_enospc);
	tcase_add_test(tc, auth_with_a_password_file);
	tcase_add_test(tc, named_keys_put_get_and_bounds);
	tcase_add_test(tc, sets_add_expire_and_list_bounded);
}
#endif
