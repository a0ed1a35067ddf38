/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "format/envelope.h"
#include "format/key.h"
#include "suites.h"

/* Every vector made by vLLM's encoder parses to the fields vectors.json
 * lists, and encoding those fields gives back the same bytes. */
START_TEST(vectors_parse_and_reencode)
{
	size_t jlen;
	uint8_t *jtext = read_vector("vectors.json", &jlen);
	json_t *root = json_loadb((const char *)jtext, jlen, 0, NULL);
	ck_assert(root);
	json_t *cases = json_object_get(root, "cases"), *c;
	size_t i;
	ck_assert_uint_eq(json_array_size(cases), 5);
	json_array_foreach(cases, i, c) {
		char file[256];
		size_t len;
		struct envelope env;
		char detail[256];
		snprintf(file, sizeof(file), "%s.envelope", json_string_value(json_object_get(c, "name")));
		uint8_t *buf = read_vector(file, &len);
		ck_assert_int_eq(envelope_parse(buf, len, &env, detail, sizeof(detail)), ENVELOPE_OK);
		ck_assert_str_eq(env.key, json_string_value(json_object_get(c, "key")));
		ck_assert_str_eq(envelope_kind_name(env.kind), json_string_value(json_object_get(c, "kind")));
		ck_assert_str_eq(env.array.dtype, json_string_value(json_object_get(c, "dtype")));
		json_t *shape = json_object_get(c, "shape");
		ck_assert_uint_eq(env.array.ndim, json_array_size(shape));
		for (size_t d = 0; d < env.array.ndim; d++)
			ck_assert_uint_eq(env.array.shape[d], (uint64_t)json_integer_value(json_array_get(shape, d)));
		ck_assert_uint_eq(env.source_token_start,
				  (uint64_t)json_integer_value(json_object_get(c, "source_token_start")));
		char sha[65];
		key_hex(env.payload_sha256, 32, sha);
		ck_assert_str_eq(sha, json_string_value(json_object_get(c, "payload_sha256")));
		ck_assert_uint_eq(envelope_total_len(&env), len);

		/* The key is the one derived from the case's path. */
		uint8_t hash[ARTFS_HASH_BYTES_MAX];
		size_t hlen;
		char key[ARTFS_KEY_LEN + 1];
		ck_assert_int_eq(key_hash_decode(json_string_value(json_object_get(c, "block_hash")), hash, &hlen), 0);
		key_derive(json_string_value(json_object_get(c, "weight_version")), hash, hlen, key);
		ck_assert_str_eq(key, env.key);

		uint8_t *out;
		size_t out_len;
		const uint8_t *payload = buf + 4 + env.header_len;
		ck_assert_int_eq(envelope_encode(&env, payload, env.payload_len, &out, &out_len), 0);
		ck_assert_uint_eq(out_len, len);
		ck_assert_int_eq(memcmp(out, buf, len), 0);
		free(out);
		free(buf);
	}
	json_decref(root);
	free(jtext);
}
END_TEST

static const char good_header[] =
	"{\"dtype\":\"|u1\",\"field\":\"routed_experts\",\"key\":\"vllm-artifact/"
	"35f11f5976d0a00dadd63d221a9fa3a564e26b19c2b91a1e85be26101d22cf14\",\"kind\":\"block\","
	"\"payload_sha256\":\"6580789f3158d6a870fde229a00e0c09fdcbcf0be8b9f4aaefd92ad1334d9e1f\","
	"\"schema_version\":3,\"shape\":[16,61,8],\"source_token_start\":0}";

/* good_header with one substring replaced. */
static char *variant(const char *from, const char *to)
{
	static char out[8192];
	const char *at = strstr(good_header, from);
	ck_assert_msg(at != NULL, "%s", from);
	snprintf(out, sizeof(out), "%.*s%s%s", (int)(at - good_header), good_header, to, at + strlen(from));
	return out;
}

static enum envelope_error parse_text(const char *json)
{
	struct envelope env;
	char detail[256];
	return envelope_parse_header((const uint8_t *)json, strlen(json), &env, detail, sizeof(detail));
}

