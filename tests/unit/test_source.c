/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpu/source.h"
#include "suites.h"

#define FILE_BYTES ((1u << 20) + 123)

static char path[64];
static int fd = -1;
static struct stat st;

static uint8_t byte_at(uint64_t off)
{
	return (uint8_t)(off * 131 + (off >> 12));
}

/* An empty file of this test's own in /dev/shm (or /tmp): path, fd. */
static void open_temp(void)
{
	snprintf(path, sizeof(path), "/dev/shm/artfs-source-XXXXXX");
	fd = mkstemp(path);
	if (fd < 0) {
		snprintf(path, sizeof(path), "/tmp/artfs-source-XXXXXX");
		fd = mkstemp(path);
	}
	ck_assert_int_ge(fd, 0);
}

/* A file of FILE_BYTES, written with byte_at. */
static void make_file(void)
{
	uint8_t *buf = malloc(FILE_BYTES);

	ck_assert_ptr_nonnull(buf);
	for (uint64_t i = 0; i < FILE_BYTES; i++)
		buf[i] = byte_at(i);
	open_temp();
	ck_assert_int_eq(write(fd, buf, FILE_BYTES), (ssize_t)FILE_BYTES);
	ck_assert_int_eq(fstat(fd, &st), 0);
	free(buf);
}

static void drop_file(void)
{
	close(fd);
	unlink(path);
}

static void check_range(const struct source_map *m, uint64_t off, size_t len)
{
	uint8_t *dst = malloc(len ? len : 1);

	ck_assert_ptr_nonnull(dst);
	ck_assert_int_eq(source_copy(m, dst, off, len), 0);
	for (size_t i = 0; i < len; i++)
		ck_assert_msg(dst[i] == byte_at(off + i), "byte %llu of the file", (unsigned long long)(off + i));
	free(dst);
}

START_TEST(copies_equal_the_file)
{
	struct source_map m;

	make_file();
	ck_assert(source_open(fd, path, &st, &m) && m.base);
	ck_assert_uint_eq(m.size, FILE_BYTES);
	check_range(&m, 0, FILE_BYTES);
	/* Pages unmapped by a copy are read again from memory. */
	check_range(&m, 0, FILE_BYTES);
	check_range(&m, 1, 4095);
	check_range(&m, 4095, 2);
	check_range(&m, 12345, 200000);
	check_range(&m, FILE_BYTES - 1, 1);
	check_range(&m, FILE_BYTES, 0);
	uint8_t b;
	ck_assert_int_eq(source_copy(&m, &b, FILE_BYTES, 1), -EINVAL);
	ck_assert_int_eq(source_copy(&m, &b, UINT64_MAX, 1), -EINVAL);
	source_unmap(&m);
	ck_assert_ptr_null(m.base);
	drop_file();
}
END_TEST

START_TEST(a_file_that_shrank_is_eio_not_a_crash)
{
	struct source_map m;
	uint8_t *dst = malloc(FILE_BYTES);

	ck_assert_ptr_nonnull(dst);
	make_file();
	ck_assert(source_open(fd, path, &st, &m) && m.base);
	ck_assert_int_eq(ftruncate(fd, 4096), 0);
	ck_assert_int_eq(source_copy(&m, dst, 8192, 4096), -EIO);
	ck_assert_int_eq(source_copy(&m, dst, 0, FILE_BYTES), -EIO);
	check_range(&m, 0, 4096); /* what is left reads as before */
	ck_assert_int_eq(source_copy(&m, dst, 100000, 10), -EIO);
	source_unmap(&m);
	free(dst);
	drop_file();
}
END_TEST

static void *copy_with_signals_blocked(void *arg)
{
	const struct source_map *m = arg;
	sigset_t all;
	uint8_t *dst = malloc(FILE_BYTES);

	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL); /* as the daemon's threads start */
	int rc = dst ? source_copy(m, dst, 0, FILE_BYTES) : -ENOMEM;
	free(dst);
	return (void *)(intptr_t)rc;
}

/* The daemon's threads block every signal; a fault in a copy is still
 * caught there (a blocked SIGBUS from a fault would kill the process). */
