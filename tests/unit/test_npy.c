/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "format/npy.h"
#include "suites.h"

/* Header dicts written by numpy.lib.format._write_array_header (numpy 1.24),
 * independently of artfs: descr, shape, total header length, dict text. */
static const struct {
	const char *descr;
	unsigned ndim;
	uint64_t shape[8];
	size_t total;
	const char *dict;
} headers[] = {
	{ "|u1", 3, {16ULL, 48ULL, 8ULL}, 128, "{'descr': '|u1', 'fortran_order': False, 'shape': (16, 48, 8), }                                                     \n" },
	{ "<u2", 1, {1ULL}, 128, "{'descr': '<u2', 'fortran_order': False, 'shape': (1,), }                                                            \n" },
	{ "|b1", 2, {3ULL, 4ULL}, 128, "{'descr': '|b1', 'fortran_order': False, 'shape': (3, 4), }                                                          \n" },
	{ ">i4", 8, {1ULL, 2ULL, 3ULL, 4ULL, 5ULL, 6ULL, 7ULL, 8ULL}, 128, "{'descr': '>i4', 'fortran_order': False, 'shape': (1, 2, 3, 4, 5, 6, 7, 8), }                                        \n" },
	{ "<u8", 8, {18446744073709551615ULL, 18446744073709551615ULL, 18446744073709551615ULL, 18446744073709551615ULL, 18446744073709551615ULL, 18446744073709551615ULL, 18446744073709551615ULL, 18446744073709551615ULL}, 256, "{'descr': '<u8', 'fortran_order': False, 'shape': (18446744073709551615, 18446744073709551615, 18446744073709551615, 18446744073709551615, 18446744073709551615, 18446744073709551615, 18446744073709551615, 18446744073709551615), }                \n" },
	{ "|u1", 3, {99ULL, 61ULL, 8ULL}, 128, "{'descr': '|u1', 'fortran_order': False, 'shape': (99, 61, 8), }                                                     \n" },
	{ "|u1", 3, {1000ULL, 61ULL, 8ULL}, 128, "{'descr': '|u1', 'fortran_order': False, 'shape': (1000, 61, 8), }                                                   \n" },
	{ "<u2", 2, {12345678901234567890ULL, 1ULL}, 128, "{'descr': '<u2', 'fortran_order': False, 'shape': (12345678901234567890, 1), }                                       \n" },
};

START_TEST(header_matches_numpy)
{
	for (size_t i = 0; i < sizeof(headers) / sizeof(headers[0]); i++) {
		struct array_desc a = { .ndim = (uint8_t)headers[i].ndim };
		uint8_t buf[NPY_HEADER_MAX];
		ck_assert_int_eq(array_dtype_set(&a, headers[i].descr), 0);
		memcpy(a.shape, headers[i].shape, sizeof(a.shape));
		ssize_t n = npy_header(&a, buf, sizeof(buf));
		ck_assert_int_eq(n, (ssize_t)headers[i].total);
		ck_assert_int_eq(n % 64, 0);
		ck_assert_int_eq(memcmp(buf, "\x93NUMPY\x01\x00", 8), 0);
		ck_assert_uint_eq(buf[8] | buf[9] << 8, headers[i].total - 10);
		ck_assert_int_eq(memcmp(buf + 10, headers[i].dict, headers[i].total - 10), 0);
	}
}
END_TEST

START_TEST(header_of_each_vector)
{
	static const struct { const char *file; const char *dtype; uint64_t shape[3]; } v[] = {
		{ "req-block0.npy", "|u1", { 16, 61, 8 } },
		{ "req-tail.npy", "|u1", { 8, 61, 8 } },
		{ "u16-block.npy", "<u2", { 16, 4, 2 } },
		{ "one-token-tail.npy", "|u1", { 1, 61, 8 } },
		{ "req-materialized.npy", "|u1", { 40, 61, 8 } },
	};
	for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
		size_t len;
		uint8_t *file = read_vector(v[i].file, &len), buf[NPY_HEADER_MAX];
		struct array_desc a = { .ndim = 3 };
		uint64_t size;
		array_dtype_set(&a, v[i].dtype);
		memcpy(a.shape, v[i].shape, sizeof(v[i].shape));
		ssize_t n = npy_header(&a, buf, sizeof(buf));
		ck_assert_int_gt(n, 0);
		ck_assert_int_eq(memcmp(buf, file, (size_t)n), 0);
		ck_assert_int_eq(npy_file_size(&a, &size), 0);
		ck_assert_uint_eq(size, len);
		free(file);
	}
}
END_TEST

START_TEST(header_needs_room)
{
	struct array_desc a = { .ndim = 1, .shape = { 5 } };
	uint8_t buf[64];
	array_dtype_set(&a, "|u1");
	ck_assert_int_eq(npy_header(&a, buf, sizeof(buf)), -ENOSPC);
}
END_TEST

START_TEST(dtypes)
{
	struct array_desc a = { 0 };
	const char *ok[] = { "|b1", "|i1", "|u1", "<i2", "<u2", ">u2", "<f2", "<i4", "<u4",
			     "<f4", "<i8", "<u8", "<f8", ">f8" };
	const char *bad[] = { "u1", "<u1", "|u2", "|f1", "<b2", "<c8", "|O", "<U4", "|V8",
			      "<f16", "=u2", "<u3", "" };
	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
		ck_assert_msg(array_dtype_set(&a, ok[i]) == 0, "%s", ok[i]);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		ck_assert_msg(array_dtype_set(&a, bad[i]) == -EINVAL, "%s", bad[i]);
	array_dtype_set(&a, "<u8");
	ck_assert_uint_eq(a.itemsize, 8);
}
END_TEST

START_TEST(payload_overflow)
{
	struct array_desc a = { .ndim = 2, .shape = { 1ULL << 62, 8 } };
	uint64_t n;
	array_dtype_set(&a, "|u1");
	ck_assert_int_eq(array_payload_len(&a, &n), -EOVERFLOW);
	a.shape[1] = 3;
	ck_assert_int_eq(array_payload_len(&a, &n), 0);
	ck_assert_uint_eq(n, (1ULL << 62) * 3);
}
END_TEST

Suite *npy_suite(void)
{
	Suite *s = suite_create("npy");
	TCase *tc = tcase_create("npy");
	tcase_add_test(tc, header_matches_numpy);
	tcase_add_test(tc, header_of_each_vector);
	tcase_add_test(tc, header_needs_room);
	tcase_add_test(tc, dtypes);
	tcase_add_test(tc, payload_overflow);
	suite_add_tcase(s, tc);
	return s;
}