/* good_header changed one way, and what the parser says of it. */
static const struct {
	const char *from, *to;
	enum envelope_error want;
} rejection_cases[] = {
		{ "\"schema_version\":3", "\"schema_version\":2", ENVELOPE_SCHEMA },
		{ "\"schema_version\":3", "\"schema_version\":3.0", ENVELOPE_SCHEMA },
		{ "\"schema_version\":3", "\"schema_version\":\"3\"", ENVELOPE_SCHEMA },
		{ "\"schema_version\":3", "\"schema_version\":true", ENVELOPE_SCHEMA },
		{ "\"schema_version\":3", "\"schema_version\":99999999999999999999", ENVELOPE_JSON },
		{ "vllm-artifact/35", "vllm-artefact/35", ENVELOPE_KEY },
		{ "cf14\"", "CF14\"", ENVELOPE_KEY },
		{ "cf14\"", "cf1\"", ENVELOPE_KEY },
		{ "cf14\"", "cf14a\"", ENVELOPE_KEY },
		{ "\"kind\":\"block\"", "\"kind\":\"Block\"", ENVELOPE_KIND },
		{ "\"kind\":\"block\"", "\"kind\":null", ENVELOPE_KIND },
		{ "\"field\":\"routed_experts\"", "\"field\":\"routed_expert\"", ENVELOPE_FIELD },
		{ "\"dtype\":\"|u1\"", "\"dtype\":\"|u1 \"", ENVELOPE_DTYPE },
		{ "\"dtype\":\"|u1\"", "\"dtype\":\"<c8\"", ENVELOPE_DTYPE },
		{ "\"dtype\":\"|u1\"", "\"dtype\":\"|u\\u00001\"", ENVELOPE_JSON },
		{ "[16,61,8]", "[]", ENVELOPE_SHAPE },
		{ "[16,61,8]", "[16,0,8]", ENVELOPE_SHAPE },
		{ "[16,61,8]", "[16,-61,8]", ENVELOPE_SHAPE },
		{ "[16,61,8]", "[16,61.5,8]", ENVELOPE_SHAPE },
		{ "[16,61,8]", "[1,1,1,1,1,1,1,1,1]", ENVELOPE_SHAPE },
		{ "[16,61,8]", "{\"0\":16}", ENVELOPE_SHAPE },
		{ "\"source_token_start\":0", "\"source_token_start\":-1", ENVELOPE_TOKEN_START },
		{ "\"source_token_start\":0", "\"source_token_start\":0.0", ENVELOPE_TOKEN_START },
		{ "\"source_token_start\":0", "\"source_token_start\":1e3", ENVELOPE_TOKEN_START },
		{ "\"source_token_start\":0", "\"source_token_start\":016", ENVELOPE_JSON },
		{ "\"source_token_start\":0", "\"source_token_start\":99999999999999999999", ENVELOPE_JSON },
		{ "\"source_token_start\":0", "\"source_token_start\":\"16\"", ENVELOPE_TOKEN_START },
		{ "\"source_token_start\":0}", "\"source_token_start\":16}x", ENVELOPE_JSON },
		{ "6580789f", "6580789F", ENVELOPE_CHECKSUM_FORMAT },
		{ "6580789f", "658078", ENVELOPE_CHECKSUM_FORMAT },
		{ "\"kind\":\"block\",", "", ENVELOPE_FIELDS },
		{ "{", "{\"extra\":1,", ENVELOPE_FIELDS },
		{ "{", "{\"kind\":\"block\",", ENVELOPE_JSON },  /* duplicate key */
		{ "}", "}x", ENVELOPE_JSON },
		{ "}", "", ENVELOPE_JSON },
		{ "{", "[", ENVELOPE_JSON },
};

START_TEST(rejections)
{
	ck_assert_int_eq(parse_text(good_header), ENVELOPE_OK);
	for (size_t i = 0; i < sizeof(rejection_cases) / sizeof(rejection_cases[0]); i++) {
		enum envelope_error got = parse_text(variant(rejection_cases[i].from, rejection_cases[i].to));
		ck_assert_msg(got == rejection_cases[i].want, "case %zu (%s -> %s): got %s, want %s", i,
			      rejection_cases[i].from, rejection_cases[i].to, envelope_error_name(got),
			      envelope_error_name(rejection_cases[i].want));
	}
	ck_assert_int_eq(parse_text("3"), ENVELOPE_JSON);
	ck_assert_int_eq(parse_text("\"x\""), ENVELOPE_JSON);
	ck_assert_int_eq(parse_text(" "), ENVELOPE_JSON);
	/* Whitespace around a valid object is fine. */
	char spaced[4096];
	snprintf(spaced, sizeof(spaced), " \n%s\t\n", good_header);
	ck_assert_int_eq(parse_text(spaced), ENVELOPE_OK);
}
END_TEST

static enum envelope_error parse_like(struct envelope_layout *l, const char *json,
				      struct envelope *env)
{
	char detail[256];
	return envelope_parse_header_like(l, (const uint8_t *)json, strlen(json), env, detail,
					  sizeof(detail));
}

