/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "format/envelope.h"
#include "format/key.h"
#include "lib/reason.h"

static const char *const error_names[ENVELOPE_ERROR_COUNT] = {
	[ENVELOPE_OK] = "ok",
	[ENVELOPE_HEADER_LENGTH] = "header_length",
	[ENVELOPE_JSON] = "json",
	[ENVELOPE_FIELDS] = "fields",
	[ENVELOPE_SCHEMA] = "schema",
	[ENVELOPE_KEY] = "key",
	[ENVELOPE_KIND] = "kind",
	[ENVELOPE_FIELD] = "field",
	[ENVELOPE_DTYPE] = "dtype",
	[ENVELOPE_SHAPE] = "shape",
	[ENVELOPE_TOKEN_START] = "source_token_start",
	[ENVELOPE_CHECKSUM_FORMAT] = "checksum_format",
	[ENVELOPE_TRUNCATED] = "truncated",
	[ENVELOPE_TRAILING] = "trailing_bytes",
	[ENVELOPE_CHECKSUM] = "checksum",
	[ENVELOPE_OUT_OF_ORDER] = "out_of_order_write",
};

const char *envelope_error_name(enum envelope_error err)
{
	return (unsigned)err < ENVELOPE_ERROR_COUNT ? error_names[err] : "unknown";
}

const char *envelope_kind_name(uint8_t kind)
{
	return kind == ENVELOPE_BLOCK ? "block" : kind == ENVELOPE_TAIL ? "tail" : "?";
}

enum envelope_error envelope_header_len(const uint8_t prefix[4], uint32_t *header_len)
{
	uint32_t h = (uint32_t)prefix[0] | (uint32_t)prefix[1] << 8 |
		     (uint32_t)prefix[2] << 16 | (uint32_t)prefix[3] << 24;

	*header_len = h; /* also on failure, for the message */
	return h < 1 || h > ARTFS_ENVELOPE_HEADER_MAX ? ENVELOPE_HEADER_LENGTH : ENVELOPE_OK;
}

/* A refusal and its reason, for the log. */
#define fail(why, detail, len, ...) ((enum envelope_error)reason((why), (detail), (len), __VA_ARGS__))

static const char *const required_fields[] = {
	"schema_version", "key", "kind", "field", "dtype", "shape",
	"source_token_start", "payload_sha256",
};
#define FIELD_COUNT (sizeof(required_fields) / sizeof(required_fields[0]))

static enum envelope_error check_fields(json_t *root, char *detail, size_t dlen)
{
	const char *name;
	json_t *value;

	json_object_foreach(root, name, value) {
		size_t i;
		for (i = 0; i < FIELD_COUNT; i++)
			if (strcmp(name, required_fields[i]) == 0)
				break;
		if (i == FIELD_COUNT)
			return fail(ENVELOPE_FIELDS, detail, dlen, "unknown field \"%.64s\"", name);
	}
	for (size_t i = 0; i < FIELD_COUNT; i++)
		if (!json_object_get(root, required_fields[i]))
			return fail(ENVELOPE_FIELDS, detail, dlen, "missing field \"%s\"",
				    required_fields[i]);
	return ENVELOPE_OK;
}