START_TEST(shrank_under_blocked_signals)
{
	struct source_map m;
	pthread_t t;
	void *rc;

	make_file();
	ck_assert(source_open(fd, path, &st, &m) && m.base);
	ck_assert_int_eq(ftruncate(fd, 4096), 0);
	ck_assert_int_eq(pthread_create(&t, NULL, copy_with_signals_blocked, &m), 0);
	ck_assert_int_eq(pthread_join(t, &rc), 0);
	ck_assert_int_eq((int)(intptr_t)rc, -EIO);
	source_unmap(&m);
	drop_file();
}
END_TEST

struct copier {
	const struct source_map *m;
	_Atomic bool *stop;
	unsigned ok, eio, wrong;
};

static void *copy_loop(void *arg)
{
	struct copier *c = arg;
	uint8_t *dst = malloc(FILE_BYTES);

	for (unsigned k = 0; dst && !atomic_load(c->stop) && k < 100000; k++) {
		int rc = source_copy(c->m, dst, 0, FILE_BYTES);
		if (rc == -EIO) {
			c->eio++;
			continue;
		}
		c->ok++;
		for (size_t i = 0; i < FILE_BYTES; i += 997)
			if (dst[i] != byte_at(i))
				c->wrong++;
	}
	free(dst);
	return NULL;
}

/* Four threads copy the whole file while it is cut short: every copy is
 * whole and right, or -EIO; none crashes the process. */
START_TEST(shrinking_under_many_copies)
{
	struct source_map m;
	_Atomic bool stop = false;
	struct copier cs[4];
	pthread_t ts[4];

	make_file();
	ck_assert(source_open(fd, path, &st, &m) && m.base);
	for (int k = 0; k < 4; k++) {
		cs[k] = (struct copier){ .m = &m, .stop = &stop };
		ck_assert_int_eq(pthread_create(&ts[k], NULL, copy_loop, &cs[k]), 0);
	}
	usleep(20000);
	ck_assert_int_eq(ftruncate(fd, 8192), 0);
	usleep(20000);
	atomic_store(&stop, true);
	unsigned ok = 0, eio = 0;
	for (int k = 0; k < 4; k++) {
		pthread_join(ts[k], NULL);
		ck_assert_uint_eq(cs[k].wrong, 0);
		ok += cs[k].ok;
		eio += cs[k].eio;
	}
	ck_assert_uint_gt(eio, 0);
	(void)ok;
	source_unmap(&m);
	drop_file();
}
END_TEST

