/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/safetensors.h"
#include "suites.h"

/* 8-byte N, the header text, data_len bytes of data. */
static uint8_t *build(const char *header, size_t data_len, size_t *len)
{
	size_t n = strlen(header);
	*len = 8 + n + data_len;
	uint8_t *buf = malloc(*len);
	ck_assert(buf);
	for (int i = 0; i < 8; i++)
		buf[i] = (uint8_t)((uint64_t)n >> (8 * i));
	memcpy(buf + 8, header, n);
	for (size_t i = 0; i < data_len; i++)
		buf[8 + n + i] = (uint8_t)(i * 7 + 1);
	return buf;
}

static int parse_text(const char *header, size_t data_len, struct safetensors_file *f, char *err, size_t errlen)
{
	size_t len;
	uint8_t *buf = build(header, data_len, &len);
	int rc = safetensors_parse(buf, len, len, f, err, errlen);
	free(buf);
	return rc;
}

/* Files written by the reference serializer, as its own unit tests
 * (safetensors/src/tensor.rs: test_serialization, test_empty) give them. */
START_TEST(reference_vectors)
{
	static const char one[] =
		"@\0\0\0\0\0\0\0"
		"{\"attn.0\":{\"dtype\":\"F32\",\"shape\":[1,2,3],\"data_offsets\":[0,24]}}"
		"\0\0\0\0\0\0\x80\x3f\0\0\0\x40\0\0\x40\x40\0\0\x80\x40\0\0\xa0\x40";
	static const char empty[] = "\x08\0\0\0\0\0\0\0{}      ";
	static const char meta[] = "(\0\0\0\0\0\0\0{\"__metadata__\":{\"framework\":\"pt\"}}     ";
	struct safetensors_file f;
	char err[256];

	ck_assert_uint_eq(sizeof(one) - 1, 8 + 64 + 24);
	ck_assert_int_eq(safetensors_parse((const uint8_t *)one, sizeof(one) - 1, sizeof(one) - 1, &f, err,
				  sizeof(err)), 0);
	ck_assert_uint_eq(f.header_len, 64);
	ck_assert_uint_eq(f.data_start, 72);
	ck_assert_uint_eq(f.file_size, 96);
	ck_assert_uint_eq(f.count, 1);
	ck_assert_str_eq(f.tensors[0].name, "attn.0");
	ck_assert_int_eq(f.tensors[0].dtype, SAFETENSORS_F32);
	ck_assert_uint_eq(f.tensors[0].ndim, 3);
	ck_assert_uint_eq(f.tensors[0].shape[0], 1);
	ck_assert_uint_eq(f.tensors[0].shape[1], 2);
	ck_assert_uint_eq(f.tensors[0].shape[2], 3);
	ck_assert_uint_eq(f.tensors[0].offset, 72);
	ck_assert_uint_eq(f.tensors[0].size, 24);
	ck_assert_ptr_null(f.raw);
	safetensors_free(&f);

	ck_assert_int_eq(safetensors_parse((const uint8_t *)empty, sizeof(empty) - 1, sizeof(empty) - 1, &f, err,
				  sizeof(err)), 0);
	ck_assert_uint_eq(f.count, 0);
	ck_assert_uint_eq(f.data_start, 16);
	safetensors_free(&f);
	ck_assert_int_eq(safetensors_parse((const uint8_t *)meta, sizeof(meta) - 1, sizeof(meta) - 1, &f, err,
				  sizeof(err)), 0);
	ck_assert_uint_eq(f.count, 0);
	safetensors_free(&f);

	/* The smallest file: N = 2, "{}". */
	ck_assert_int_eq(parse_text("{}", 0, &f, err, sizeof(err)), 0);
	ck_assert_uint_eq(f.count, 0);
	ck_assert_uint_eq(f.file_size, 10);
	safetensors_free(&f);
}
END_TEST

/* Names out of offset order; several dtypes, a sub-byte F4 and F6, a
 * zero-sized tensor at the same offset as a scalar, metadata. Data: 31 bytes. */