static enum envelope_error parse_fields(json_t *root, struct envelope *env, char *detail,
					size_t dlen)
{
	json_t *v = json_object_get(root, "schema_version");
	if (!json_is_integer(v) || json_integer_value(v) != ARTFS_ENVELOPE_SCHEMA)
		return fail(ENVELOPE_SCHEMA, detail, dlen, "schema_version is not 3");

	v = json_object_get(root, "key");
	const char *key = json_string_value(v);
	uint8_t scratch[32];
	if (!key || json_string_length(v) != ARTFS_KEY_LEN ||
	    strncmp(key, ARTFS_KEY_PREFIX, sizeof(ARTFS_KEY_PREFIX) - 1) != 0 ||
	    key_sha256_decode(key + sizeof(ARTFS_KEY_PREFIX) - 1, scratch) < 0)
		return fail(ENVELOPE_KEY, detail, dlen, "key is not \"vllm-artifact/\" + 64 hex digits");
	memcpy(env->key, key, ARTFS_KEY_LEN + 1);

	const char *kind = json_string_value(json_object_get(root, "kind"));
	if (kind && strcmp(kind, "block") == 0)
		env->kind = ENVELOPE_BLOCK;
	else if (kind && strcmp(kind, "tail") == 0)
		env->kind = ENVELOPE_TAIL;
	else
		return fail(ENVELOPE_KIND, detail, dlen, "kind is not \"block\" or \"tail\"");

	const char *field = json_string_value(json_object_get(root, "field"));
	if (!field || strcmp(field, "routed_experts") != 0)
		return fail(ENVELOPE_FIELD, detail, dlen, "field is not \"routed_experts\"");

	v = json_object_get(root, "dtype");
	const char *dtype = json_string_value(v);
	if (!dtype || json_string_length(v) != 3 || array_dtype_set(&env->array, dtype) < 0)
		return fail(ENVELOPE_DTYPE, detail, dlen, "unsupported dtype");

	v = json_object_get(root, "shape");
	size_t ndim = json_array_size(v);
	if (!json_is_array(v) || ndim < 1 || ndim > ARTFS_NDIM_MAX)
		return fail(ENVELOPE_SHAPE, detail, dlen, "shape is not a list of 1 to 8 integers");
	env->array.ndim = (uint8_t)ndim;
	for (size_t i = 0; i < ndim; i++) {
		json_t *d = json_array_get(v, i);
		if (!json_is_integer(d) || json_integer_value(d) <= 0)
			return fail(ENVELOPE_SHAPE, detail, dlen, "shape[%zu] is not a positive integer", i);
		env->array.shape[i] = (uint64_t)json_integer_value(d);
	}
	if (array_payload_len(&env->array, &env->payload_len) < 0)
		env->payload_len = UINT64_MAX;

	v = json_object_get(root, "source_token_start");
	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return fail(ENVELOPE_TOKEN_START, detail, dlen, "source_token_start is not an integer >= 0");
	env->source_token_start = (uint64_t)json_integer_value(v);

	v = json_object_get(root, "payload_sha256");
	const char *sha = json_string_value(v);
	if (!sha || json_string_length(v) != 64 || key_sha256_decode(sha, env->payload_sha256) < 0)
		return fail(ENVELOPE_CHECKSUM_FORMAT, detail, dlen,
			    "payload_sha256 is not 64 lowercase hex digits");
	return ENVELOPE_OK;
}

enum envelope_error envelope_parse_header(const uint8_t *json, size_t len, struct envelope *env,
					  char *detail, size_t dlen)
{
	json_error_t jerr;
	enum envelope_error err;

	if (len < 1 || len > ARTFS_ENVELOPE_HEADER_MAX)
		return fail(ENVELOPE_HEADER_LENGTH, detail, dlen, "header length %zu", len);
	memset(env, 0, sizeof(*env));
	env->header_len = (uint32_t)len;
	/* jansson checks UTF-8, rejects NUL in strings and, with this flag,
	 * duplicate keys; trailing non-space bytes are an error. */
	json_t *root = json_loadb((const char *)json, len, JSON_REJECT_DUPLICATES, &jerr);
	if (!root)
		return fail(ENVELOPE_JSON, detail, dlen, "JSON: %s", jerr.text);
	if (!json_is_object(root)) {
		json_decref(root);
		return fail(ENVELOPE_JSON, detail, dlen, "JSON header is not an object");
	}
	err = check_fields(root, detail, dlen);
	if (err == ENVELOPE_OK)
		err = parse_fields(root, env, detail, dlen);
	json_decref(root);
	return err;
}

/* 64 lowercase hex digits. */
static bool hex64(const uint8_t *p)
{
	return key_is_hex(p, 64);
}

/* Where the value of a string field named by pattern (its name, quoted,
 * a colon and the value's opening quote, and what the value must begin
 * with) has 64 hex digits and its closing quote; 0 if not written so. */
static size_t hex_value_at(const uint8_t *json, size_t len, const char *pattern)
{
	size_t n = strlen(pattern);
	const uint8_t *at = memmem(json, len, pattern, n);
	size_t pos = at ? (size_t)(at - json) + n : 0;

	return at && pos + 64 < len && hex64(json + pos) && json[pos + 64] == '"' ? pos : 0;
}

size_t envelope_sha_hex_at(const uint8_t *json, size_t len)
{
	return hex_value_at(json, len, "\"payload_sha256\":\"");
}

