#include "autoconf.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

#include "tmp_pool.h"

struct tmp_pool {
	pthread_mutex_t mu;
	pthread_cond_t wanted;     /* the maker waits here while the pool is full enough */
	int fds[TMP_POOL_FILES];
	unsigned n;                /* ready files: fds[0..n) */
	bool stop;
	bool failed;               /* the file system makes none: the maker ended */
	int dirfd;
	pthread_t maker;
};

static void *make_files(void *arg)
{
	struct tmp_pool *p = arg;

	pthread_mutex_lock(&p->mu);
	while (!p->stop) {
		if (p->n >= TMP_POOL_FILES / 2) {
			pthread_cond_wait(&p->wanted, &p->mu);
			continue;
		}
		/* Up to full, each file made outside the lock. */
		while (!p->stop && p->n < TMP_POOL_FILES) {
			pthread_mutex_unlock(&p->mu);
			int fd = openat(p->dirfd, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0400);
			int e = errno;
			pthread_mutex_lock(&p->mu);
			if (fd < 0) {
				/* No O_TMPFILE here: the publishes make named files
				 * themselves. Out of descriptors or memory: they make
				 * their own, and may meet the same error. */
				if (e == EOPNOTSUPP || e == EISDIR || e == EINVAL) {
					p->failed = true;
					pthread_mutex_unlock(&p->mu);
					return NULL;
				}
				break;
			}
			if (p->stop || p->n >= TMP_POOL_FILES) {
				close(fd);
				break;
			}
			p->fds[p->n++] = fd;
		}
		if (!p->stop && p->n < TMP_POOL_FILES / 2) /* it failed: not again at once */
			pthread_cond_wait(&p->wanted, &p->mu);
	}
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

struct tmp_pool *tmp_pool_start(int dirfd)
{
	struct tmp_pool *p = calloc(1, sizeof(*p));
	sigset_t all, old;

	if (!p)
		return NULL;
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->wanted, NULL);
	p->dirfd = dirfd;
	/* Signals stay with the threads that handle them. */
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	int rc = pthread_create(&p->maker, NULL, make_files, p);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc != 0) {
		pthread_cond_destroy(&p->wanted);
		pthread_mutex_destroy(&p->mu);
		free(p);
		return NULL;
	}
	return p;
}

int tmp_pool_take(struct tmp_pool *p)
{
	int fd = -1;

	pthread_mutex_lock(&p->mu);
	if (p->n)
		fd = p->fds[--p->n];
	if (p->n < TMP_POOL_FILES / 2 && !p->failed)
		pthread_cond_signal(&p->wanted);
	pthread_mutex_unlock(&p->mu);
	return fd;
}

void tmp_pool_stop(struct tmp_pool *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->mu);
	p->stop = true;
	pthread_cond_signal(&p->wanted);
	pthread_mutex_unlock(&p->mu);
	pthread_join(p->maker, NULL);
	for (unsigned i = 0; i < p->n; i++)
		close(p->fds[i]);
	pthread_cond_destroy(&p->wanted);
	pthread_mutex_destroy(&p->mu);
	free(p);
}
