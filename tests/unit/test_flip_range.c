/* SPDX-License-Identifier: Apache-2.0 */
/* libartfs's attachment in place (gpu/client/range.c) against a fake
 * driver: where the slabs go in a range, a flip to another version at the
 * same addresses, and every failure leaving the version before mapped. */
#include "autoconf.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "gpu/client/client_i.h"
#include "suites.h"

#define MIB (1ull << 20)
#define HANDLES 64

/* The fake driver: handle h is fd + 100; what is imported, mapped, reserved. */
static struct {
	bool live[HANDLES];          /* imported, not released */
	uint64_t va[HANDLES];        /* where a handle is mapped, 0: nowhere */
	int fail_import_fd, fail_map_handle, fail_map_after; /* -1: none */
	int maps;
	uint64_t reserved, reserved_len;
	bool freed;
} f;

static void fake_reset(void)
{
	memset(&f, 0, sizeof(f));
	f.fail_import_fd = f.fail_map_handle = f.fail_map_after = -1;
}

static int fake_import(int fd, uint64_t *h, char *err, size_t errlen)
{
	if (fd == f.fail_import_fd) {
		snprintf(err, errlen, "import %d refused", fd);
		return -EBADF;
	}
	*h = (uint64_t)fd + 100;
	ck_assert(!f.live[*h % HANDLES]);
	f.live[*h % HANDLES] = true;
	return 0;
}

static void fake_release(uint64_t h)
{
	ck_assert_msg(f.live[h % HANDLES], "release of %llu not held", (unsigned long long)h);
	f.live[h % HANDLES] = false;
}

static int fake_reserve(uint64_t size, uint64_t *va, char *err, size_t errlen)
{
	(void)err, (void)errlen;
	f.reserved = *va = 0x7f0000000000ull;
	f.reserved_len = size;
	return 0;
}

static void fake_free(uint64_t va, uint64_t size)
{
	ck_assert_uint_eq(va, f.reserved);
	ck_assert_uint_eq(size, f.reserved_len);
	f.freed = true;
}

static int mapped_at(uint64_t va)
{
	for (int h = 0; h < HANDLES; h++)
		if (f.va[h] == va)
			return h;
	return -1;
}

static int fake_map(uint64_t va, uint64_t size, uint64_t h, char *err, size_t errlen)
{
	(void)size;
	ck_assert(f.live[h % HANDLES]);
	ck_assert_msg(mapped_at(va) < 0, "map over a mapping at 0x%llx", (unsigned long long)va);
	if ((int)h == f.fail_map_handle || (f.fail_map_after >= 0 && f.maps >= f.fail_map_after)) {
		snprintf(err, errlen, "map of %d refused", (int)h);
		return -EIO;
	}
	f.maps++;
	f.va[h % HANDLES] = va;
	return 0;
}

static void fake_unmap(uint64_t va, uint64_t size)
{
	(void)size;
	for (int h = 0; h < HANDLES; h++)
		if (f.va[h] == va) {
			f.va[h] = 0;
			return;
		}
	ck_abort_msg("unmap of 0x%llx, not mapped", (unsigned long long)va);
}

static const struct range_driver fake = {
	.import = fake_import, .release = fake_release, .reserve = fake_reserve, .free = fake_free,
	.map = fake_map, .unmap = fake_unmap,
};

static int live_count(void)
{
	int n = 0;
	for (int h = 0; h < HANDLES; h++)
		n += f.live[h];
	return n;
}

static const uint64_t sizes[2] = { 4 * MIB, 2 * MIB };

START_TEST(test_reserved_here_placed_mapped_and_freed)
{
	struct client_range r;
	char err[256];
	int v1[2] = { 1, 2 };

	fake_reset();
	ck_assert_int_eq(range_open(&r, &fake, 0, 0, sizes, 2, err, sizeof(err)), 0);
	ck_assert(r.owned);
	ck_assert_uint_eq(f.reserved_len, 6 * MIB);
	ck_assert_uint_eq(r.at[0], f.reserved);
	ck_assert_uint_eq(r.at[1], f.reserved + 4 * MIB);
	ck_assert_int_eq(range_map(&r, &fake, v1, sizes, 2, err, sizeof(err)), 0);
	ck_assert_uint_eq(f.va[101 % HANDLES], r.at[0]);
	ck_assert_uint_eq(f.va[102 % HANDLES], r.at[1]);
	ck_assert_int_eq(live_count(), 2);
	range_close(&r, &fake);
	ck_assert_int_eq(live_count(), 0);
	ck_assert_int_eq(mapped_at(f.reserved), -1);
	ck_assert(f.freed);
}
END_TEST