static void assert_same_parse(const char *json, const struct envelope *got)
{
	struct envelope want;
	char detail[256];
	ck_assert_int_eq(envelope_parse_header((const uint8_t *)json, strlen(json), &want, detail,
					       sizeof(detail)), ENVELOPE_OK);
	ck_assert_msg(envelope_same(got, &want) && got->payload_len == want.payload_len &&
		      got->header_len == want.header_len, "%s", json);
}

/* A header laid out as the one before (only the key's and payload_sha256's
 * hex digits differ, and source_token_start's digits) is answered without
 * a parse; every other header is parsed, and every answer is the
 * parser's. */
START_TEST(layout_fast_path_agrees_with_the_parser)
{
	struct envelope_layout l = { 0 };
	struct envelope env;

	ck_assert_int_eq(parse_like(&l, good_header, &env), ENVELOPE_OK);
	ck_assert_uint_eq(l.len, strlen(good_header));
	/* other digits in both places: the fast path, the parser's answer */
	char other[4096];
	snprintf(other, sizeof(other), "%s",
		 variant("35f11f5976d0a00dadd63d221a9fa3a564e26b19c2b91a1e85be26101d22cf14",
			 "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"));
	char *sha = strstr(other, "6580789f");
	memcpy(sha, "ffffeeee", 8);
	ck_assert_int_eq(parse_like(&l, other, &env), ENVELOPE_OK);
	assert_same_parse(other, &env);
	ck_assert_str_eq(env.key, "vllm-artifact/0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef");
	ck_assert_uint_eq(env.payload_sha256[0], 0xff);
	ck_assert_uint_eq(env.payload_sha256[3], 0xee);
	/* other starts, of other lengths: the fast path (nothing learnt anew),
	 * the parser's answer */
	static const char *starts[] = { "16", "7", "112", "4096", "123456789012345678" };
	for (size_t i = 0; i < sizeof(starts) / sizeof(starts[0]); i++) {
		char from[64], to[64];
		snprintf(to, sizeof(to), "\"source_token_start\":%s}", starts[i]);
		snprintf(from, sizeof(from), "\"source_token_start\":0}");
		const char *h = variant(from, to);
		ck_assert_int_eq(parse_like(&l, h, &env), ENVELOPE_OK);
		assert_same_parse(h, &env);
		ck_assert_uint_eq(env.source_token_start, strtoull(starts[i], NULL, 10));
		ck_assert_uint_eq(env.header_len, strlen(h));
		ck_assert_uint_eq(l.len, strlen(good_header));
	}
	/* 19 digits: the parser's (still an integer jansson holds) */
	const char *big = variant("\"source_token_start\":0}", "\"source_token_start\":1234567890123456789}");
	ck_assert_int_eq(parse_like(&l, big, &env), ENVELOPE_OK);
	assert_same_parse(big, &env);
	ck_assert_uint_eq(env.source_token_start, 1234567890123456789ull);
	ck_assert_int_eq(parse_like(&l, good_header, &env), ENVELOPE_OK);
	ck_assert_uint_eq(env.source_token_start, 0);
	/* learnt with source_token_start before the hex runs: its digits must
	 * be the learnt ones (parsed otherwise, answered the same) */
	struct envelope_layout first = { 0 };
	char early[4096], early2[4096];
	snprintf(early, sizeof(early), "{\"source_token_start\":5,%s", good_header + 1);
	char *tail = strstr(early, ",\"source_token_start\":0}");
	strcpy(tail, "}");
	ck_assert_int_eq(parse_like(&first, early, &env), ENVELOPE_OK);
	ck_assert_uint_eq(first.start_len, 0);
	snprintf(early2, sizeof(early2), "%s", early);
	early2[strlen("{\"source_token_start\":")] = '6';
	ck_assert_int_eq(parse_like(&first, early2, &env), ENVELOPE_OK);
	assert_same_parse(early2, &env);
	ck_assert_uint_eq(env.source_token_start, 6);
	/* another value of the same length elsewhere: parsed */
	ck_assert_int_eq(parse_like(&l, variant("[16,61,8]", "[16,62,8]"), &env), ENVELOPE_OK);
	ck_assert_uint_eq(env.array.shape[1], 62);
	ck_assert_int_eq(parse_like(&l, good_header, &env), ENVELOPE_OK);
	/* every refusal stays the parser's, the layout learnt beforehand */
	for (size_t i = 0; i < sizeof(rejection_cases) / sizeof(rejection_cases[0]); i++) {
		enum envelope_error got =
			parse_like(&l, variant(rejection_cases[i].from, rejection_cases[i].to), &env);
		ck_assert_msg(got == rejection_cases[i].want, "case %zu: got %s", i,
			      envelope_error_name(got));
		ck_assert_uint_eq(l.len, strlen(good_header)); /* a refusal teaches nothing */
	}
	/* not written plainly: parsed, and nothing learnt from it */
	static const struct { const char *from, *to; } plain[] = {
		{ "\"key\":\"", "\"key\": \"" },
		{ "\"payload_sha256\":\"", "\"payload_sha256\" :\"" },
		{ "vllm-artifact/35", "vllm-artifact/\\u00335" },
		{ "6580789f", "\\u0036580789f" },
	};
	for (size_t i = 0; i < sizeof(plain) / sizeof(plain[0]); i++) {
		const char *h = variant(plain[i].from, plain[i].to);
		ck_assert_int_eq(parse_like(&l, h, &env), ENVELOPE_OK);
		assert_same_parse(h, &env);
		ck_assert_msg(l.len == 0, "learnt from %s", h);
		ck_assert_int_eq(parse_like(&l, good_header, &env), ENVELOPE_OK);
	}
}
END_TEST

