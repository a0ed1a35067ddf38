/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "state/config.h"
#include "suites.h"

START_TEST(sizes)
{
	static const struct { const char *text; uint64_t want; } ok[] = {
		{ "4096", 4096 }, { "8G", 8ULL << 30 }, { "64M", 64ULL << 20 }, { "1k", 1024 },
		{ "2T", 2ULL << 40 }, { "1.5G", 3ULL << 29 }, { "16KiB", 16384 }, { "10MB", 10ULL << 20 },
		{ "0", 0 },
	};
	const char *bad[] = { "", "G", "-1", "8X", "8GG", "1e3", " 8G", "8 G", "abc" };
	uint64_t v;
	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		ck_assert_msg(config_parse_size(ok[i].text, &v) == 0, "%s", ok[i].text);
		ck_assert_uint_eq(v, ok[i].want);
	}
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		ck_assert_msg(config_parse_size(bad[i], &v) == -EINVAL, "%s", bad[i]);
}
END_TEST

START_TEST(defaults_and_set)
{
	struct artfs_config c;
	char err[256];
	config_init(&c);
	ck_assert_str_eq(c.store, "/dev/shm/artfs");
	ck_assert_uint_eq(c.capacity, 8ULL << 30);
	ck_assert_uint_eq(c.max_object, 64ULL << 20);
	ck_assert_uint_eq(c.ttl, 3600);
	ck_assert_int_eq(config_set(&c, "capacity", "1G", false, err, sizeof(err)), 0);
	ck_assert_uint_eq(c.capacity, 1ULL << 30);
	ck_assert_int_eq(config_set(&c, "capacity", "0", false, err, sizeof(err)), -EINVAL);
	ck_assert_int_eq(config_set(&c, "ttl", "0", false, err, sizeof(err)), 0);
	ck_assert_int_eq(config_set(&c, "ttl", "x", false, err, sizeof(err)), -EINVAL);
	ck_assert_int_eq(config_set(&c, "umask", "027", false, err, sizeof(err)), 0);
	ck_assert_uint_eq(c.umask, 027);
	ck_assert_int_eq(config_set(&c, "umask", "8", false, err, sizeof(err)), -EINVAL);
	ck_assert_int_eq(config_set(&c, "store", "rel", false, err, sizeof(err)), -EINVAL);
	ck_assert_int_eq(config_set(&c, "nonsense", "1", false, err, sizeof(err)), -ENOENT);
	/* The file does not override the command line. */
	ck_assert_int_eq(config_set(&c, "capacity", "2G", true, err, sizeof(err)), 0);
	ck_assert_uint_eq(c.capacity, 1ULL << 30);
	config_free(&c);
}
END_TEST

START_TEST(file)
{
	char path[] = "/tmp/artfs-config-XXXXXX";
	int fd = mkstemp(path);
	const char text[] = "# comment\n\n  capacity = 3G  \nmax_object=1M\nweights.default = /models/x\n";
	ck_assert_int_eq(write(fd, text, sizeof(text) - 1), (ssize_t)sizeof(text) - 1);
	close(fd);
	struct artfs_config c;
	char err[512];
	config_init(&c);
	ck_assert_int_eq(config_load_file(&c, path, err, sizeof(err)), 0);
	ck_assert_uint_eq(c.capacity, 3ULL << 30);
	ck_assert_uint_eq(c.max_object, 1ULL << 20);
	ck_assert_uint_eq(c.nweights, 1);
	ck_assert_str_eq(c.weights[0].version, "default");
	ck_assert_str_eq(c.weights[0].dir, "/models/x");
	char *r = config_render(&c);
	ck_assert_ptr_nonnull(strstr(r, "capacity = 3221225472\n"));
	ck_assert_ptr_nonnull(strstr(r, "weights.default = /models/x\n"));
	free(r);
	config_free(&c);

	FILE *f = fopen(path, "w");
	fputs("capacity = 1G\nbogus line\n", f);
	fclose(f);
	config_init(&c);
	ck_assert_int_eq(config_load_file(&c, path, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, ":2: expected key = value"));
	config_free(&c);
	unlink(path);

	config_init(&c);
	ck_assert_int_eq(config_load_file(&c, "/nonexistent/artfs.conf", err, sizeof(err)), -ENOENT);
	config_free(&c);
}
END_TEST

/* Found by tests/fuzz/config: a NUL byte ended the line for fgets, so the
 * rest of a last line was dropped silently (store=/a) and a NUL elsewhere
 * was reported as a line too long. */
START_TEST(file_with_nul)
{
	static const struct { const char *text; size_t len; } cases[] = {
		{ "ttl = 5\nstore = /a\0b", 20 },
		{ "store = /a\0b\nttl = 5\n", 21 },
		{ "# a comment\0\n", 13 },
	};
	char path[] = "/tmp/artfs-config-XXXXXX";
	int fd = mkstemp(path);
	close(fd);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		FILE *f = fopen(path, "w");
		ck_assert_uint_eq(fwrite(cases[i].text, 1, cases[i].len, f), cases[i].len);
		fclose(f);
		struct artfs_config c;
		char err[512];
		config_init(&c);
		ck_assert_int_eq(config_load_file(&c, path, err, sizeof(err)), -EINVAL);
		ck_assert_msg(strstr(err, "NUL byte"), "%s", err);
		ck_assert_str_eq(c.store, CONFIG_DEFAULT_STORE);
		config_free(&c);
	}
	unlink(path);
}
END_TEST

Suite *config_suite(void)
{
	Suite *s = suite_create("config");
	TCase *tc = tcase_create("config");
	tcase_add_test(tc, sizes);
	tcase_add_test(tc, defaults_and_set);
	tcase_add_test(tc, file);
	tcase_add_test(tc, file_with_nul);
	suite_add_tcase(s, tc);
	return s;
}
