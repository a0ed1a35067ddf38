/* SPDX-License-Identifier: Apache-2.0 */
/* The R3 envelope (DESIGN.md §3.1): envelope_header_len, envelope_parse
 * of a whole buffer, envelope_parse_header of a bare JSON header and
 * envelope_parse_header_like (the parser's answers, layout or not). What
 * parses must re-encode with envelope_encode, and the encoding must parse
 * back to the same envelope and be canonical (encoding it again gives the
 * same bytes). */
#include "autoconf.h"

#include <errno.h>
#include <string.h>

#include "format/envelope.h"
#include "format/npy.h"
#include "fuzz.h"

static void check_parsed(const struct envelope *env)
{
	uint64_t len;

	FZ_CHECK(env->header_len >= 1 && env->header_len <= ARTFS_ENVELOPE_HEADER_MAX);
	FZ_CHECK(env->kind == ENVELOPE_BLOCK || env->kind == ENVELOPE_TAIL);
	FZ_CHECK(env->array.ndim >= 1 && env->array.ndim <= ARTFS_NDIM_MAX);
	FZ_CHECK(memchr(env->array.dtype, '\0', sizeof(env->array.dtype)) != NULL);
	struct array_desc again = env->array;
	FZ_CHECK(array_dtype_set(&again, env->array.dtype) == 0);
	FZ_CHECK(again.itemsize == env->array.itemsize);
	for (unsigned i = 0; i < env->array.ndim; i++)
		FZ_CHECK(env->array.shape[i] >= 1 && env->array.shape[i] <= (uint64_t)INT64_MAX);
	FZ_CHECK(env->source_token_start <= (uint64_t)INT64_MAX);
	FZ_CHECK(strlen(env->key) == ARTFS_KEY_LEN);
	if (array_payload_len(&env->array, &len) == 0)
		FZ_CHECK(len == env->payload_len);
	else
		FZ_CHECK(env->payload_len == UINT64_MAX);
	uint64_t total = envelope_total_len(env);
	FZ_CHECK(total == UINT64_MAX || total == 4 + (uint64_t)env->header_len + env->payload_len);
	/* What a reader of this object is served. */
	uint64_t npy;
	int rc = npy_file_size(&env->array, &npy);
	FZ_CHECK(rc == 0 || rc == -EOVERFLOW);
}

static bool same(const struct envelope *a, const struct envelope *b)
{
	return a->kind == b->kind && memcmp(a->array.dtype, b->array.dtype, 4) == 0 &&
	       a->array.itemsize == b->array.itemsize && a->array.ndim == b->array.ndim &&
	       memcmp(a->array.shape, b->array.shape, a->array.ndim * sizeof(uint64_t)) == 0 &&
	       a->source_token_start == b->source_token_start &&
	       memcmp(a->payload_sha256, b->payload_sha256, 32) == 0 &&
	       strcmp(a->key, b->key) == 0 && a->payload_len == b->payload_len;
}

/* env parsed from an input whose payload bytes (as many as there are, at
 * most what the header declares) are payload. */
static void round_trip(const struct envelope *env, const uint8_t *payload, size_t avail)
{
	uint64_t plen = env->payload_len < avail ? env->payload_len : avail;
	uint8_t *out = NULL, *out2 = NULL;
	size_t out_len, out2_len;
	struct envelope back, back2;
	char detail[256];

	/* Compact JSON of accepted fields (no escapes in them, at most 8
	 * numbers of 19 digits) always fits in ARTFS_ENVELOPE_HEADER_MAX. */
	int rc = envelope_encode(env, payload, plen, &out, &out_len);
	FZ_CHECK(rc == 0);
	FZ_CHECK(out_len == 4 + (size_t)(out[0] | out[1] << 8) + plen);
	enum envelope_error err = envelope_parse(out, out_len, &back, detail, sizeof(detail));
	FZ_CHECK(err == ENVELOPE_OK);
	FZ_CHECK(same(env, &back));
	FZ_CHECK(!plen || memcmp(out + 4 + back.header_len, payload, plen) == 0);

	/* Canonical: the encoding of the encoding is the same bytes. */
	rc = envelope_encode(&back, payload, plen, &out2, &out2_len);
	FZ_CHECK(rc == 0);
	FZ_CHECK(out2_len == out_len && memcmp(out, out2, out_len) == 0);
	err = envelope_parse_header(out2 + 4, back.header_len, &back2, detail, sizeof(detail));
	FZ_CHECK(err == ENVELOPE_OK && same(&back, &back2));
	free(out);
	free(out2);
}