/* Where the digits of source_token_start's value begin, and how many
 * there are (*digits), when it is written plainly as a run of digits;
 * 0 otherwise. */
static size_t start_value_at(const uint8_t *json, size_t len, size_t *digits)
{
	static const char pattern[] = "\"source_token_start\":";
	const uint8_t *at = memmem(json, len, pattern, sizeof(pattern) - 1);
	size_t pos = at ? (size_t)(at - json) + sizeof(pattern) - 1 : 0, n = 0;

	while (at && pos + n < len && json[pos + n] >= '0' && json[pos + n] <= '9')
		n++;
	*digits = n;
	return n ? pos : 0;
}

/* Why a match needs no parse: in JSON a quote inside a string is escaped,
 * so `"key":"` (a quote right after `y`) can only be a member named key
 * and the opening quote of its value; a header that parsed has no nested
 * objects, no duplicate member and no member but the known ones (whose
 * string values hold no quote), so that is the key field, and likewise
 * `"source_token_start":` is that member. Hex digits in place of hex
 * digits, inside a string with no escape, leave every token where it was:
 * the same JSON with those two strings changed, and both still 64
 * lowercase hex digits. A JSON integer (digits, no leading zero) in place
 * of the integer that was source_token_start's whole value, the same
 * bytes on either side of it, is the same JSON with that value changed.
 * Its digits are looked at only after both hex runs, so that these stay
 * where they were. */
static void layout_learn(struct envelope_layout *l, const uint8_t *json, size_t len,
			 const struct envelope *env)
{
	size_t key_at = hex_value_at(json, len, "\"key\":\"" ARTFS_KEY_PREFIX);
	size_t sha_at = envelope_sha_hex_at(json, len);
	size_t digits, start_at = start_value_at(json, len, &digits);

	l->len = 0;
	if (!key_at || !sha_at)
		return;
	memcpy(l->json, json, len);
	l->key_at = key_at;
	l->sha_at = sha_at;
	bool after = start_at > key_at + 64 && start_at > sha_at + 64;
	l->start_at = after ? start_at : 0;
	l->start_len = after ? digits : 0;
	l->env = *env;
	l->len = len;
}

/* Digits that JSON reads as an integer that jansson holds (no leading
 * zero; at most 18 digits, below 2^63): 0 when not, else 1 and *value. */
#define START_DIGITS_MAX 18
static bool start_digits(const uint8_t *p, size_t n, uint64_t *value)
{
	uint64_t v = 0;

	if (n == 0 || n > START_DIGITS_MAX || (n > 1 && p[0] == '0'))
		return false;
	for (size_t i = 0; i < n; i++) {
		if (p[i] < '0' || p[i] > '9')
			return false;
		v = v * 10 + (uint64_t)(p[i] - '0');
	}
	*value = v;
	return true;
}

/* Whether json is l's layout; *start: its source_token_start. */
static bool layout_match(const struct envelope_layout *l, const uint8_t *json, size_t len,
			 uint64_t *start)
{
	size_t a = l->key_at < l->sha_at ? l->key_at : l->sha_at;
	size_t b = l->key_at < l->sha_at ? l->sha_at : l->key_at;
	/* bytes after the second hex run that must equal the learnt ones:
	 * up to source_token_start's digits when they may differ, else all */
	size_t mid_end = l->start_len ? l->start_at : l->len;

	*start = l->env.source_token_start;
	if (l->start_len) {
		size_t tail = l->len - l->start_at - l->start_len; /* the bytes after the digits */
		if (len < l->start_at + tail || len - l->start_at - tail > START_DIGITS_MAX ||
		    memcmp(json + len - tail, l->json + l->len - tail, tail) != 0 ||
		    !start_digits(json + l->start_at, len - l->start_at - tail, start))
			return false;
	} else if (len != l->len)
		return false;
	return memcmp(json, l->json, a) == 0 && hex64(json + a) &&
	       memcmp(json + a + 64, l->json + a + 64, b - a - 64) == 0 && hex64(json + b) &&
	       memcmp(json + b + 64, l->json + b + 64, mid_end - b - 64) == 0;
}

