/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <errno.h>
#include <string.h>

#include "format/key.h"
#include "suites.h"

/* Expected keys computed with Python's hashlib, independently of artfs. */
static const struct { const char *wv, *hash, *key; } keys[] = {
	{ "default", "00", "vllm-artifact/406a80564f7937030046a9849805d04038bc46658afa460c786b19ec322787a8" },
	{ "a", "abababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababab",
	  "vllm-artifact/46263d6c4cb3aa90fcafb3e489942189b80d8e1e061cebfe0ca55ea09de740c9" },
	{ "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
	  "0123456789abcdef", "vllm-artifact/a489023ed704de5530241fcfd2c8c9a6a061034c0a5ff9c47de33ee98aae0e26" },
	{ "rl-step-0042", "ff", "vllm-artifact/73997e14c7a018df41a1c5cc0aed1cb466d5ad217633411d3a93c0ff4bf213ca" },
	/* From vectors.json, made by vLLM's routed_experts_key. */
	{ "default", "3da2892d37823d9298e1d5011d7dcfaaf2d9d9a6d465e99be33af5be1d87c12b",
	  "vllm-artifact/35f11f5976d0a00dadd63d221a9fa3a564e26b19c2b91a1e85be26101d22cf14" },
	{ "rl-step-0042", "0123456789abcdef",
	  "vllm-artifact/0bf06e5f0a8307bd99667c92e4e799ccdc9ae3afa091cfdf9a6e6baa3d39dac4" },
};

START_TEST(derive_matches_independent_vectors)
{
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		uint8_t hash[ARTFS_HASH_BYTES_MAX];
		size_t len;
		char key[ARTFS_KEY_LEN + 1];
		ck_assert_int_eq(key_hash_decode(keys[i].hash, hash, &len), 0);
		key_derive(keys[i].wv, hash, len, key);
		ck_assert_str_eq(key, keys[i].key);
	}
}
END_TEST

START_TEST(version_names)
{
	const char *good[] = { "default", "a", "0", "rl-step-0042", "V1.2_x-y", "a..b" };
	const char *bad[] = { "", ".a", "-a", "_a", "a b", "a/b", "ä", "a:b", "a\n" };
	char longest[130];
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
		ck_assert_msg(key_version_name_valid(good[i]), "%s", good[i]);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		ck_assert_msg(!key_version_name_valid(bad[i]), "%s", bad[i]);
	memset(longest, 'v', 128);
	longest[128] = '\0';
	ck_assert(key_version_name_valid(longest));
	longest[128] = 'v';
	longest[129] = '\0';
	ck_assert(!key_version_name_valid(longest));
}
END_TEST

START_TEST(hash_names)
{
	uint8_t out[ARTFS_HASH_BYTES_MAX];
	size_t len;
	char name[131];

	ck_assert_int_eq(key_hash_decode("00", out, &len), 0);
	ck_assert_uint_eq(len, 1);
	ck_assert_int_eq(key_hash_decode("0aff", out, &len), 0);
	ck_assert_uint_eq(len, 2);
	ck_assert_uint_eq(out[0], 0x0a);
	ck_assert_uint_eq(out[1], 0xff);
	const char *bad[] = { "", "0", "abc", "0A", "zz", "0g", " 00", "00 ", ".tmp.1" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		ck_assert_int_eq(key_hash_decode(bad[i], out, &len), -EINVAL);
	memset(name, 'a', 128);
	name[128] = '\0';
	ck_assert_int_eq(key_hash_decode(name, out, &len), 0);
	ck_assert_uint_eq(len, 64);
	name[128] = 'a';
	name[129] = 'a';
	name[130] = '\0';
	ck_assert_int_eq(key_hash_decode(name, out, &len), -EINVAL);
}
END_TEST

START_TEST(hex_round_trip)
{
	uint8_t bytes[3] = { 0x00, 0x9f, 0xff }, back[32];
	char hex[7];
	key_hex(bytes, 3, hex);
	ck_assert_str_eq(hex, "009fff");
	ck_assert_int_eq(key_sha256_decode("00", back), -EINVAL);
}
END_TEST

Suite *key_suite(void)
{
	Suite *s = suite_create("key");
	TCase *tc = tcase_create("key");
	tcase_add_test(tc, derive_matches_independent_vectors);
	tcase_add_test(tc, version_names);
	tcase_add_test(tc, hash_names);
	tcase_add_test(tc, hex_round_trip);
	suite_add_tcase(s, tc);
	return s;
}