/* A header that parsed, its source_token_start's digits replaced by each
 * of a few runs of digits (some JSON does not read): answered from the
 * header's own layout, each answer must be the parser's. This drives the
 * fast path's start digits whatever the layout the fuzzer left behind. */
static void other_starts(const uint8_t *json, size_t len, const struct envelope *env)
{
	static const char pattern[] = "\"source_token_start\":";
	static const char *starts[] = { "0", "7", "16", "1008", "016", "00",
					"123456789012345678", "1234567890123456789",
					"99999999999999999999" };
	const uint8_t *at = memmem(json, len, pattern, sizeof(pattern) - 1);
	char detail[256];

	if (!at)
		return;
	size_t pos = (size_t)(at - json) + sizeof(pattern) - 1, n = 0;
	while (pos + n < len && json[pos + n] >= '0' && json[pos + n] <= '9')
		n++;
	if (!n)
		return;
	for (size_t i = 0; i < sizeof(starts) / sizeof(starts[0]); i++) {
		uint8_t other[ARTFS_ENVELOPE_HEADER_MAX + 32];
		size_t d = strlen(starts[i]), olen = len - n + d;
		if (olen > ARTFS_ENVELOPE_HEADER_MAX)
			continue;
		memcpy(other, json, pos);
		memcpy(other + pos, starts[i], d);
		memcpy(other + pos + d, json + pos + n, len - pos - n);
		struct envelope_layout layout = { 0 };
		struct envelope like, parsed, first;
		FZ_CHECK(envelope_parse_header_like(&layout, json, len, &first, detail,
						    sizeof(detail)) == ENVELOPE_OK);
		FZ_CHECK(same(&first, env));
		enum envelope_error want = envelope_parse_header(other, olen, &parsed, detail,
								 sizeof(detail));
		enum envelope_error got = envelope_parse_header_like(&layout, other, olen, &like,
								     detail, sizeof(detail));
		FZ_CHECK(got == want);
		if (want == ENVELOPE_OK)
			FZ_CHECK(same(&like, &parsed) && like.header_len == parsed.header_len);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct envelope env;
	char detail[256];
	uint32_t h;

	if (size >= 4) {
		enum envelope_error err = envelope_header_len(data, &h);
		FZ_CHECK((err == ENVELOPE_OK) == (h >= 1 && h <= ARTFS_ENVELOPE_HEADER_MAX));
	}

	/* A whole envelope, as a stored object or a test vector is read. */
	detail[0] = '\0';
	enum envelope_error err = envelope_parse(data, size, &env, detail, sizeof(detail));
	FZ_CHECK((unsigned)err < ENVELOPE_ERROR_COUNT);
	FZ_CHECK(strcmp(envelope_error_name(err), "unknown") != 0);
	FZ_CHECK(err == ENVELOPE_OK || detail[0] != '\0');
	FZ_CHECK(memchr(detail, '\0', sizeof(detail)) != NULL);
	if (err == ENVELOPE_OK) {
		check_parsed(&env);
		FZ_CHECK(env.header_len == h && 4 + (size_t)h <= size);
		round_trip(&env, data + 4 + h, size - 4 - h);
	}

	/* The bytes as a bare JSON header, as the publish path hands it over
	 * once its u32 length has arrived. */
	err = envelope_parse_header(data, size, &env, detail, sizeof(detail));
	FZ_CHECK((unsigned)err < ENVELOPE_ERROR_COUNT);
	if (err == ENVELOPE_OK) {
		check_parsed(&env);
		FZ_CHECK(env.header_len == size);
		round_trip(&env, NULL, 0);
		other_starts(data, size, &env);
	}

	/* As a batch reads it: answered from the layout of the header before
	 * when it matches, and then it must say what the parser says. */
	static struct envelope_layout layout;
	struct envelope like;
	enum envelope_error like_err = envelope_parse_header_like(&layout, data, size, &like,
								  detail, sizeof(detail));
	FZ_CHECK(like_err == err);
	if (err == ENVELOPE_OK)
		FZ_CHECK(same(&like, &env) && like.header_len == env.header_len);
	return 0;
}