enum envelope_error envelope_parse_header_like(struct envelope_layout *l, const uint8_t *json,
					       size_t len, struct envelope *env, char *detail,
					       size_t dlen)
{
	uint64_t start;

	if (l->len && layout_match(l, json, len, &start)) {
		*env = l->env;
		env->header_len = (uint32_t)len;
		env->source_token_start = start;
		memcpy(env->key + sizeof(ARTFS_KEY_PREFIX) - 1, json + l->key_at, 64);
		char sha[65];
		memcpy(sha, json + l->sha_at, 64);
		sha[64] = '\0';
		key_sha256_decode(sha, env->payload_sha256); /* hex64: it decodes */
		return ENVELOPE_OK;
	}
	enum envelope_error err = envelope_parse_header(json, len, env, detail, dlen);
	if (err == ENVELOPE_OK)
		layout_learn(l, json, len, env);
	return err;
}

enum envelope_error envelope_parse(const uint8_t *buf, size_t len, struct envelope *env,
				   char *detail, size_t dlen)
{
	uint32_t h;
	enum envelope_error err;

	if (len < ENVELOPE_PREFIX_LEN)
		return fail(ENVELOPE_TRUNCATED, detail, dlen, "%zu bytes, no header length", len);
	err = envelope_header_len(buf, &h);
	if (err)
		return fail(err, detail, dlen, "header length %u outside 1..%u", h, ARTFS_ENVELOPE_HEADER_MAX);
	if (len - ENVELOPE_PREFIX_LEN < h)
		return fail(ENVELOPE_TRUNCATED, detail, dlen, "header of %u bytes cut short", h);
	return envelope_parse_header(buf + ENVELOPE_PREFIX_LEN, h, env, detail, dlen);
}

uint64_t envelope_total_len(const struct envelope *env)
{
	uint64_t head = ENVELOPE_PREFIX_LEN + (uint64_t)env->header_len;

	if (env->payload_len > UINT64_MAX - head)
		return UINT64_MAX;
	return head + env->payload_len;
}

int envelope_encode(const struct envelope *env, const void *payload, uint64_t payload_len,
		    uint8_t **out, size_t *out_len)
{
	char sha[65];
	json_t *shape = json_array();
	int rc = -ENOMEM;

	key_hex(env->payload_sha256, 32, sha);
	for (unsigned i = 0; shape && i < env->array.ndim; i++)
		json_array_append_new(shape, json_integer((json_int_t)env->array.shape[i]));
	json_t *root = json_pack("{s:i, s:s, s:s, s:s, s:s, s:o, s:I, s:s}",
				 "schema_version", ARTFS_ENVELOPE_SCHEMA,
				 "key", env->key,
				 "kind", envelope_kind_name(env->kind),
				 "field", "routed_experts",
				 "dtype", env->array.dtype,
				 "shape", shape,
				 "source_token_start", (json_int_t)env->source_token_start,
				 "payload_sha256", sha);
	if (!root)
		return -ENOMEM;
	char *text = json_dumps(root, JSON_SORT_KEYS | JSON_COMPACT);
	json_decref(root);
	if (!text)
		return -ENOMEM;
	size_t h = strlen(text);
	if (h > ARTFS_ENVELOPE_HEADER_MAX) {
		rc = -EMSGSIZE;
		goto out;
	}
	*out_len = ENVELOPE_PREFIX_LEN + h + payload_len;
	*out = malloc(*out_len);
	if (!*out)
		goto out;
	(*out)[0] = (uint8_t)h;
	(*out)[1] = (uint8_t)(h >> 8);
	(*out)[2] = (*out)[3] = 0;
	memcpy(*out + ENVELOPE_PREFIX_LEN, text, h);
	if (payload_len)
		memcpy(*out + ENVELOPE_PREFIX_LEN + h, payload, payload_len);
	rc = 0;
out:
	free(text);
	return rc;
}

bool envelope_same(const struct envelope *a, const struct envelope *b)
{
	return strcmp(a->key, b->key) == 0 && a->kind == b->kind &&
	       a->source_token_start == b->source_token_start &&
	       memcmp(a->array.dtype, b->array.dtype, sizeof(a->array.dtype)) == 0 &&
	       a->array.ndim == b->array.ndim &&
	       memcmp(a->array.shape, b->array.shape, a->array.ndim * sizeof(uint64_t)) == 0 &&
	       memcmp(a->payload_sha256, b->payload_sha256, 32) == 0;
}