START_TEST(header_lengths)
{
	uint32_t h;
	const uint8_t zero[4] = { 0, 0, 0, 0 }, one[4] = { 1, 0, 0, 0 };
	const uint8_t max[4] = { 0, 0x10, 0, 0 }, over[4] = { 1, 0x10, 0, 0 }, huge[4] = { 255, 255, 255, 255 };
	ck_assert_int_eq(envelope_header_len(zero, &h), ENVELOPE_HEADER_LENGTH);
	ck_assert_int_eq(envelope_header_len(one, &h), ENVELOPE_OK);
	ck_assert_uint_eq(h, 1);
	ck_assert_int_eq(envelope_header_len(max, &h), ENVELOPE_OK);
	ck_assert_uint_eq(h, 4096);
	ck_assert_int_eq(envelope_header_len(over, &h), ENVELOPE_HEADER_LENGTH);
	ck_assert_int_eq(envelope_header_len(huge, &h), ENVELOPE_HEADER_LENGTH);

	struct envelope env;
	uint8_t buf[8] = { 10, 0, 0, 0, '{', '}' };
	ck_assert_int_eq(envelope_parse(buf, 3, &env, NULL, 0), ENVELOPE_TRUNCATED);
	ck_assert_int_eq(envelope_parse(buf, 6, &env, NULL, 0), ENVELOPE_TRUNCATED);
}
END_TEST

START_TEST(size_overflow_is_reported)
{
	struct envelope env;
	char *json = variant("[16,61,8]", "[9223372036854775807,9223372036854775807]");
	ck_assert_int_eq(envelope_parse_header((const uint8_t *)json, strlen(json), &env, NULL, 0),
			 ENVELOPE_OK);
	ck_assert_uint_eq(env.payload_len, UINT64_MAX);
	ck_assert_uint_eq(envelope_total_len(&env), UINT64_MAX);
}
END_TEST

/* Random damage to a real envelope never crashes or reads out of bounds
 * (the sanitizer build of this test checks the latter). */
START_TEST(mutations_are_handled)
{
	size_t len;
	uint8_t *orig = read_vector("req-tail.envelope", &len);
	uint8_t *buf = malloc(len);
	unsigned seed = 12345;
	unsigned ok = 0;
	for (int round = 0; round < 20000; round++) {
		memcpy(buf, orig, len);
		int flips = 1 + (int)(rand_r(&seed) % 4);
		for (int f = 0; f < flips; f++) {
			size_t at = (size_t)rand_r(&seed) % (4 + 300);
			buf[at] = (uint8_t)rand_r(&seed);
		}
		size_t cut = (size_t)rand_r(&seed) % (len + 1);
		struct envelope env;
		char detail[256];
		if (envelope_parse(buf, cut, &env, detail, sizeof(detail)) == ENVELOPE_OK)
			ok++;
	}
	ck_assert_uint_lt(ok, 20000);
	free(buf);
	free(orig);
}
END_TEST

Suite *envelope_suite(void)
{
	Suite *s = suite_create("envelope");
	TCase *tc = tcase_create("envelope");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, vectors_parse_and_reencode);
	tcase_add_test(tc, rejections);
	tcase_add_test(tc, layout_fast_path_agrees_with_the_parser);
	tcase_add_test(tc, header_lengths);
	tcase_add_test(tc, size_overflow_is_reported);
	tcase_add_test(tc, mutations_are_handled);
	suite_add_tcase(s, tc);
	return s;
}