START_TEST(test_the_engines_range_is_checked_and_kept)
{
	struct client_range r;
	char err[256];
	int v1[2] = { 1, 2 };
	const uint64_t base = 0x7e0000000000ull;

	fake_reset();
	ck_assert_int_eq(range_open(&r, &fake, base + 4096, 8 * MIB, sizes, 2, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "aligned"));
	ck_assert_int_eq(range_open(&r, &fake, base, 6 * MIB - 1, sizes, 2, err, sizeof(err)), -ENOSPC);
	ck_assert_ptr_nonnull(strstr(err, "6291456"));
	const uint64_t odd[1] = { 3 * MIB + 1 };
	ck_assert_int_eq(range_open(&r, &fake, base, 8 * MIB, odd, 1, err, sizeof(err)), -EINVAL);
	ck_assert_int_eq(range_open(&r, &fake, base, 8 * MIB, sizes, 0, err, sizeof(err)), -EINVAL);
	ck_assert_int_eq(range_open(&r, &fake, base, 8 * MIB, sizes, ARTFS_SLABS_MAX + 1, err, sizeof(err)),
			 -EINVAL);
	ck_assert_int_eq(range_open(&r, &fake, base, 6 * MIB, sizes, 2, err, sizeof(err)), 0);
	ck_assert(!r.owned);
	ck_assert_uint_eq(f.reserved_len, 0);
	ck_assert_uint_eq(r.at[0], base);
	ck_assert_int_eq(range_map(&r, &fake, v1, sizes, 2, err, sizeof(err)), 0);
	range_close(&r, &fake);
	ck_assert(!f.freed); /* the engine's own */
	ck_assert_int_eq(live_count(), 0);
}
END_TEST

START_TEST(test_flip_maps_the_new_version_at_the_same_addresses)
{
	struct client_range r;
	char err[256];
	int v1[2] = { 1, 2 }, v2[2] = { 3, 4 };

	fake_reset();
	ck_assert_int_eq(range_open(&r, &fake, 0, 0, sizes, 2, err, sizeof(err)), 0);
	ck_assert_int_eq(range_map(&r, &fake, v1, sizes, 2, err, sizeof(err)), 0);
	uint64_t at0 = r.at[0], at1 = r.at[1];
	for (int i = 0; i < 10; i++) { /* back and forth */
		const int *to = i % 2 ? v1 : v2;
		ck_assert_int_eq(range_map(&r, &fake, to, sizes, 2, err, sizeof(err)), 0);
		ck_assert_uint_eq(r.at[0], at0);
		ck_assert_uint_eq(r.at[1], at1);
		ck_assert_uint_eq(f.va[(uint64_t)(to[0] + 100) % HANDLES], at0);
		ck_assert_uint_eq(f.va[(uint64_t)(to[1] + 100) % HANDLES], at1);
		ck_assert_int_eq(live_count(), 2); /* the version before released */
	}
	range_close(&r, &fake);
	ck_assert_int_eq(live_count(), 0);
}
END_TEST

START_TEST(test_flip_of_another_layout_changes_nothing)
{
	struct client_range r;
	char err[256];
	int v1[2] = { 1, 2 }, v2[2] = { 3, 4 };
	const uint64_t other[2] = { 4 * MIB, 4 * MIB };

	fake_reset();
	ck_assert_int_eq(range_open(&r, &fake, 0, 0, sizes, 2, err, sizeof(err)), 0);
	ck_assert_int_eq(range_map(&r, &fake, v1, sizes, 2, err, sizeof(err)), 0);
	ck_assert_int_eq(range_map(&r, &fake, v2, other, 2, err, sizeof(err)), -EXDEV);
	ck_assert_ptr_nonnull(strstr(err, "another layout"));
	ck_assert_int_eq(range_map(&r, &fake, v2, sizes, 1, err, sizeof(err)), -EXDEV);
	ck_assert_int_eq(live_count(), 2); /* nothing imported */
	ck_assert_uint_eq(f.va[101 % HANDLES], r.at[0]);
	range_close(&r, &fake);
}
END_TEST

