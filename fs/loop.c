/* The request loop. One thread reads requests and answers the quick ones at
 * once: on few cores a FUSE round trip costs mostly the wake-up of whoever
 * takes the request, and libfuse's multi-threaded loop wakes an idle thread
 * for every one. Requests that may take long (verifying a large object, a
 * materialized request, a large write, a command) are handed to workers,
 * which reply on their own. */
#include "autoconf.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "loop.h"

struct job {
	struct job *next;
	void (*fn)(void *arg);
	void *arg;
};

static struct {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct job *head, **tail;
	bool stop;
	unsigned idle, threads, max;
	pthread_t *ids;
} pool = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };

static void *worker(void *unused)
{
	(void)unused;
	pthread_mutex_lock(&pool.mu);
	for (;;) {
		while (!pool.head && !pool.stop) {
			pool.idle++;
			pthread_cond_wait(&pool.cv, &pool.mu);
			pool.idle--;
		}
		if (!pool.head)
			break;
		struct job *j = pool.head;
		pool.head = j->next;
		if (!pool.head)
			pool.tail = &pool.head;
		pthread_mutex_unlock(&pool.mu);
		j->fn(j->arg);
		free(j);
		pthread_mutex_lock(&pool.mu);
	}
	pthread_mutex_unlock(&pool.mu);
	return NULL;
}

int fs_defer(void (*fn)(void *arg), void *arg)
{
	struct job *j;

	if (!pool.ids)
		return -EAGAIN; /* -s: libfuse's own loop, no workers; run in place */
	j = malloc(sizeof(*j));
	if (!j)
		return -ENOMEM;
	j->next = NULL;
	j->fn = fn;
	j->arg = arg;
	pthread_mutex_lock(&pool.mu);
	/* A new worker when none waits: a slow job never queues behind another. */
	if (!pool.idle && pool.threads < pool.max &&
	    pthread_create(&pool.ids[pool.threads], NULL, worker, NULL) == 0)
		pool.threads++;
	if (!pool.threads) { /* no worker could start: the caller runs it */
		pthread_mutex_unlock(&pool.mu);
		free(j);
		return -EAGAIN;
	}
	*pool.tail = j;
	pool.tail = &j->next;
	pthread_cond_signal(&pool.cv);
	pthread_mutex_unlock(&pool.mu);
	return 0;
}

int fs_loop(struct fuse_session *se, unsigned max_workers)
{
	struct fuse_buf buf;
	int rc = 0;

	memset(&buf, 0, sizeof(buf));
	pthread_mutex_lock(&pool.mu);
	pool.tail = &pool.head;
	pool.max = max_workers ? max_workers : 1;
	pool.ids = calloc(pool.max, sizeof(*pool.ids));
	pthread_mutex_unlock(&pool.mu);
	if (!pool.ids)
		return -ENOMEM;
	while (!fuse_session_exited(se)) {
		int n = fuse_session_receive_buf(se, &buf);
		if (n == -EINTR)
			continue;
		if (n <= 0) {
			rc = n;
			break;
		}
		fuse_session_process_buf(se, &buf);
	}
	free(buf.mem);
	pthread_mutex_lock(&pool.mu);
	pool.stop = true;
	pthread_cond_broadcast(&pool.cv);
	pthread_mutex_unlock(&pool.mu);
	for (unsigned i = 0; i < pool.threads; i++)
		pthread_join(pool.ids[i], NULL);
	pthread_mutex_lock(&pool.mu);
	free(pool.ids);
	pool.ids = NULL;
	pthread_mutex_unlock(&pool.mu);
	fuse_session_reset(se);
	return rc < 0 && rc != -ENODEV ? rc : 0;
}
