/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "store/store.h"
#include "store/tmp_pool.h"
#include "suites.h"

static char dir[64];
static int dirfd_ = -1;

static void make_dir(void)
{
	snprintf(dir, sizeof(dir), "/dev/shm/artfs-pool-XXXXXX");
	if (!mkdtemp(dir)) {
		snprintf(dir, sizeof(dir), "/tmp/artfs-pool-XXXXXX");
		ck_assert_ptr_nonnull(mkdtemp(dir));
	}
	dirfd_ = open(dir, O_RDONLY | O_DIRECTORY);
	ck_assert_int_ge(dirfd_, 0);
}

static void drop_dir(void)
{
	close(dirfd_);
	ck_assert_int_eq(rmdir(dir), 0); /* the pool's files had no names */
}

/* A file from the pool for an object of size bytes, within a few seconds
 * (its maker may be starting). */
static int take_for(struct tmp_pool *p, uint64_t size)
{
	int fd = -1;

	for (int i = 0; i < 5000 && fd < 0; i++) {
		fd = tmp_pool_take(p, size);
		if (fd < 0)
			usleep(1000);
	}
	return fd;
}

START_TEST(files_are_unnamed_empty_and_writable)
{
	make_dir();
	struct tmp_pool *p = tmp_pool_start(dirfd_);
	ck_assert_ptr_nonnull(p);
	int fd = take_for(p, 0);
	ck_assert_int_ge(fd, 0);
	struct stat st;
	ck_assert_int_eq(fstat(fd, &st), 0);
	ck_assert(S_ISREG(st.st_mode));
	ck_assert_int_eq(st.st_size, 0);
	ck_assert_int_eq(st.st_nlink, 0);
	ck_assert_int_eq(pwrite(fd, "abc", 3, 0), 3);
	char buf[4] = { 0 };
	ck_assert_int_eq(pread(fd, buf, 3, 0), 3);
	ck_assert_str_eq(buf, "abc");
	/* It can be given a name, as a commit does. */
	char proc[64];
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	ck_assert_int_eq(linkat(AT_FDCWD, proc, dirfd_, "named", AT_SYMLINK_FOLLOW), 0);
	ck_assert_int_eq(fstatat(dirfd_, "named", &st, 0), 0);
	ck_assert_int_eq(st.st_size, 3);
	ck_assert_int_eq(unlinkat(dirfd_, "named", 0), 0);
	close(fd);
	tmp_pool_stop(p);
	drop_dir();
}
END_TEST

/* Files made after a take for 6000 bytes come with the pages for them
 * (written, they cost no allocation); one taken for less holds no page
 * beyond what it will hold; none is larger than empty to its reader. */
START_TEST(files_come_with_pages_for_the_size_last_asked)
{
	make_dir();
	struct tmp_pool *p = tmp_pool_start(dirfd_);
	ck_assert_ptr_nonnull(p);
	static int fds[2 * TMP_POOL_FILES];
	int n = 0;
	/* Every file made before the size was known is taken away. */
	for (; n < 2 * TMP_POOL_FILES; n++)
		ck_assert_int_ge(fds[n] = take_for(p, 6000), 0);
	struct stat st;
	int fd = take_for(p, 6000);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(fstat(fd, &st), 0);
	ck_assert_int_eq(st.st_size, 0);
	ck_assert_int_eq(st.st_blocks * 512, 8192);
	static char buf[6000];
	memset(buf, 7, sizeof(buf));
	ck_assert_int_eq(pwrite(fd, buf, sizeof(buf), 0), (ssize_t)sizeof(buf));
	ck_assert_int_eq(fstat(fd, &st), 0);
	ck_assert_int_eq(st.st_size, 6000);
	ck_assert_int_eq(st.st_blocks * 512, 8192);
	close(fd);
	fd = take_for(p, 100); /* made for 6000: gives back a page */
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(fstat(fd, &st), 0);
	ck_assert_int_eq(st.st_size, 0);
	ck_assert_int_le(st.st_blocks * 512, 4096);
	close(fd);
	for (int i = 0; i < n; i++)
		close(fds[i]);
	tmp_pool_stop(p);
	drop_dir();
}
END_TEST

/* Taken dry, it fills again: more files than it holds come out, each
 * once. */
START_TEST(a_pool_taken_dry_makes_more)
{
	make_dir();
	struct tmp_pool *p = tmp_pool_start(dirfd_);
	ck_assert_ptr_nonnull(p);
	enum { N = 3 * TMP_POOL_FILES };
	static int fds[N];
	for (int i = 0; i < N; i++) {
		fds[i] = take_for(p, 0);
		ck_assert_int_ge(fds[i], 0);
		for (int j = 0; j < i; j++)
			ck_assert_int_ne(fds[i], fds[j]);
	}
	for (int i = 0; i < N; i++)
		close(fds[i]);
	tmp_pool_stop(p);
	drop_dir();
}
END_TEST

struct taker {
	struct tmp_pool *p;
	int got[200];
	int n;
};

static void *take_many(void *arg)
{
	struct taker *k = arg;

	for (int i = 0; i < 200; i++) {
		int fd = tmp_pool_take(k->p, 0);
		if (fd >= 0)
			k->got[k->n++] = fd;
	}
	return NULL;
}

