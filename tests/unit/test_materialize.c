/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/array.h"
#include "format/envelope.h"
#include "format/key.h"
#include "r3/materialize.h"
#include "suites.h"

/* The pure parts of <wv>/.materialize (DESIGN.md §3.4): the request text
 * (materialize_parse) and the layout rules (materialize_check). */

#define H0 "3da2892d37823d9298e1d5011d7dcfaaf2d9d9a6d465e99be33af5be1d87c12b"
#define H1 "9a59c5f8229aab55e9f855173ef94485aab8497eea0588f365c871d6d0561722"
#define H2 "6d0b07ee773591f2a1b492d3ca65afdefc90e1cadfcc542a74048bb0ae7daa27"

/* ---- parse ------------------------------------------------------------------ */

/* Parses a copy of exactly len bytes (in a buffer of its own, so that the
 * sanitizer build sees any read past len). */
static int parse_n(const char *text, size_t len, struct materialize_request *req, char *err,
		   size_t errlen)
{
	char *copy = malloc(len ? len : 1);
	ck_assert(copy);
	memcpy(copy, text, len);
	int rc = materialize_parse(copy, len, req, err, errlen);
	free(copy);
	return rc;
}

static int parse(const char *text, struct materialize_request *req, char *err, size_t errlen)
{
	return parse_n(text, strlen(text), req, err, errlen);
}

static void assert_hash(const struct materialize_block *b, const char *hex)
{
	char got[ARTFS_HASH_HEX_MAX + 1];
	key_hex(b->hash, b->len, got);
	ck_assert_uint_eq(b->len, strlen(hex) / 2);
	ck_assert_str_eq(got, hex);
}

START_TEST(parse_hashes_only)
{
	struct materialize_request req;
	char err[256];

	ck_assert_int_eq(parse(H0 "\n" H1 "\n" H2 "\n", &req, err, sizeof(err)), 0);
	ck_assert(!req.has_token_end);
	ck_assert(!req.has_block_size);
	ck_assert_uint_eq(req.count, 3);
	assert_hash(&req.blocks[0], H0);
	assert_hash(&req.blocks[1], H1);
	assert_hash(&req.blocks[2], H2);
	materialize_request_free(&req);
	ck_assert_ptr_null(req.blocks);
	ck_assert_uint_eq(req.count, 0);
}
END_TEST

START_TEST(parse_keywords)
{
	struct materialize_request req;
	char err[256];

	ck_assert_int_eq(parse("token_end 40\nblock_size 16\n" H0 "\n" H1 "\n" H2 "\n", &req, err,
			       sizeof(err)), 0);
	ck_assert(req.has_token_end);
	ck_assert(req.has_block_size);
	ck_assert_uint_eq(req.token_end, 40);
	ck_assert_uint_eq(req.block_size, 16);
	ck_assert_uint_eq(req.count, 3);
	assert_hash(&req.blocks[2], H2);
	materialize_request_free(&req);

	/* Either keyword alone, in either order. */
	ck_assert_int_eq(parse("block_size 8\n" H0 "\n", &req, err, sizeof(err)), 0);
	ck_assert(!req.has_token_end);
	ck_assert(req.has_block_size);
	ck_assert_uint_eq(req.block_size, 8);
	materialize_request_free(&req);
	ck_assert_int_eq(parse("block_size 8\ntoken_end 9\n" H0 "\n", &req, err, sizeof(err)), 0);
	ck_assert_uint_eq(req.token_end, 9);
	ck_assert_uint_eq(req.block_size, 8);
	materialize_request_free(&req);

	/* Leading zeros, the largest value, tabs and runs of spaces. */
	ck_assert_int_eq(parse("token_end 0007\nblock_size\t\t 18446744073709551615\naa\n", &req,
			       err, sizeof(err)), 0);
	ck_assert_uint_eq(req.token_end, 7);
	ck_assert_uint_eq(req.block_size, UINT64_MAX);
	materialize_request_free(&req);
}
END_TEST

