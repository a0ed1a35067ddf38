/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

#include "store/tmp_pool.h"

struct tmp_pool {
	pthread_mutex_t mu;
	pthread_cond_t wanted;     /* the maker waits here while the pool is full enough */
	int fds[TMP_POOL_FILES];
	uint64_t pages[TMP_POOL_FILES]; /* bytes allocated for each */
	unsigned n;                /* ready files: fds[0..n) */
	_Atomic uint64_t size;     /* the object size last asked for */
	bool stop;
	bool failed;               /* the file system makes none: the maker ended */
	int dirfd;
	pthread_t maker;
};

static uint64_t whole_pages(uint64_t n)
{
	return (n + 4095) & ~(uint64_t)4095;
}

/* A new file, with pages for size bytes where that is small and they can
 * be had (else none: writing allocates them); -errno. */
static int make_file(int dirfd, uint64_t size, uint64_t *pages)
{
	int fd = openat(dirfd, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0400);

	*pages = 0;
	if (fd < 0)
		return -errno;
	*pages = whole_pages(size);
	if (*pages > TMP_POOL_PREALLOC_MAX ||
	    (*pages && fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, (off_t)*pages) < 0))
		*pages = 0;
	return fd;
}

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
			uint64_t pages = 0;
			int fd = make_file(p->dirfd, atomic_load(&p->size), &pages);
			int e = -fd;
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
			p->pages[p->n] = pages;
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

int tmp_pool_take(struct tmp_pool *p, uint64_t size)
{
	int fd = -1;
	uint64_t pages = 0, need = whole_pages(size);

	atomic_store(&p->size, size);
	pthread_mutex_lock(&p->mu);
	if (p->n) {
		fd = p->fds[--p->n];
		pages = p->pages[p->n];
	}
	if (p->n < TMP_POOL_FILES / 2 && !p->failed)
		pthread_cond_signal(&p->wanted);
	pthread_mutex_unlock(&p->mu);
	/* No pages beyond what the object will hold: they would stay with it. */
	if (fd >= 0 && pages > need &&
	    fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)need,
		      (off_t)(pages - need)) < 0) {
		close(fd);
		return -1; /* the caller makes one */
	}
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