static const char good_header[] =
	"{\"e\":{\"dtype\":\"F6_E2M3\",\"shape\":[4],\"data_offsets\":[28,31]},"
	"\"__metadata__\":{\"format\":\"pt\"},"
	"\"a\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]},"
	"\"s\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[20,28]},"
	"\"c\":{\"dtype\":\"F4\",\"shape\":[3,2],\"data_offsets\":[17,20]},"
	"\"z\":{\"dtype\":\"F32\",\"shape\":[0,4],\"data_offsets\":[20,20]},"
	"\"b\":{\"dtype\":\"F8_E4M3\",\"shape\":[5],\"data_offsets\":[12,17]}}";
#define GOOD_DATA 31

START_TEST(valid_file)
{
	static const struct { const char *name; enum safetensors_dtype dtype; uint8_t ndim; uint64_t begin, size; } want[] = {
		{ "a", SAFETENSORS_BF16, 2, 0, 12 },
		{ "b", SAFETENSORS_F8_E4M3, 1, 12, 5 },
		{ "c", SAFETENSORS_F4, 2, 17, 3 },
		{ "z", SAFETENSORS_F32, 2, 20, 0 },
		{ "s", SAFETENSORS_F64, 0, 20, 8 },
		{ "e", SAFETENSORS_F6_E2M3, 1, 28, 3 },
	};
	struct safetensors_file f;
	char err[256] = "";

	ck_assert_msg(parse_text(good_header, GOOD_DATA, &f, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(f.header_len, strlen(good_header));
	ck_assert_uint_eq(f.data_start, 8 + strlen(good_header));
	ck_assert_uint_eq(f.count, 6);
	for (size_t i = 0; i < 6; i++) {
		ck_assert_str_eq(f.tensors[i].name, want[i].name);
		ck_assert_int_eq(f.tensors[i].dtype, want[i].dtype);
		ck_assert_uint_eq(f.tensors[i].ndim, want[i].ndim);
		ck_assert_uint_eq(f.tensors[i].offset, f.data_start + want[i].begin);
		ck_assert_uint_eq(f.tensors[i].size, want[i].size);
	}
	ck_assert_uint_eq(f.tensors[0].shape[1], 3);
	ck_assert_uint_eq(f.tensors[3].shape[0], 0);
	safetensors_free(&f);
	safetensors_free(&f); /* twice is fine */

	/* Leading and trailing whitespace (writers pad with spaces to 8). */
	char spaced[2048];
	snprintf(spaced, sizeof(spaced), " %s  \n ", good_header);
	ck_assert_int_eq(parse_text(spaced, GOOD_DATA, &f, err, sizeof(err)), 0);
	safetensors_free(&f);
}
END_TEST

START_TEST(dtype_table)
{
	static const char *const names[] = {
		"BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0",
		"F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64",
		"F64", "I64", "U64",
	};
	static const unsigned bits[] = { 8, 4, 6, 6, 8, 8, 8, 8, 8, 8, 8, 16, 16, 16, 16, 32, 32, 32,
					 64, 64, 64, 64 };
	ck_assert_uint_eq(sizeof(names) / sizeof(names[0]), SAFETENSORS_DTYPE_COUNT);
	for (unsigned i = 0; i < SAFETENSORS_DTYPE_COUNT; i++) {
		enum safetensors_dtype dt;
		ck_assert_int_eq(safetensors_dtype_from_name(names[i], &dt), 0);
		ck_assert_int_eq(dt, (enum safetensors_dtype)i);
		ck_assert_str_eq(safetensors_dtype_name(dt), names[i]);
		ck_assert_uint_eq(safetensors_dtype_bits(dt), bits[i]);

		/* Each parses in a file: 8 elements is whole bytes for all. */
		char header[256];
		struct safetensors_file f;
		char err[256];
		snprintf(header, sizeof(header), "{\"t\":{\"dtype\":\"%s\",\"shape\":[2,4],\"data_offsets\":[0,%u]}}",
			 names[i], bits[i]);
		ck_assert_msg(parse_text(header, bits[i], &f, err, sizeof(err)) == 0, "%s: %s", names[i], err);
		ck_assert_uint_eq(f.tensors[0].size, bits[i]);
		safetensors_free(&f);
	}
	enum safetensors_dtype dt;
	ck_assert_int_eq(safetensors_dtype_from_name("F8_E4M3FN", &dt), -EINVAL);
	ck_assert_int_eq(safetensors_dtype_from_name("bf16", &dt), -EINVAL);
	ck_assert_int_eq(safetensors_dtype_from_name("", &dt), -EINVAL);
	ck_assert_str_eq(safetensors_dtype_name(SAFETENSORS_DTYPE_COUNT), "?");
	ck_assert_uint_eq(safetensors_dtype_bits((enum safetensors_dtype)-1), 0);
}
END_TEST

/* good_header with one substring replaced. */
static char *variant(const char *from, const char *to)
{
	static char out[8192];
	const char *at = strstr(good_header, from);
	ck_assert_msg(at != NULL, "%s", from);
	snprintf(out, sizeof(out), "%.*s%s%s", (int)(at - good_header), good_header, to, at + strlen(from));
	return out;
}

START_TEST(rejections)
{
	static const struct { const char *from, *to; int data; const char *why; } cases[] = {
		/* JSON */
		{ "{\"e\"", "{{\"e\"", GOOD_DATA, "JSON" },
		{ "]}}", "]}}x", GOOD_DATA, "JSON" },
		{ "]}}", "]}", GOOD_DATA, "JSON" },
		{ "\"a\":", "\"\xff\":", GOOD_DATA, "JSON" },              /* not UTF-8 */
		{ "\"a\":", "\"a\\u0000\":", GOOD_DATA, "JSON" },          /* NUL in a name */
		{ "\"b\":{", "\"a\":{", GOOD_DATA, "JSON" },               /* duplicate name */
		{ "[28,31]", "[28,99999999999999999999]", GOOD_DATA, "JSON" },
		/* names */
		{ "\"a\":", "\"\":", GOOD_DATA, "name" },
		/* dtype */
		{ "\"BF16\"", "\"bf16\"", GOOD_DATA, "dtype" },
		{ "\"F8_E4M3\"", "\"F8_E4M3FN\"", GOOD_DATA, "dtype" },
		{ "\"BF16\"", "\"BF16 \"", GOOD_DATA, "dtype" },
		{ "\"BF16\"", "16", GOOD_DATA, "dtype" },
		{ "\"BF16\"", "null", GOOD_DATA, "dtype" },
		/* key set */
		{ "\"dtype\":\"BF16\",", "", GOOD_DATA, "exactly" },
		{ ",\"data_offsets\":[0,12]", "", GOOD_DATA, "exactly" },
		{ "\"shape\":[2,3],", "\"shape\":[2,3],\"extra\":1,", GOOD_DATA, "exactly" },
		{ "\"shape\":[2,3]", "\"Shape\":[2,3]", GOOD_DATA, "exactly" },
		{ "{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]}", "[\"BF16\",[2,3],[0,12]]",
		  GOOD_DATA, "not an object" },
		{ "{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]}", "\"x\"", GOOD_DATA,
		  "not an object" },
		/* shape */
		{ "[2,3]", "[2,-3]", GOOD_DATA, "shape[1]" },
		{ "[2,3]", "[2,3.0]", GOOD_DATA, "shape[1]" },
		{ "[2,3]", "[2,\"3\"]", GOOD_DATA, "shape[1]" },
		{ "[2,3]", "[2,null]", GOOD_DATA, "shape[1]" },
		{ "[2,3]", "6", GOOD_DATA, "shape" },
		{ "[2,3]", "{\"0\":6}", GOOD_DATA, "shape" },
		{ "[2,3]", "[1,1,1,1,1,1,1,1,6]", GOOD_DATA, "shape" },
		/* sizes */
		{ "[2,3]", "[4294967296,4294967296]", GOOD_DATA, "overflow" },
		{ "[2,3]", "[2305843009213693952,4]", GOOD_DATA, "overflow" },  /* elements fit, bits do not */
		{ "[0,4]", "[4294967296,4294967296,0]", GOOD_DATA, "overflow" },
		{ "[3,2]", "[3]", GOOD_DATA, "inside a byte" },             /* F4: 12 bits */
		{ "\"shape\":[4]", "\"shape\":[5]", GOOD_DATA, "inside a byte" }, /* F6: 30 bits */
		{ "[0,12]", "[0,11]", GOOD_DATA, "need 12" },
		{ "[0,12]", "[0,13]", GOOD_DATA, "need 12" },
		{ "[20,20]", "[20,24]", GOOD_DATA, "need 0" },
		/* data_offsets */
		{ "[0,12]", "[12,0]", GOOD_DATA, "end before begin" },
		{ "[0,12]", "[0,12,12]", GOOD_DATA, "data_offsets" },
		{ "[0,12]", "[0]", GOOD_DATA, "data_offsets" },
		{ "[0,12]", "[-1,11]", GOOD_DATA, "data_offsets" },
		{ "[0,12]", "[0.0,12]", GOOD_DATA, "data_offsets" },
		{ "[0,12]", "{\"0\":0,\"1\":12}", GOOD_DATA, "data_offsets" },
		/* layout of the data buffer */
		{ "[12,17]", "[11,16]", GOOD_DATA, "overlaps" },
		{ "[20,20]", "[19,19]", GOOD_DATA, "overlaps" },            /* zero-sized, inside c */
		{ "[20,20]", "[31,31]", GOOD_DATA, NULL },                  /* zero-sized at the end: fine */
		{ "[0,12]", "[1,13]", GOOD_DATA, "hole of 1 bytes" },
		{ "[28,31]", "[29,32]", GOOD_DATA + 1, "hole" },
		{ "[28,31]", "[28,31]", GOOD_DATA + 1, "cover 31 bytes of a 32-byte" },  /* trailing byte */
		{ "[28,31]", "[28,31]", GOOD_DATA - 1, "cover 31 bytes of a 30-byte" },  /* cut short */
		{ "[28,31]", "[28,31]", 0, "cover 31 bytes of a 0-byte" },
		/* __metadata__ */
		{ "{\"format\":\"pt\"}", "{\"format\":1}", GOOD_DATA, "__metadata__" },
		{ "{\"format\":\"pt\"}", "{\"format\":{}}", GOOD_DATA, "__metadata__" },
		{ "{\"format\":\"pt\"}", "[\"pt\"]", GOOD_DATA, "__metadata__" },
		{ "{\"format\":\"pt\"}", "\"pt\"", GOOD_DATA, "__metadata__" },
		{ "{\"format\":\"pt\"}", "null", GOOD_DATA, NULL },         /* serde's None */
		{ "{\"format\":\"pt\"}", "{}", GOOD_DATA, NULL },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct safetensors_file f;
		char err[256] = "";
		int rc = parse_text(variant(cases[i].from, cases[i].to), (size_t)cases[i].data, &f, err,
				    sizeof(err));
		if (!cases[i].why) {
			ck_assert_msg(rc == 0, "case %zu (%s -> %s): %s", i, cases[i].from, cases[i].to, err);
			safetensors_free(&f);
			continue;
		}
		ck_assert_msg(rc == -EINVAL, "case %zu (%s -> %s): got %d", i, cases[i].from, cases[i].to, rc);
		ck_assert_msg(strstr(err, cases[i].why), "case %zu: \"%s\" lacks \"%s\"", i, err, cases[i].why);
		ck_assert_uint_eq(f.count, 0);
		ck_assert_ptr_null(f.tensors);
	}

	struct safetensors_file f;
	char err[256];
	char name[1100];
	memset(name, 'n', sizeof(name));
	char header[1300];
	snprintf(header, sizeof(header), "{\"%.1024s\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", name);
	ck_assert_int_eq(parse_text(header, 1, &f, err, sizeof(err)), 0);
	ck_assert_uint_eq(strlen(f.tensors[0].name), 1024);
	safetensors_free(&f);
	snprintf(header, sizeof(header), "{\"%.1025s\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", name);
	ck_assert_int_eq(parse_text(header, 1, &f, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "1025 bytes"));
	/* Eight dimensions are fine. */
	ck_assert_int_eq(parse_text("{\"t\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,2,1],\"data_offsets\":[0,2]}}",
				    2, &f, err, sizeof(err)), 0);
	ck_assert_uint_eq(f.tensors[0].ndim, 8);
	safetensors_free(&f);

	ck_assert_int_eq(parse_text("[]", 0, &f, err, sizeof(err)), -EINVAL);
	ck_assert_int_eq(parse_text("\"x\"", 0, &f, err, sizeof(err)), -EINVAL);
	ck_assert_int_eq(parse_text("", 0, &f, err, sizeof(err)), -EINVAL);
	ck_assert_int_eq(parse_text("   ", 0, &f, err, sizeof(err)), -EINVAL);
	ck_assert_int_eq(parse_text("{}", 1, &f, err, sizeof(err)), -EINVAL); /* unindexed byte */
	/* No room for a reason is fine. */
	ck_assert_int_eq(parse_text("{\"__metadata__\":{}}", 0, &f, NULL, 0), 0);
	safetensors_free(&f);
	ck_assert_int_eq(parse_text("{\"__metadata__\":{}}", 1, &f, NULL, 0), -EINVAL);
}
END_TEST

START_TEST(header_lengths)
{
	struct safetensors_file f;
	char err[256];
	size_t len;
	uint8_t *buf = build(good_header, GOOD_DATA, &len);
	uint64_t n = strlen(good_header);

	ck_assert_int_eq(safetensors_parse(buf, len, len, &f, err, sizeof(err)), 0);
	safetensors_free(&f);
	/* Only 8 + N bytes need be given; the data is not read. */
	ck_assert_int_eq(safetensors_parse(buf, 8 + n, len, &f, err, sizeof(err)), 0);
	safetensors_free(&f);
	ck_assert_int_eq(safetensors_parse(buf, 8 + n - 1, len, &f, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "cut short"));
	ck_assert_int_eq(safetensors_parse(buf, 7, len, &f, err, sizeof(err)), -EINVAL);
	ck_assert_int_eq(safetensors_parse(buf, len, 7, &f, err, sizeof(err)), -EINVAL);
	ck_assert_int_eq(safetensors_parse(buf, len, 8 + n - 1, &f, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "past the end"));

	static const uint64_t bad[] = { SAFETENSORS_HEADER_MAX + 1ull, 1ull << 32, UINT64_MAX, UINT64_MAX - 7 };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		for (int b = 0; b < 8; b++)
			buf[b] = (uint8_t)(bad[i] >> (8 * b));
		ck_assert_int_eq(safetensors_parse(buf, len, UINT64_MAX, &f, err, sizeof(err)), -EINVAL);
		ck_assert_ptr_nonnull(strstr(err, "over 100000000"));
	}
	/* N within bounds but past the file. */
	for (int b = 0; b < 8; b++)
		buf[b] = (uint8_t)((uint64_t)SAFETENSORS_HEADER_MAX >> (8 * b));
	ck_assert_int_eq(safetensors_parse(buf, len, len, &f, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "past the end"));
	/* N = 0: no JSON at all. */
	memset(buf, 0, 8);
	ck_assert_int_eq(safetensors_parse(buf, len, len, &f, err, sizeof(err)), -EINVAL);
	/* A NUL byte inside the header. */
	free(buf);
	buf = build(good_header, GOOD_DATA, &len);
	buf[8 + 3] = 0;
	ck_assert_int_eq(safetensors_parse(buf, len, len, &f, err, sizeof(err)), -EINVAL);
	free(buf);
}
END_TEST

static char tmp_root[64];

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	return remove(path);
}