START_TEST(test_a_failed_flip_leaves_the_version_before)
{
	struct client_range r;
	char err[256];
	int v1[2] = { 1, 2 }, v2[2] = { 3, 4 };

	fake_reset();
	ck_assert_int_eq(range_open(&r, &fake, 0, 0, sizes, 2, err, sizeof(err)), 0);
	ck_assert_int_eq(range_map(&r, &fake, v1, sizes, 2, err, sizeof(err)), 0);
	/* A descriptor that does not import: nothing unmapped. */
	f.fail_import_fd = 4;
	ck_assert_int_eq(range_map(&r, &fake, v2, sizes, 2, err, sizeof(err)), -EBADF);
	ck_assert_int_eq(live_count(), 2);
	ck_assert_uint_eq(f.va[101 % HANDLES], r.at[0]);
	ck_assert_uint_eq(f.va[102 % HANDLES], r.at[1]);
	/* The second slab's map fails: the first is put back too. */
	f.fail_import_fd = -1;
	f.fail_map_handle = 104;
	ck_assert_int_eq(range_map(&r, &fake, v2, sizes, 2, err, sizeof(err)), -EIO);
	ck_assert_int_eq(live_count(), 2);
	ck_assert(f.live[101 % HANDLES] && f.live[102 % HANDLES]);
	ck_assert_uint_eq(f.va[101 % HANDLES], r.at[0]);
	ck_assert_uint_eq(f.va[102 % HANDLES], r.at[1]);
	ck_assert_uint_eq(f.va[103 % HANDLES], 0);
	/* Then the flip goes through. */
	f.fail_map_handle = -1;
	ck_assert_int_eq(range_map(&r, &fake, v2, sizes, 2, err, sizeof(err)), 0);
	ck_assert_uint_eq(f.va[103 % HANDLES], r.at[0]);
	ck_assert_int_eq(live_count(), 2);
	/* Every map fails from now on: the way back fails too, and says so. */
	f.fail_map_after = f.maps;
	ck_assert_int_eq(range_map(&r, &fake, v1, sizes, 2, err, sizeof(err)), -EIO);
	ck_assert_ptr_nonnull(strstr(err, "could not be mapped again"));
	ck_assert(f.live[103 % HANDLES] && f.live[104 % HANDLES]); /* still held */
	ck_assert_int_eq(live_count(), 2);
	range_close(&r, &fake);
	ck_assert_int_eq(live_count(), 0);
}
END_TEST

START_TEST(test_a_failed_first_map_leaves_nothing)
{
	struct client_range r;
	char err[256];
	int v1[2] = { 1, 2 };

	fake_reset();
	ck_assert_int_eq(range_open(&r, &fake, 0, 0, sizes, 2, err, sizeof(err)), 0);
	f.fail_map_handle = 102;
	ck_assert_int_eq(range_map(&r, &fake, v1, sizes, 2, err, sizeof(err)), -EIO);
	ck_assert_int_eq(live_count(), 0);
	ck_assert_int_eq(mapped_at(r.at[0]), -1);
	range_close(&r, &fake);
	ck_assert(f.freed);
}
END_TEST

Suite *flip_range_suite(void)
{
	Suite *s = suite_create("flip_range");
	TCase *tc = tcase_create("flip_range");

	tcase_add_test(tc, test_reserved_here_placed_mapped_and_freed);
	tcase_add_test(tc, test_the_engines_range_is_checked_and_kept);
	tcase_add_test(tc, test_flip_maps_the_new_version_at_the_same_addresses);
	tcase_add_test(tc, test_flip_of_another_layout_changes_nothing);
	tcase_add_test(tc, test_a_failed_flip_leaves_the_version_before);
	tcase_add_test(tc, test_a_failed_first_map_leaves_nothing);
	suite_add_tcase(s, tc);
	return s;
}