START_TEST(parse_whitespace_and_blank_lines)
{
	struct materialize_request req;
	char err[256];

	ck_assert_int_eq(parse("\n\n   \n\t token_end   40 \r\n\n  " H0 "  \r\n\t" H1 "\t\n\n\n" H2,
			       &req, err, sizeof(err)), 0);
	ck_assert(req.has_token_end);
	ck_assert_uint_eq(req.token_end, 40);
	ck_assert_uint_eq(req.count, 3);
	assert_hash(&req.blocks[0], H0);
	assert_hash(&req.blocks[1], H1);
	assert_hash(&req.blocks[2], H2);
	materialize_request_free(&req);

	/* A line of spaces longer than any line that holds something. */
	char text[2048];
	memset(text, ' ', 600);
	snprintf(text + 600, sizeof(text) - 600, "\n%s\n%600s", "ab", "");
	ck_assert_int_eq(parse(text, &req, err, sizeof(err)), 0);
	ck_assert_uint_eq(req.count, 1);
	assert_hash(&req.blocks[0], "ab");
	materialize_request_free(&req);
}
END_TEST

START_TEST(parse_hash_lengths)
{
	struct materialize_request req;
	char err[256], text[512];

	/* 2 to 128 digits, even: what a block hash file name may be. */
	char longest[ARTFS_HASH_HEX_MAX + 1];
	for (int i = 0; i < ARTFS_HASH_HEX_MAX; i++)
		longest[i] = "0123456789abcdef"[i % 16];
	longest[ARTFS_HASH_HEX_MAX] = '\0';
	snprintf(text, sizeof(text), "00\nff\n0123456789abcdef\n%s\n", longest);
	ck_assert_int_eq(parse(text, &req, err, sizeof(err)), 0);
	ck_assert_uint_eq(req.count, 4);
	assert_hash(&req.blocks[0], "00");
	assert_hash(&req.blocks[1], "ff");
	assert_hash(&req.blocks[2], "0123456789abcdef");
	assert_hash(&req.blocks[3], longest);
	ck_assert_uint_eq(req.blocks[3].hash[0], 0x01);
	ck_assert_uint_eq(req.blocks[3].hash[63], 0xef);
	materialize_request_free(&req);
}
END_TEST