static void write_file(const char *path, const void *data, size_t len)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, data, len), (ssize_t)len);
	close(fd);
}

START_TEST(read_from_files)
{
	char path[128], err[256];
	struct safetensors_file f;
	size_t len;
	uint8_t *buf = build(good_header, GOOD_DATA, &len);

	strcpy(tmp_root, "/tmp/artfs-st-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(tmp_root));
	snprintf(path, sizeof(path), "%s/good.safetensors", tmp_root);
	write_file(path, buf, len);
	int fd = open(path, O_RDONLY);
	ck_assert_int_ge(fd, 0);
	ck_assert_msg(safetensors_read(fd, &f, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(f.count, 6);
	ck_assert_uint_eq(f.file_size, len);
	ck_assert_uint_eq(f.raw_len, 8 + strlen(good_header));
	ck_assert_int_eq(memcmp(f.raw, buf, f.raw_len), 0);
	ck_assert_int_eq(lseek(fd, 0, SEEK_CUR), 0); /* pread only */
	safetensors_free(&f);
	ck_assert_ptr_null(f.raw);
	close(fd);

	/* Trailing bytes after the data. */
	uint8_t *longer = malloc(len + 1);
	memcpy(longer, buf, len);
	longer[len] = 0;
	snprintf(path, sizeof(path), "%s/trailing.safetensors", tmp_root);
	write_file(path, longer, len + 1);
	fd = open(path, O_RDONLY);
	ck_assert_int_eq(safetensors_read(fd, &f, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "cover"));
	ck_assert_ptr_null(f.raw);
	close(fd);
	free(longer);

	/* Cut inside the header, and shorter than 8 bytes. */
	snprintf(path, sizeof(path), "%s/cut.safetensors", tmp_root);
	write_file(path, buf, 20);
	fd = open(path, O_RDONLY);
	ck_assert_int_eq(safetensors_read(fd, &f, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "past the end"));
	close(fd);
	write_file(path, buf, 5);
	fd = open(path, O_RDONLY);
	ck_assert_int_eq(safetensors_read(fd, &f, err, sizeof(err)), -EINVAL);
	close(fd);

	/* A huge N is refused before anything is allocated for it. */
	uint8_t huge[16] = { 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, '{', '}' };
	write_file(path, huge, sizeof(huge));
	fd = open(path, O_RDONLY);
	ck_assert_int_eq(safetensors_read(fd, &f, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "over"));
	close(fd);

	/* Not a regular file. */
	fd = open(tmp_root, O_RDONLY | O_DIRECTORY);
	ck_assert_int_eq(safetensors_read(fd, &f, err, sizeof(err)), -EINVAL);
	ck_assert_str_eq(err, "not a regular file");
	close(fd);
	ck_assert_int_eq(safetensors_read(-1, &f, err, sizeof(err)), -EBADF);

	free(buf);
	ck_assert_int_eq(nftw(tmp_root, rm_one, 16, FTW_DEPTH | FTW_PHYS), 0);
}
END_TEST

/* Random damage to a valid header never crashes or reads out of bounds (the
 * sanitizer build checks the latter), and whatever is accepted satisfies
 * the invariants. */
START_TEST(mutations_are_handled)
{
	size_t len;
	uint8_t *orig = build(good_header, GOOD_DATA, &len);
	uint8_t *buf = malloc(len);
	size_t hlen = 8 + strlen(good_header);
	unsigned seed = 20240607;
	unsigned ok = 0;

	for (int round = 0; round < 30000; round++) {
		memcpy(buf, orig, len);
		int flips = 1 + (int)(rand_r(&seed) % 4);
		for (int i = 0; i < flips; i++) {
			size_t at = (size_t)rand_r(&seed) % hlen;
			unsigned kind = (unsigned)rand_r(&seed) % 4;
			if (kind == 0 && at < 8)
				buf[at] = (uint8_t)rand_r(&seed);
			else if (kind <= 1 && buf[at] >= '0' && buf[at] <= '9')
				buf[at] = (uint8_t)('0' + rand_r(&seed) % 10); /* offsets and shapes */
			else if (kind == 2)
				buf[at] = "{}[],:\" 0-9.e\\"[rand_r(&seed) % 14];
			else
				buf[at] = (uint8_t)rand_r(&seed);
		}
		size_t cut = rand_r(&seed) % 4 ? len : (size_t)rand_r(&seed) % (len + 1);
		uint64_t file_size = rand_r(&seed) % 8 ? cut : (uint64_t)rand_r(&seed) % (2 * len);
		struct safetensors_file f;
		char err[128];
		int rc = safetensors_parse(buf, cut, file_size, &f, err, sizeof(err));
		ck_assert(rc == 0 || rc == -EINVAL);
		if (rc < 0)
			continue;
		ok++;
		uint64_t next = f.data_start;
		for (size_t i = 0; i < f.count; i++) {
			ck_assert_uint_eq(f.tensors[i].offset, next);
			ck_assert_uint_le(f.tensors[i].ndim, SAFETENSORS_NDIM_MAX);
			next += f.tensors[i].size;
		}
		ck_assert_uint_eq(next, file_size);
		safetensors_free(&f);
	}
	ck_assert_uint_gt(ok, 0);
	ck_assert_uint_lt(ok, 30000);
	free(buf);
	free(orig);
}
END_TEST

Suite *safetensors_suite(void)
{
	Suite *s = suite_create("safetensors");
	TCase *tc = tcase_create("safetensors");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, reference_vectors);
	tcase_add_test(tc, valid_file);
	tcase_add_test(tc, dtype_table);
	tcase_add_test(tc, rejections);
	tcase_add_test(tc, header_lengths);
	tcase_add_test(tc, read_from_files);
	tcase_add_test(tc, mutations_are_handled);
	suite_add_tcase(s, tc);
	return s;
}
