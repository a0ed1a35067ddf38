/* SPDX-License-Identifier: Apache-2.0 */
/* fs/lifeline.c: a daemon's lifeline breaks as it dies, holds nothing else
 * open, and the holder reads whether every thread is past its last system
 * call and how the process ends. Real processes: forked children with
 * threads, killed or ending. */
#include "autoconf.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fs/holder/lifeline.h"
#include "suites.h"

static void *sleeper(void *arg)
{
	(void)arg;
	for (;;)
		pause();
	return NULL;
}

/* A child with 4 sleeping threads and a lifeline kept; it reports on
 * `ready` (then closes its copy of it) and waits until told how to end
 * through `order`: 'k' nothing (the parent kills it), '0' _exit(0), '3'
 * _exit(3). *life is the parent's end. */
static pid_t child(int *life, int *ready, int *order)
{
	int l[2], r[2], o[2];

	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, l), 0);
	ck_assert_int_eq(pipe2(r, O_CLOEXEC), 0);
	ck_assert_int_eq(pipe2(o, O_CLOEXEC), 0);
	pid_t pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		close(l[0]);
		close(r[0]);
		close(o[1]);
		for (int i = 0; i < 4; i++) {
			pthread_t th;
			if (pthread_create(&th, NULL, sleeper, NULL) != 0)
				_exit(90);
		}
		if (lifeline_keep(l[1]) != 0)
			_exit(91);
		/* The keeping thread's table has no copy of r[1]: closing it
		 * here is the end the parent reads. */
		close(r[1]);
		char c;
		if (read(o[0], &c, 1) != 1 || c == 'k')
			for (;;)
				pause();
		_exit(c - '0'); /* exit_group, as a daemon's end */
	}
	close(l[1]);
	close(r[1]);
	close(o[0]);
	*life = l[0];
	*ready = r[0];
	*order = o[1];
	return pid;
}

static bool hung_up(int fd, int ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	return poll(&p, 1, ms) == 1 && (p.revents & (POLLHUP | POLLIN));
}

START_TEST(test_a_killed_daemon_breaks_its_lifeline_and_reads_as_dying)
{
	int life, ready, order, code = -1;
	char c;
	pid_t pid = child(&life, &ready, &order);

	/* The keeping thread holds only its lifeline: the child's own close
	 * of the pipe is an end of file here. */
	ck_assert_int_eq(read(ready, &c, 1), 0);
	ck_assert(!hung_up(life, 50));
	ck_assert_int_eq(lifeline_dying(pid, &code), LIFELINE_LIVES);
	ck_assert_int_eq(kill(pid, SIGKILL), 0);
	ck_assert(hung_up(life, 5000));
	ck_assert_int_eq(lifeline_wait_dying(pid, 5000, &code), LIFELINE_DIES);
	ck_assert(WIFSIGNALED(code));
	ck_assert_int_eq(WTERMSIG(code), SIGKILL);
	int status;
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert(WIFSIGNALED(status));
	close(life);
	close(ready);
	close(order);
}
END_TEST

START_TEST(test_an_end_of_its_own_reads_as_an_end_and_a_failure_as_a_death)
{
	for (int want = 0; want <= 3; want += 3) {
		int life, ready, order, code = -1, status;
		char c, how = (char)('0' + want);
		pid_t pid = child(&life, &ready, &order);

		ck_assert_int_eq(read(ready, &c, 1), 0);
		ck_assert_int_eq(write(order, &how, 1), 1);
		ck_assert(hung_up(life, 5000));
		/* Until it is reaped, a child reads as exiting (a zombie). */
		enum lifeline_state s = lifeline_wait_dying(pid, 5000, &code);
		ck_assert_int_eq(s, want == 0 ? LIFELINE_ENDS : LIFELINE_DIES);
		ck_assert(WIFEXITED(code));
		ck_assert_int_eq(WEXITSTATUS(code), want);
		ck_assert_int_eq(waitpid(pid, &status, 0), pid);
		ck_assert_int_eq(WEXITSTATUS(status), want);
		close(life);
		close(ready);
		close(order);
	}
}
END_TEST

START_TEST(test_a_living_process_is_described_thread_by_thread)
{
	int life, ready, order, code;
	char c, buf[512];
	pid_t pid = child(&life, &ready, &order);

	ck_assert_int_eq(read(ready, &c, 1), 0);
	lifeline_describe_living(pid, buf, sizeof(buf));
	/* main, 4 sleepers, the keeper: 6 "tid:wchan" words */
	int words = 1;
	for (const char *p = buf; *p; p++)
		words += *p == ' ';
	ck_assert_int_eq(words, 6);
	ck_assert_ptr_nonnull(strchr(buf, ':'));
	ck_assert_int_eq(lifeline_wait_dying(pid, 20, &code), LIFELINE_LIVES);
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	/* Reaped: nothing of it is left to read. */
	ck_assert_int_eq(lifeline_dying(pid, &code), LIFELINE_LIVES);
	ck_assert_int_eq(lifeline_keep(-1), -EBADF);
	close(life);
	close(ready);
	close(order);
}
END_TEST

Suite *lifeline_suite(void)
{
	Suite *s = suite_create("lifeline");
	TCase *tc = tcase_create("processes");

	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, test_a_killed_daemon_breaks_its_lifeline_and_reads_as_dying);
	tcase_add_test(tc, test_an_end_of_its_own_reads_as_an_end_and_a_failure_as_a_death);
	tcase_add_test(tc, test_a_living_process_is_described_thread_by_thread);
	suite_add_tcase(s, tc);
	return s;
}