START_TEST(parse_reads_only_len_bytes)
{
	struct materialize_request req;
	char err[256];
	const char *text = H0 "\n" H1 "\nnot a hash at all";

	/* Only the first line is inside len: the rest is never looked at. */
	ck_assert_int_eq(parse_n(text, 65, &req, err, sizeof(err)), 0);
	ck_assert_uint_eq(req.count, 1);
	assert_hash(&req.blocks[0], H0);
	materialize_request_free(&req);

	/* Cut inside the second hash: that line is a short (odd) hash. */
	ck_assert_int_eq(parse_n(text, 65 + 11, &req, err, sizeof(err)), -EINVAL);
	ck_assert_int_eq(parse_n(text, 65 + 10, &req, err, sizeof(err)), 0);
	ck_assert_uint_eq(req.count, 2);
	assert_hash(&req.blocks[1], "9a59c5f822");
	materialize_request_free(&req);

	/* No text at all. */
	ck_assert_int_eq(parse_n(text, 0, &req, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_null(req.blocks);
}
END_TEST

START_TEST(parse_many_hashes)
{
	/* More than the first allocation: the array grows and keeps order. */
	size_t n = 1000;
	char *text = malloc(n * 9 + 1), *p = text;
	for (size_t i = 0; i < n; i++)
		p += sprintf(p, "%08zx\n", i * 2654435761u % 0xffffffffu);
	struct materialize_request req;
	char err[256];
	ck_assert_int_eq(parse(text, &req, err, sizeof(err)), 0);
	ck_assert_uint_eq(req.count, n);
	for (size_t i = 0; i < n; i++) {
		char want[9];
		snprintf(want, sizeof(want), "%08zx", i * 2654435761u % 0xffffffffu);
		assert_hash(&req.blocks[i], want);
	}
	materialize_request_free(&req);
	free(text);
}
END_TEST

START_TEST(parse_object_count_limit)
{
	/* MATERIALIZE_BLOCKS_MAX hashes parse; one more is refused. */
	size_t n = MATERIALIZE_BLOCKS_MAX + 1;
	char *text = malloc(n * 3);
	for (size_t i = 0; i < n; i++)
		memcpy(text + 3 * i, "ab\n", 3);
	struct materialize_request req;
	char err[256];
	ck_assert_int_eq(parse_n(text, (n - 1) * 3, &req, err, sizeof(err)), 0);
	ck_assert_uint_eq(req.count, MATERIALIZE_BLOCKS_MAX);
	assert_hash(&req.blocks[MATERIALIZE_BLOCKS_MAX - 1], "ab");
	materialize_request_free(&req);
	err[0] = '\0';
	ck_assert_int_eq(parse_n(text, n * 3, &req, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "more than") != NULL, "%s", err);
	ck_assert_ptr_null(req.blocks);
	ck_assert_uint_eq(req.count, 0);
	free(text);
}
END_TEST

struct rejection {
	const char *name;
	const char *text;
	size_t len;           /* 0: strlen(text) */
	const char *reason;   /* a substring of err */
};

START_TEST(parse_rejections)
{
	static char too_long[400], hash_130[200], hash_long_line[300];
	snprintf(too_long, sizeof(too_long), "token_end %0250d1\n" H0 "\n", 0);
	memset(hash_130, 'a', 130);
	hash_130[130] = '\n';
	/* 190 hex digits: longer than any hash, within the line buffer or not. */
	memset(hash_long_line, 'b', 200);
	hash_long_line[200] = '\0';

	static const char nul_line[] = H0 "\n\0\n";
	static const char nul_in_hash[] = "3da2892d37\0" "823d9298e1\n";
	static const char nul_in_keyword[] = "token_end 4\0" "0\n" H0 "\n";
	const struct rejection cases[] = {
		{ "unknown keyword", "token_start 16\n" H0 "\n", 0, "line 1: unknown keyword" },
		{ "keyword in capitals", "TOKEN_END 16\n" H0 "\n", 0, "unknown keyword" },
		{ "unknown keyword later", H0 "\n\nsize 3\n", 0, "line 3: unknown keyword \"size\"" },
		{ "keyword without value", "token_end\n" H0 "\n", 0, "is not a block hash" },
		{ "keyword with only spaces", "token_end    \n" H0 "\n", 0, "is not a block hash" },
		{ "token_end twice", "token_end 16\ntoken_end 16\n" H0 "\n", 0,
		  "line 2: token_end needs one positive integer" },
		{ "block_size twice", "block_size 16\n" H0 "\nblock_size 8\n", 0,
		  "line 3: block_size needs one positive integer" },
		{ "token_end zero", "token_end 0\n" H0 "\n", 0, "token_end needs one positive integer" },
		{ "token_end 000", "token_end 000\n" H0 "\n", 0, "token_end needs" },
		{ "block_size zero", "block_size 0\n" H0 "\n", 0, "block_size needs one positive integer" },
		{ "token_end negative", "token_end -16\n" H0 "\n", 0, "token_end needs" },
		{ "block_size negative", "block_size -1\n" H0 "\n", 0, "block_size needs" },
		{ "token_end plus sign", "token_end +16\n" H0 "\n", 0, "token_end needs" },
		{ "token_end word", "token_end sixteen\n" H0 "\n", 0, "token_end needs" },
		{ "token_end hex", "token_end 0x10\n" H0 "\n", 0, "token_end needs" },
		{ "token_end float", "token_end 16.0\n" H0 "\n", 0, "token_end needs" },
		{ "token_end exponent", "token_end 1e3\n" H0 "\n", 0, "token_end needs" },
		{ "token_end two values", "token_end 16 17\n" H0 "\n", 0, "token_end needs" },
		{ "token_end trailing letter", "token_end 16x\n" H0 "\n", 0, "token_end needs" },
		{ "token_end 2^64", "token_end 18446744073709551616\n" H0 "\n", 0, "token_end needs" },
		{ "block_size huge", "block_size 99999999999999999999999\n" H0 "\n", 0,
		  "block_size needs" },
		{ "block_size word", "block_size x\n" H0 "\n", 0, "block_size needs" },
		{ "uppercase hash", "3DA2892D37823D92\n", 0, "line 1: \"3DA2892D37823D92\" is not a block hash" },
		{ "mixed case hash", H0 "\n3da2892d37823D92\n", 0, "line 2:" },
		{ "odd-length hash", "3da2892d378\n", 0, "is not a block hash" },
		{ "one digit", "a\n", 0, "is not a block hash" },
		{ "non-hex digit", "3da2892d37823d9g\n", 0, "is not a block hash" },
		{ "0x prefix", "0x3da2892d37823d92\n", 0, "is not a block hash" },
		{ "130 digits", hash_130, 131, "is not a block hash" },
		{ "200 digits", hash_long_line, 0, "line 1: too long" },
		{ "two hashes on a line", H0 " " H1 "\n", 0, "unknown keyword" },
		{ "too long keyword line", too_long, 0, "line 1: too long" },
		{ "no hashes: empty", "", 0, "no object hashes" },
		{ "no hashes: blank lines", "\n\n \t\r\n   ", 0, "no object hashes" },
		{ "no hashes: keywords only", "token_end 40\nblock_size 16\n", 0, "no object hashes" },
		{ "NUL line", nul_line, sizeof(nul_line) - 1, "line 2: NUL byte" },
		{ "NUL in a hash", nul_in_hash, sizeof(nul_in_hash) - 1, "line 1: NUL byte" },
		{ "NUL in a keyword value", nul_in_keyword, sizeof(nul_in_keyword) - 1, "NUL byte" },
		{ "a bad line after good ones", H0 "\n" H1 "\nzz\n", 0, "line 3:" },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct materialize_request req;
		char err[256] = "";
		size_t len = cases[i].len ? cases[i].len : strlen(cases[i].text);
		int rc = parse_n(cases[i].text, len, &req, err, sizeof(err));
		ck_assert_msg(rc == -EINVAL, "%s: got %d", cases[i].name, rc);
		ck_assert_msg(strstr(err, cases[i].reason) != NULL, "%s: err \"%s\", want \"%s\"",
			      cases[i].name, err, cases[i].reason);
		/* Nothing is left to free. */
		ck_assert_msg(req.blocks == NULL && req.count == 0, "%s", cases[i].name);
	}
}
END_TEST

START_TEST(parse_line_length_boundary)
{
	/* A keyword line right below the line buffer parses; one longer is
	 * refused as too long (the buffer is ARTFS_HASH_HEX_MAX + 64 bytes). */
	const size_t buf = ARTFS_HASH_HEX_MAX + 64;
	char text[512];
	struct materialize_request req;
	char err[256];

	size_t zeros = buf - 1 - strlen("token_end ") - 1; /* line of buf - 1 chars */
	int n = snprintf(text, sizeof(text), "token_end %0*d5\naa\n", (int)zeros, 0);
	ck_assert_int_eq(n, (int)(buf - 1 + 4));
	ck_assert_int_eq(parse(text, &req, err, sizeof(err)), 0);
	ck_assert_uint_eq(req.token_end, 5);
	materialize_request_free(&req);

	snprintf(text, sizeof(text), "token_end %0*d5\naa\n", (int)zeros + 1, 0);
	ck_assert_int_eq(parse(text, &req, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "too long") != NULL, "%s", err);

	/* Surrounding spaces do not count. */
	snprintf(text, sizeof(text), "%100s%s%100s\n", "", H0, "");
	ck_assert_int_eq(parse(text, &req, err, sizeof(err)), 0);
	assert_hash(&req.blocks[0], H0);
	materialize_request_free(&req);
}
END_TEST

/* ---- check ------------------------------------------------------------------ */

/* An object's envelope as read from the store, built by hand. */
static struct envelope env(const char *kind, const char *dtype, uint64_t start, int ndim, ...)
{
	struct envelope e;
	va_list ap;

	memset(&e, 0, sizeof(e));
	e.kind = strcmp(kind, "block") == 0 ? ENVELOPE_BLOCK : ENVELOPE_TAIL;
	ck_assert_int_eq(array_dtype_set(&e.array, dtype), 0);
	e.array.ndim = (uint8_t)ndim;
	va_start(ap, ndim);
	for (int d = 0; d < ndim; d++)
		e.array.shape[d] = va_arg(ap, uint64_t);
	va_end(ap);
	e.source_token_start = start;
	if (array_payload_len(&e.array, &e.payload_len) < 0)
		e.payload_len = UINT64_MAX;
	return e;
}

#define R3(kind, rows, start) env(kind, "|u1", start, 3, (uint64_t)(rows), (uint64_t)48, (uint64_t)8)

static struct materialize_request request(size_t count, uint64_t token_end, uint64_t block_size)
{
	struct materialize_request r;
	memset(&r, 0, sizeof(r));
	r.count = count;
	r.has_token_end = token_end != 0;
	r.token_end = token_end;
	r.has_block_size = block_size != 0;
	r.block_size = block_size;
	return r; /* check never looks at the hashes */
}

/* Runs the check; returns its rc and leaves the reason in err. */
static int check(const struct envelope *envs, size_t n, uint64_t token_end, uint64_t block_size,
		 uint64_t *got, char *err)
{
	struct materialize_request r = request(n, token_end, block_size);
	err[0] = '\0';
	*got = 0xdeadbeef;
	return materialize_check(&r, envs, got, err, 256);
}

#define ASSERT_OK(envs, n, te, bs, want)                                                     \
	do {                                                                                 \
		uint64_t got_;                                                               \
		char err_[256];                                                              \
		int rc_ = check(envs, n, te, bs, &got_, err_);                               \
		ck_assert_msg(rc_ == 0, "rc %d: %s", rc_, err_);                             \
		ck_assert_uint_eq(got_, want);                                               \
	} while (0)

#define ASSERT_BAD(envs, n, te, bs, reason)                                                  \
	do {                                                                                 \
		uint64_t got_;                                                               \
		char err_[256];                                                              \
		int rc_ = check(envs, n, te, bs, &got_, err_);                               \
		ck_assert_msg(rc_ == -EBADMSG, "rc %d, want EBADMSG (%s)", rc_, reason);     \
		ck_assert_msg(strstr(err_, reason) != NULL, "err \"%s\", want \"%s\"", err_, \
			      reason);                                                       \
	} while (0)

START_TEST(check_valid_layouts)
{
	/* The vLLM request of the vectors: 16 + 16 + 8. */
	struct envelope e[] = { R3("block", 16, 0), R3("block", 16, 16), R3("tail", 8, 32) };
	ASSERT_OK(e, 3, 40, 16, 40);
	ASSERT_OK(e, 3, 40, 0, 40);
	ASSERT_OK(e, 3, 0, 16, 40);
	ASSERT_OK(e, 3, 0, 0, 40);
	/* Its first two objects alone: a request of full blocks. */
	ASSERT_OK(e, 2, 32, 16, 32);
	ASSERT_OK(e, 2, 0, 0, 32);
	ASSERT_OK(e, 1, 0, 0, 16);
	ASSERT_OK(e, 1, 16, 16, 16);

	/* A one-row tail. */
	struct envelope f[] = { R3("block", 16, 0), R3("tail", 1, 16) };
	ASSERT_OK(f, 2, 17, 0, 17);

	/* Other dtypes and ranks. */
	struct envelope g[] = {
		env("block", "<u2", 0, 3, (uint64_t)4, (uint64_t)61, (uint64_t)8),
		env("block", "<u2", 4, 3, (uint64_t)4, (uint64_t)61, (uint64_t)8),
		env("tail", "<u2", 8, 3, (uint64_t)3, (uint64_t)61, (uint64_t)8),
	};
	ASSERT_OK(g, 3, 11, 4, 11);
	struct envelope h[] = {
		env("block", "<i4", 0, 1, (uint64_t)8),
		env("tail", "<i4", 8, 1, (uint64_t)2),
	};
	ASSERT_OK(h, 2, 0, 0, 10);
	struct envelope k[] = {
		env("block", ">f8", 0, 8, (uint64_t)2, (uint64_t)1, (uint64_t)2, (uint64_t)1,
		    (uint64_t)2, (uint64_t)1, (uint64_t)2, (uint64_t)3),
		env("tail", ">f8", 2, 8, (uint64_t)1, (uint64_t)1, (uint64_t)2, (uint64_t)1,
		    (uint64_t)2, (uint64_t)1, (uint64_t)2, (uint64_t)3),
	};
	ASSERT_OK(k, 2, 3, 0, 3);
}
END_TEST

START_TEST(check_many_blocks)
{
	size_t n = 501;
	struct envelope *e = calloc(n, sizeof(*e));
	for (size_t i = 0; i + 1 < n; i++)
		e[i] = R3("block", 16, 16 * i);
	e[n - 1] = R3("tail", 5, 16 * (n - 1));
	ASSERT_OK(e, n, 8005, 16, 8005);
	ASSERT_OK(e, n, 0, 0, 8005);
	/* One object in the middle one row short. */
	e[250] = R3("block", 15, 4000);
	ASSERT_BAD(e, n, 8005, 16, "object 250 has 15 rows, expected 16");
	free(e);
}
END_TEST

START_TEST(check_token_end_default)
{
	/* Without token_end it is the sum of the rows: a last object that is
	 * full or short is then right, and a short object before it is not. */
	struct envelope e[] = { R3("block", 16, 0), R3("block", 16, 16), R3("tail", 3, 32) };
	ASSERT_OK(e, 3, 0, 0, 35);
	ASSERT_OK(e, 3, 0, 16, 35);
	struct envelope f[] = { R3("block", 16, 0), R3("tail", 3, 16), R3("tail", 3, 19) };
	ASSERT_BAD(f, 3, 0, 0, "object 1 has 3 rows, expected 6 (block_size 16, token_end 22)");
}
END_TEST

START_TEST(check_block_size_explicit)
{
	/* A request shorter than one block: its only object is a tail. */
	struct envelope e[] = { R3("tail", 5, 0) };
	ASSERT_OK(e, 1, 5, 16, 5);
	ASSERT_OK(e, 1, 0, 16, 5);
	/* By default block_size is the first object's rows: 5, a full block. */
	ASSERT_BAD(e, 1, 5, 0, "object 0 is a tail, expected a block");

	struct envelope f[] = { R3("block", 16, 0), R3("block", 16, 16), R3("tail", 8, 32) };
	/* block_size the objects do not follow. */
	ASSERT_BAD(f, 3, 40, 8, "object 0 has 16 rows, expected 8 (block_size 8, token_end 40)");
	ASSERT_BAD(f, 3, 40, 32, "object 0 has 16 rows, expected 32 (block_size 32, token_end 40)");
	/* A block_size larger than token_end: the first object is the tail. */
	ASSERT_BAD(f, 3, 40, 64, "object 0 has 16 rows, expected 40");

	/* Objects of 8 rows with block_size 8 given: the tail of 8 rows is full. */
	struct envelope g[] = { R3("block", 8, 0), R3("block", 8, 8) };
	ASSERT_OK(g, 2, 16, 8, 16);
	struct envelope h[] = { R3("block", 8, 0), R3("tail", 8, 8) };
	ASSERT_BAD(h, 2, 16, 8, "object 1 is a tail, expected a block");
}
END_TEST

START_TEST(check_source_token_start)
{
	struct envelope gap[] = { R3("block", 16, 0), R3("block", 16, 20), R3("tail", 8, 36) };
	ASSERT_BAD(gap, 3, 40, 16, "object 1 starts at token 20, expected 16");
	ASSERT_BAD(gap, 3, 0, 0, "object 1 starts at token 20, expected 16");

	struct envelope overlap[] = { R3("block", 16, 0), R3("block", 16, 8), R3("tail", 8, 24) };
	ASSERT_BAD(overlap, 3, 0, 0, "object 1 starts at token 8, expected 16");

	struct envelope late[] = { R3("block", 16, 16), R3("tail", 8, 32) };
	ASSERT_BAD(late, 2, 0, 0, "object 0 starts at token 16, expected 0");

	struct envelope tail_off[] = { R3("block", 16, 0), R3("block", 16, 16), R3("tail", 8, 33) };
	ASSERT_BAD(tail_off, 3, 40, 16, "object 2 starts at token 33, expected 32");

	struct envelope huge[] = { R3("block", 16, 0), R3("tail", 8, UINT64_MAX) };
	ASSERT_BAD(huge, 2, 0, 0, "object 1 starts at token 18446744073709551615, expected 16");
}
END_TEST

START_TEST(check_row_counts)
{
	/* A middle block with the wrong rows, however it is labelled. */
	struct envelope a[] = { R3("block", 16, 0), R3("block", 12, 16), R3("block", 16, 28),
				R3("tail", 8, 44) };
	ASSERT_BAD(a, 4, 52, 16, "object 1 has 12 rows, expected 16 (block_size 16, token_end 52)");
	a[1] = R3("tail", 12, 16);
	ASSERT_BAD(a, 4, 52, 16, "object 1 has 12 rows, expected 16");
	ASSERT_BAD(a, 4, 0, 0, "object 1 has 12 rows, expected 16");
	/* A middle block longer than the first. */
	struct envelope b[] = { R3("block", 16, 0), R3("block", 20, 16), R3("tail", 4, 36) };
	ASSERT_BAD(b, 3, 40, 0, "object 1 has 20 rows, expected 16");
	/* The tail with more rows than what is left of token_end. */
	struct envelope c[] = { R3("block", 16, 0), R3("tail", 9, 16) };
	ASSERT_BAD(c, 2, 24, 16, "object 1 has 9 rows, expected 8");
}
END_TEST

START_TEST(check_kinds)
{
	/* A full block labelled tail, in the middle and at the end. */
	struct envelope a[] = { R3("block", 16, 0), R3("tail", 16, 16), R3("tail", 8, 32) };
	ASSERT_BAD(a, 3, 40, 16, "object 1 is a tail, expected a block");
	ASSERT_BAD(a, 3, 0, 0, "object 1 is a tail, expected a block");
	struct envelope b[] = { R3("block", 16, 0), R3("tail", 16, 16) };
	ASSERT_BAD(b, 2, 32, 16, "object 1 is a tail, expected a block");
	ASSERT_BAD(b, 2, 0, 0, "object 1 is a tail, expected a block");
	/* The first object labelled tail. */
	struct envelope c[] = { R3("tail", 16, 0), R3("tail", 8, 16) };
	ASSERT_BAD(c, 2, 24, 16, "object 0 is a tail, expected a block");
	/* A short last object labelled block. */
	struct envelope d[] = { R3("block", 16, 0), R3("block", 16, 16), R3("block", 8, 32) };
	ASSERT_BAD(d, 3, 40, 16, "object 2 is a block, expected a tail");
	ASSERT_BAD(d, 3, 0, 0, "object 2 is a block, expected a tail");
	/* A one-row block. */
	struct envelope e[] = { R3("block", 16, 0), R3("block", 1, 16) };
	ASSERT_BAD(e, 2, 17, 16, "object 1 is a block, expected a tail");
}
END_TEST

START_TEST(check_dtype_and_shape)
{
	struct envelope a[] = {
		R3("block", 16, 0), R3("block", 16, 16),
		env("tail", "<u2", 32, 3, (uint64_t)8, (uint64_t)48, (uint64_t)8),
	};
	ASSERT_BAD(a, 3, 40, 16, "object 2 is <u2 (8,48,8), object 0 is |u1 (16,48,8)");
	/* Same size, other kind; same kind, other byte order. */
	a[2] = env("tail", "|i1", 32, 3, (uint64_t)8, (uint64_t)48, (uint64_t)8);
	ASSERT_BAD(a, 3, 40, 16, "object 2 is |i1 (8,48,8)");
	a[2] = env("tail", "|b1", 32, 3, (uint64_t)8, (uint64_t)48, (uint64_t)8);
	ASSERT_BAD(a, 3, 40, 16, "object 2 is |b1");
	struct envelope b[] = {
		env("block", "<u2", 0, 3, (uint64_t)16, (uint64_t)48, (uint64_t)8),
		env("tail", ">u2", 16, 3, (uint64_t)8, (uint64_t)48, (uint64_t)8),
	};
	ASSERT_BAD(b, 2, 24, 16, "object 1 is >u2 (8,48,8), object 0 is <u2 (16,48,8)");

	/* shape[1:]: each axis, and the rank. */
	struct envelope c[] = {
		R3("block", 16, 0),
		env("block", "|u1", 16, 3, (uint64_t)16, (uint64_t)47, (uint64_t)8),
		R3("tail", 8, 32),
	};
	ASSERT_BAD(c, 3, 40, 16, "object 1 is |u1 (16,47,8), object 0 is |u1 (16,48,8)");
	c[1] = env("block", "|u1", 16, 3, (uint64_t)16, (uint64_t)48, (uint64_t)9);
	ASSERT_BAD(c, 3, 40, 16, "object 1 is |u1 (16,48,9)");
	c[1] = env("block", "|u1", 16, 2, (uint64_t)16, (uint64_t)48);
	ASSERT_BAD(c, 3, 40, 16, "object 1 is |u1 (16,48)");
	c[1] = env("block", "|u1", 16, 4, (uint64_t)16, (uint64_t)48, (uint64_t)8, (uint64_t)1);
	ASSERT_BAD(c, 3, 40, 16, "object 1 is |u1 (16,48,8,1)");
	c[1] = env("block", "|u1", 16, 1, (uint64_t)16);
	ASSERT_BAD(c, 3, 40, 16, "object 1 is |u1 (16)");
	/* Axes swapped: same elements per row, still another shape. */
	c[1] = env("block", "|u1", 16, 3, (uint64_t)16, (uint64_t)8, (uint64_t)48);
	ASSERT_BAD(c, 3, 40, 16, "object 1 is |u1 (16,8,48)");
	/* In the tail. */
	struct envelope d[] = {
		R3("block", 16, 0),
		env("tail", "|u1", 16, 3, (uint64_t)8, (uint64_t)61, (uint64_t)8),
	};
	ASSERT_BAD(d, 2, 0, 0, "object 1 is |u1 (8,61,8)");
}
END_TEST

START_TEST(check_token_end_short_and_long)
{
	struct envelope e[] = { R3("block", 16, 0), R3("block", 16, 16), R3("tail", 8, 32) };
	/* Short. */
	ASSERT_BAD(e, 3, 39, 16, "object 2 has 8 rows, expected 7 (block_size 16, token_end 39)");
	ASSERT_BAD(e, 3, 33, 16, "object 2 has 8 rows, expected 1");
	ASSERT_BAD(e, 3, 32, 16, "object 2 has 8 rows, expected 0 (block_size 16, token_end 32)");
	ASSERT_BAD(e, 3, 20, 16, "object 1 has 16 rows, expected 4");
	ASSERT_BAD(e, 3, 16, 16, "object 1 has 16 rows, expected 0");
	ASSERT_BAD(e, 3, 1, 0, "object 0 has 16 rows, expected 1");
	/* Long. */
	ASSERT_BAD(e, 3, 41, 16, "object 2 has 8 rows, expected 9 (block_size 16, token_end 41)");
	ASSERT_BAD(e, 3, 48, 16, "object 2 has 8 rows, expected 16");
	ASSERT_BAD(e, 3, UINT64_MAX, 0, "object 2 has 8 rows, expected 16");
	/* Full blocks, each right, but fewer rows than token_end. */
	ASSERT_BAD(e, 2, 40, 16, "objects hold 32 rows, token_end is 40");
	ASSERT_BAD(e, 2, 33, 0, "objects hold 32 rows, token_end is 33");
	ASSERT_BAD(e, 2, UINT64_MAX, 16, "objects hold 32 rows, token_end is 18446744073709551615");
}
END_TEST

START_TEST(check_extra_objects)
{
	struct envelope e[] = { R3("block", 16, 0), R3("block", 16, 16), R3("tail", 8, 32),
				R3("tail", 8, 40) };
	ASSERT_OK(e, 3, 40, 16, 40);
	ASSERT_BAD(e, 4, 40, 16, "object 3 has 8 rows, expected 0 (block_size 16, token_end 40)");
	/* Without token_end, the sum (48) makes object 2 a short block. */
	ASSERT_BAD(e, 4, 0, 0, "object 2 has 8 rows, expected 16");
	struct envelope f[] = { R3("block", 16, 0), R3("block", 16, 16), R3("block", 16, 32) };
	ASSERT_BAD(f, 3, 32, 16, "object 2 has 16 rows, expected 0");
}
END_TEST

START_TEST(check_error_text_fits)
{
	/* A small err buffer is cut, not overrun (the sanitizer build checks). */
	struct envelope e[] = {
		env("block", "|u1", 0, 8, (uint64_t)UINT32_MAX, (uint64_t)UINT32_MAX,
		    (uint64_t)1, (uint64_t)1, (uint64_t)1, (uint64_t)1, (uint64_t)1, (uint64_t)1),
		env("block", "<u8", UINT32_MAX, 8, (uint64_t)UINT32_MAX, (uint64_t)UINT32_MAX,
		    (uint64_t)UINT32_MAX, (uint64_t)1, (uint64_t)1, (uint64_t)1, (uint64_t)1,
		    (uint64_t)1),
	};
	struct materialize_request r = request(2, 0, 0);
	char *err = malloc(8);
	uint64_t got;
	ck_assert_int_eq(materialize_check(&r, e, &got, err, 8), -EBADMSG);
	ck_assert_uint_eq(strlen(err), 7);
	ck_assert_int_eq(strncmp(err, "object ", 7), 0);
	free(err);
	char big[256];
	ck_assert_int_eq(materialize_check(&r, e, &got, big, sizeof(big)), -EBADMSG);
	ck_assert_msg(strstr(big, "object 1 is <u8") != NULL, "%s", big);
}
END_TEST

Suite *materialize_suite(void)
{
	Suite *s = suite_create("materialize");
	TCase *tc = tcase_create("parse");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, parse_hashes_only);
	tcase_add_test(tc, parse_keywords);
	tcase_add_test(tc, parse_whitespace_and_blank_lines);
	tcase_add_test(tc, parse_hash_lengths);
	tcase_add_test(tc, parse_reads_only_len_bytes);
	tcase_add_test(tc, parse_many_hashes);
	tcase_add_test(tc, parse_object_count_limit);
	tcase_add_test(tc, parse_rejections);
	tcase_add_test(tc, parse_line_length_boundary);
	suite_add_tcase(s, tc);

	tc = tcase_create("check");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, check_valid_layouts);
	tcase_add_test(tc, check_many_blocks);
	tcase_add_test(tc, check_token_end_default);
	tcase_add_test(tc, check_block_size_explicit);
	tcase_add_test(tc, check_source_token_start);
	tcase_add_test(tc, check_row_counts);
	tcase_add_test(tc, check_kinds);
	tcase_add_test(tc, check_dtype_and_shape);
	tcase_add_test(tc, check_token_end_short_and_long);
	tcase_add_test(tc, check_extra_objects);
	tcase_add_test(tc, check_error_text_fits);
	suite_add_tcase(s, tc);
	return s;
}