static double seconds(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

struct proc_copier {
	struct source_map m;
	const uint8_t *want;
	unsigned ok, eio, wrong;
};

/* Copies the whole file, comparing every byte, until 20 copies were EIO
 * (the file was cut) or 5 s passed. */
static void *proc_copy_loop(void *arg)
{
	struct proc_copier *c = arg;
	uint8_t *dst = malloc(FILE_BYTES);
	double end = seconds() + 5;

	while (dst && c->eio < 20 && seconds() < end) {
		memset(dst, 0xee, FILE_BYTES); /* no byte of the copy before counts */
		int rc = source_copy(&c->m, dst, 0, FILE_BYTES);
		if (rc == -EIO)
			c->eio++;
		else if (rc == 0 && memcmp(dst, c->want, FILE_BYTES) == 0)
			c->ok++;
		else
			c->wrong++;
	}
	free(dst);
	return NULL;
}

/* Four processes of two threads each, every process with a mapping of its
 * own of the same file (as several loads of one checkpoint at once), copy
 * it whole and compare every byte while the file is cut short: every copy
 * is whole and right, or -EIO; no process dies. */
START_TEST(many_processes_copy_while_the_file_is_cut)
{
	uint8_t *want = malloc(FILE_BYTES);
	pid_t kids[4];

	ck_assert_ptr_nonnull(want);
	for (uint64_t i = 0; i < FILE_BYTES; i++)
		want[i] = byte_at(i);
	make_file();
	/* Each process says on ready[1] that it has mapped the whole file and
	 * started copying; the file is cut only then (a process that opened it
	 * after the cut would see a file of 8 KiB and copy nothing). */
	int ready[2];
	ck_assert_int_eq(pipe(ready), 0);
	for (int k = 0; k < 4; k++) {
		kids[k] = fork();
		ck_assert_int_ge(kids[k], 0);
		if (kids[k] == 0) {
			struct proc_copier cs[2];
			pthread_t ts[2];
			close(ready[0]);
			int fd2 = open(path, O_RDONLY);
			struct stat st2;
			if (fd2 < 0 || fstat(fd2, &st2) != 0)
				_exit(10);
			for (int j = 0; j < 2; j++) {
				cs[j] = (struct proc_copier){ .want = want };
				if (!source_open(fd2, path, &st2, &cs[j].m) || !cs[j].m.base)
					_exit(11);
				if (pthread_create(&ts[j], NULL, proc_copy_loop, &cs[j]) != 0)
					_exit(12);
			}
			if (write(ready[1], "r", 1) != 1)
				_exit(13);
			close(ready[1]);
			int code = 0;
			for (int j = 0; j < 2; j++) {
				pthread_join(ts[j], NULL);
				if (cs[j].wrong)
					code = 1;      /* a copy said 0 with other bytes */
				else if (!cs[j].eio && !code)
					code = 2;      /* never saw the cut */
				source_unmap(&cs[j].m);
			}
			_exit(code);
		}
	}
	close(ready[1]);
	for (int k = 0; k < 4; k++) {
		struct pollfd p = { .fd = ready[0], .events = POLLIN };
		char r;
		ck_assert_msg(poll(&p, 1, 10000) == 1 && read(ready[0], &r, 1) == 1,
			      "copier process %d did not start", k);
	}
	close(ready[0]);
	usleep(20000); /* copies under way */
	ck_assert_int_eq(ftruncate(fd, 8192), 0);
	for (int k = 0; k < 4; k++) {
		int status;
		ck_assert_int_eq(waitpid(kids[k], &status, 0), kids[k]);
		ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
			      "copier process %d: %s %d", k, WIFEXITED(status) ? "exit" : "signal",
			      WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
	}
	free(want);
	drop_file();
}
END_TEST

/* A fault outside source_copy is not swallowed: the process dies as it
 * would without the handler (by SIGBUS; under ASan, its report and exit). */
START_TEST(other_faults_still_kill)
{
	struct source_map m;

	make_file();
	ck_assert(source_open(fd, path, &st, &m) && m.base);
	uint8_t b;
	check_range(&m, 0, 1); /* the handler is in place */
	ck_assert_int_eq(ftruncate(fd, 4096), 0);
	pid_t pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		int nul = open("/dev/null", O_WRONLY);
		if (nul >= 0)
			dup2(nul, 2); /* ASan's report of the fault: expected */
		b = *(volatile uint8_t *)(m.base + 65536);
		_exit(b == 0x7f ? 3 : 0);
	}
	int status;
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert_msg(!(WIFEXITED(status) && (WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == 3)),
		      "the child read past the end of a shrunk file and lived");
	if (WIFSIGNALED(status))
		ck_assert_int_eq(WTERMSIG(status), SIGBUS);
	source_unmap(&m);
	drop_file();
}
END_TEST

START_TEST(not_mapped_when_not_in_memory_or_told_not_to)
{
	struct source_map m;

	make_file();
	setenv("ARTFS_LOAD_PREAD", "1", 1);
	ck_assert(source_open(fd, path, &st, &m)); /* in memory, */
	ck_assert_ptr_null(m.base);                 /* but not mapped */
	unsetenv("ARTFS_LOAD_PREAD");
	drop_file();
	/* A file of holes: none of its pages is in memory. */
	open_temp();
	ck_assert_int_eq(ftruncate(fd, 64 << 20), 0);
	ck_assert_int_eq(fstat(fd, &st), 0);
	ck_assert(!source_open(fd, path, &st, &m));
	ck_assert_ptr_null(m.base);
	drop_file();
}
END_TEST

Suite *source_suite(void)
{
	Suite *s = suite_create("source");
	TCase *tc = tcase_create("core");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, copies_equal_the_file);
	tcase_add_test(tc, a_file_that_shrank_is_eio_not_a_crash);
	tcase_add_test(tc, shrank_under_blocked_signals);
	tcase_add_test(tc, shrinking_under_many_copies);
	tcase_add_test(tc, many_processes_copy_while_the_file_is_cut);
	tcase_add_test(tc, other_faults_still_kill);
	tcase_add_test(tc, not_mapped_when_not_in_memory_or_told_not_to);
	suite_add_tcase(s, tc);
	return s;
}
