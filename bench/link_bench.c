/* SPDX-License-Identifier: Apache-2.0 */
/* link_bench: how fast committed objects can be linked into place on the
 * store's file system, from 1, 2, 4 and 8 threads at once, into one
 * directory (as artfs links a version's objects today) or spread over 16.
 *
 *     bench/link_bench [dir] [links per thread] [rounds]
 *
 * dir (default /dev/shm/artfs-link-bench) is made and removed; put it on
 * the store's file system. Each thread first makes its unnamed temporary
 * files (O_TMPFILE, 6 KiB written, as a staged record) in dir/tmp, then all
 * link theirs at once (linkat AT_EMPTY_PATH, then fstat, as a commit does)
 * under random hex names; only that phase is timed, from the first
 * thread's first link to the last thread's last. Prints links per
 * second over all threads for every setting and round. */
#include "autoconf.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define THREADS_MAX 8
#define DIRS_MAX 16

struct setting {
	int tmpdir;
	int dirs[DIRS_MAX];
	int ndirs;
	size_t per;
	pthread_barrier_t bar;
};

struct worker {
	struct setting *s;
	unsigned id;
	int *fds;
	int failed;
	double start, end;          /* of its links */
};

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *work(void *arg)
{
	struct worker *w = arg;
	struct setting *s = w->s;
	char buf[6144];

	memset(buf, (int)w->id, sizeof(buf));
	for (size_t i = 0; i < s->per; i++) {
		w->fds[i] = openat(s->tmpdir, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0400);
		if (w->fds[i] < 0 || write(w->fds[i], buf, sizeof(buf)) != (ssize_t)sizeof(buf)) {
			w->failed = errno ? errno : EIO;
			break;
		}
	}
	pthread_barrier_wait(&s->bar); /* every thread's files are made */
	w->start = now();
	for (size_t i = 0; i < s->per && !w->failed; i++) {
		char name[40];
		unsigned h = (unsigned)rand_r(&w->id) ^ (unsigned)(i * 2654435761u);
		snprintf(name, sizeof(name), "%08x%08zx%02x", h, i, w->id & 0xff);
		struct stat st;
		if (linkat(w->fds[i], "", s->dirs[(h >> 8) % (unsigned)s->ndirs], name, AT_EMPTY_PATH) < 0 ||
		    fstat(w->fds[i], &st) < 0)
			w->failed = errno;
	}
	w->end = now();
	for (size_t i = 0; i < s->per; i++)
		if (w->fds[i] >= 0)
			close(w->fds[i]);
	return NULL;
}

static int run(const char *root, int ndirs, int nthreads, size_t per, double *rate)
{
	char path[4096];
	struct setting s = { .ndirs = ndirs, .per = per };
	struct worker w[THREADS_MAX];
	pthread_t th[THREADS_MAX];
	int rc = 0;

	snprintf(path, sizeof(path), "rm -rf '%s' && mkdir -p '%s/tmp'", root, root);
	if (system(path) != 0)
		return -1;
	snprintf(path, sizeof(path), "%s/tmp", root);
	s.tmpdir = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	for (int d = 0; d < ndirs; d++) {
		snprintf(path, sizeof(path), "%s/d%d", root, d);
		if (mkdir(path, 0700) < 0 || (s.dirs[d] = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
			return -1;
	}
	pthread_barrier_init(&s.bar, NULL, (unsigned)nthreads + 1);
	for (int t = 0; t < nthreads; t++) {
		w[t] = (struct worker){ .s = &s, .id = (unsigned)t + 1, .fds = calloc(per, sizeof(int)) };
		for (size_t i = 0; i < per; i++)
			w[t].fds[i] = -1;
		pthread_create(&th[t], NULL, work, &w[t]);
	}
	pthread_barrier_wait(&s.bar);
	double t0 = 0, t1 = 0;
	for (int t = 0; t < nthreads; t++) {
		pthread_join(th[t], NULL);
		if (t == 0 || w[t].start < t0)
			t0 = w[t].start; /* from the first thread's first link */
		if (t == 0 || w[t].end > t1)
			t1 = w[t].end;   /* to the last thread's last */
		if (w[t].failed) {
			fprintf(stderr, "link_bench: %s\n", strerror(w[t].failed));
			rc = -1;
		}
		free(w[t].fds);
	}
	pthread_barrier_destroy(&s.bar);
	for (int d = 0; d < ndirs; d++)
		close(s.dirs[d]);
	close(s.tmpdir);
	*rate = (double)nthreads * (double)per / (t1 - t0);
	return rc;
}

int main(int argc, char **argv)
{
	const char *root = argc > 1 ? argv[1] : "/dev/shm/artfs-link-bench";
	size_t per = argc > 2 ? strtoul(argv[2], NULL, 10) : 2000;
	int rounds = argc > 3 ? atoi(argv[3]) : 3;
	char cmd[4096];

	if (per == 0 || rounds <= 0) {
		fprintf(stderr, "usage: link_bench [dir] [links per thread] [rounds]\n");
		return 2;
	}
	for (int r = 0; r < rounds; r++)
		for (int ndirs = 1; ndirs <= DIRS_MAX; ndirs *= DIRS_MAX)
			for (int nt = 1; nt <= THREADS_MAX; nt *= 2) {
				double rate;
				if (run(root, ndirs, nt, per, &rate) < 0)
					return 1;
				printf("round %d  directories %2d  threads %d  %9.0f links/s  %.2f us a link\n",
				       r, ndirs, nt, rate, 1e6 / rate);
				fflush(stdout);
			}
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	return system(cmd) == 0 ? 0 : 1;
}