/* Eight threads take at once while the maker makes more: no file is
 * handed out twice, each is its own (a byte written to one is in no
 * other). */
START_TEST(threads_take_at_once_and_never_share_a_file)
{
	make_dir();
	struct tmp_pool *p = tmp_pool_start(dirfd_);
	ck_assert_ptr_nonnull(p);
	close(take_for(p, 0));
	static struct taker k[8];
	pthread_t th[8];
	for (int i = 0; i < 8; i++) {
		k[i].p = p;
		k[i].n = 0;
		ck_assert_int_eq(pthread_create(&th[i], NULL, take_many, &k[i]), 0);
	}
	for (int i = 0; i < 8; i++)
		pthread_join(th[i], NULL);
	int total = 0;
	for (int i = 0; i < 8; i++)
		for (int j = 0; j < k[i].n; j++) {
			unsigned char b = (unsigned char)(i * 31 + j);
			ck_assert_int_eq(pwrite(k[i].got[j], &b, 1, 0), 1);
			total++;
		}
	ck_assert_int_gt(total, 0);
	for (int i = 0; i < 8; i++)
		for (int j = 0; j < k[i].n; j++) {
			unsigned char b = 0, want = (unsigned char)(i * 31 + j);
			struct stat st;
			ck_assert_int_eq(fstat(k[i].got[j], &st), 0);
			ck_assert_int_eq(st.st_size, 1);
			ck_assert_int_eq(pread(k[i].got[j], &b, 1, 0), 1);
			ck_assert_int_eq(b, want);
			close(k[i].got[j]);
		}
	tmp_pool_stop(p);
	drop_dir();
}
END_TEST

static int open_fds(void)
{
	int n = 0;
	char path[64];

	for (int fd = 0; fd < 4096; fd++) {
		snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
		n += access(path, F_OK) == 0;
	}
	return n;
}

/* A stopped pool closes what it made. */
START_TEST(stop_closes_the_files_made)
{
	make_dir();
	int before = open_fds();
	struct tmp_pool *p = tmp_pool_start(dirfd_);
	ck_assert_ptr_nonnull(p);
	close(take_for(p, 0));
	for (int i = 0; i < 2000 && open_fds() < before + TMP_POOL_FILES / 2; i++)
		usleep(1000);
	ck_assert_int_ge(open_fds(), before + TMP_POOL_FILES / 2);
	tmp_pool_stop(p);
	ck_assert_int_eq(open_fds(), before);
	drop_dir();
}
END_TEST

/* Where the file system makes no O_TMPFILE (a directory fd it refuses),
 * the maker ends and the pool answers -1: callers make their own. */
START_TEST(no_tmpfile_support_leaves_the_pool_empty)
{
	int fd = open("/proc", O_RDONLY | O_DIRECTORY);
	ck_assert_int_ge(fd, 0);
	struct tmp_pool *p = tmp_pool_start(fd);
	ck_assert_ptr_nonnull(p);
	usleep(50 * 1000);
	for (int i = 0; i < 10; i++)
		ck_assert_int_eq(tmp_pool_take(p, 0), -1);
	tmp_pool_stop(p);
	close(fd);
}
END_TEST

/* Through the store: every temporary file comes whole and unnamed, from
 * the pool or made at once, and store_close stops the pool. */
START_TEST(store_temporary_files_come_from_the_pool)
{
	char path[64], err[256];
	struct store s;

	snprintf(path, sizeof(path), "/dev/shm/artfs-pool-store-XXXXXX");
	if (!mkdtemp(path)) {
		snprintf(path, sizeof(path), "/tmp/artfs-pool-store-XXXXXX");
		ck_assert_ptr_nonnull(mkdtemp(path));
	}
	ck_assert_int_eq(store_open(&s, path, -1, err, sizeof(err)), 0);
	for (int i = 0; i < 2 * TMP_POOL_FILES; i++) {
		struct store_tmp tmp;
		ck_assert_int_eq(store_tmp_open(&s, &tmp, 1), 0);
		ck_assert_int_eq(pwrite(tmp.fd, "x", 1, 0), 1);
		store_tmp_close(&tmp);
	}
	ck_assert_ptr_nonnull(atomic_load(&s.pool));
	store_close(&s);
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", path);
	ck_assert_int_eq(system(cmd), 0);
}
END_TEST

Suite *tmp_pool_suite(void)
{
	Suite *s = suite_create("tmp_pool");
	TCase *tc = tcase_create("core");

	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, files_are_unnamed_empty_and_writable);
	tcase_add_test(tc, a_pool_taken_dry_makes_more);
	tcase_add_test(tc, files_come_with_pages_for_the_size_last_asked);
	tcase_add_test(tc, threads_take_at_once_and_never_share_a_file);
	tcase_add_test(tc, stop_closes_the_files_made);
	tcase_add_test(tc, no_tmpfile_support_leaves_the_pool_empty);
	tcase_add_test(tc, store_temporary_files_come_from_the_pool);
	suite_add_tcase(s, tc);
	return s;
}
