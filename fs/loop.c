/* SPDX-License-Identifier: Apache-2.0 */
/* The request loop: one thread at a time reads requests (the leader) and
 * answers them itself. On few cores a FUSE round trip costs mostly the
 * wake-up of whoever takes the request, and libfuse's multi-threaded loop
 * wakes an idle thread for every one; here the thread that answered one
 * request reads the next. A request that may take long (verifying a large
 * object, a materialized request, a large write, a command) first hands the
 * reading to another thread (fs_hand_off), then runs where it was read, on
 * the buffer it was read into: nothing is copied, and the other thread's
 * wake-up happens while this one works. A thread that handed off waits,
 * once its request is answered, until it is wanted to lead again.
 *
 * Signals go to the thread that called fs_loop, which only waits for the
 * end: the others block them. The leader waits for a request in poll(2),
 * on /dev/fuse (non-blocking) and on an eventfd that fs_loop writes at the
 * end; the others finish the request they run, if any, and leave. */
#include "autoconf.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <linux/fuse.h>
#include <unistd.h>

#include "fs/loop.h"
#include "lib/log.h"
#include "lib/parallel.h"
#include "restart/held.h"
#include "state/ids.h"

static struct {
	pthread_mutex_t mu;
	pthread_cond_t cv;          /* a follower waits here to lead */
	bool leader;                /* a thread reads, or is about to */
	_Atomic bool stop;
	int rc;                     /* why the session ended: 0 or -errno */
	unsigned idle, threads, max;
	pthread_t *ids;
	struct fuse_buf *bufs;      /* each thread's request buffer */
	struct fuse_session *se;
	sem_t ended;                /* posted when the session ends */
	int64_t spin_ns;            /* see receive(); 0: none */
	_Atomic unsigned slow;      /* requests running that handed the reading off */
	int end_fd;                 /* an eventfd, readable once the loop ends */
	struct held *held;          /* where each thread notes the request it serves */
	_Atomic bool drained;       /* fs_loop_drain ended it */
} pool = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };

static _Thread_local bool leading;

#define LEAD_SPIN_NS 50000   /* see receive() */
#define LEAD_SPIN_SLOW_NS 2000000 /* the longest it asks while a slow request runs */

static void *serve_thread_main(void *arg);

/* Under pool.mu: one more thread, which leads at once if none does. */
static bool spawn(void)
{
	unsigned k = pool.threads;

	if (k >= pool.max || atomic_load(&pool.stop))
		return false; /* after stop, fs_loop has counted the threads to join */
	if (pthread_create(&pool.ids[k], NULL, serve_thread_main, (void *)(uintptr_t)k) != 0)
		return false;
	pool.threads++;
	return true;
}

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The next request (n > 0), or the end (0 or -errno). With CPUs to spare
 * the leader keeps asking for LEAD_SPIN_NS after the last one before it
 * sleeps in poll(2), and while a slow request runs (up to
 * LEAD_SPIN_SLOW_NS), for LEAD_SPIN_NS after it ends: a client's next
 * request mostly comes within that (an fsync after its write, the read of
 * a batch's results), and then needs no wake-up, which costs more than the
 * round trip itself on a virtual machine. A long request (a weight load)
 * does not keep a CPU spinning. */
static int receive(struct fuse_buf *buf)
{
	int64_t start = pool.spin_ns ? now_ns() : 0, until = start + pool.spin_ns;

	for (;;) {
		if (atomic_load_explicit(&pool.stop, memory_order_relaxed))
			return 0; /* drained: no request is read after the stop */
		int n = fuse_session_receive_buf(pool.se, buf);
		if (n != -EAGAIN)
			return n;
		if (start) {
			int64_t now = now_ns();
			if (atomic_load_explicit(&pool.slow, memory_order_relaxed) &&
			    now - start < LEAD_SPIN_SLOW_NS)
				until = now + pool.spin_ns;
			if (now < until)
				continue;
		}
		struct pollfd p[2] = { { .fd = fuse_session_fd(pool.se), .events = POLLIN },
				       { .fd = pool.end_fd, .events = POLLIN } };
		if (poll(p, 2, -1) < 0 && errno != EINTR)
			return -errno;
		if (atomic_load(&pool.stop))
			return 0;
	}
}

/* Notes in the held memory the request this thread serves (its unique and
 * opcode; n 0: none): what a daemon that dies leaves unanswered. */
static void note(struct held_inflight *f, const struct fuse_buf *buf, int n)
{
	struct fuse_in_header in;

	if (!f)
		return;
	if (n < (int)sizeof(in)) {
		atomic_store_explicit(&f->unique, 0, memory_order_release);
		return;
	}
	memcpy(&in, buf->mem, sizeof(in));
	atomic_store_explicit(&f->opcode, in.opcode, memory_order_relaxed);
	atomic_store_explicit(&f->unique, in.unique, memory_order_release);
}

/* With resend=0 (HELD_NO_RESEND), a request the kernel sent again (bit 63
 * of its unique: one a dead daemon had read) is answered EIO here, and
 * logged with its opcode and node: true. False: serve it. */
static bool fail_resent(const struct held *held, const void *req, size_t len)
{
	struct fuse_in_header in;

	if (!(held->hdr->flags & HELD_NO_RESEND) || len < sizeof(in))
		return false;
	memcpy(&in, req, sizeof(in));
	if (!(in.unique >> 63))
		return false;
	struct fuse_out_header out = { .len = sizeof(out), .error = -EIO, .unique = in.unique };
	bool sent = write(fuse_session_fd(pool.se), &out, sizeof(out)) == (ssize_t)sizeof(out);
	log_warn("takeover: request %llu (opcode %u, node %llu) was read by the daemon that "
		 "died; resend=0: %s", (unsigned long long)(in.unique & ~(1ull << 63)), in.opcode,
		 (unsigned long long)in.nodeid, sent ? "answered EIO" : "cannot answer it EIO");
	return true;
}

/* Reads and answers requests until this thread hands the reading off:
 * 0, or the session ended: -errno, 1 when it ended cleanly. */
static int lead(struct fuse_buf *buf)
{
	struct held_inflight *f = pool.held ? held_inflight(pool.held, (unsigned)(buf - pool.bufs))
					    : NULL;

	while (leading) {
		if (atomic_load(&pool.stop) || fuse_session_exited(pool.se))
			return 1;
		int n = receive(buf);
		if (n == -EINTR)
			continue;
		if (n <= 0)
			return n < 0 && n != -ENODEV ? n : 1;
		note(f, buf, n);
		/* FUSE_NOTIFY_RESEND marks what it sends again with bit 63. */
		uint64_t unique = n >= (int)sizeof(struct fuse_in_header)
					  ? ((const struct fuse_in_header *)buf->mem)->unique : 0;
		bool resent = unique >> 63;
		ids_request_note(unique, resent);
		if (!(resent && pool.held && fail_resent(pool.held, buf->mem, (size_t)n)))
			fuse_session_process_buf(pool.se, buf);
		ids_request_note(0, false);
		note(f, buf, 0);
		if (!leading) /* it was slow and handed off: it ended now */
			atomic_fetch_sub(&pool.slow, 1);
	}
	return 0;
}

static void *serve_thread_main(void *arg)
{
	struct fuse_buf *buf = &pool.bufs[(uintptr_t)arg];

	pthread_mutex_lock(&pool.mu);
	for (;;) {
		while (pool.leader && !atomic_load(&pool.stop)) {
			pool.idle++;
			pthread_cond_wait(&pool.cv, &pool.mu);
			pool.idle--;
		}
		if (atomic_load(&pool.stop))
			break;
		pool.leader = true;
		pthread_mutex_unlock(&pool.mu);
		leading = true;
		int rc = lead(buf);
		pthread_mutex_lock(&pool.mu);
		if (rc) { /* the session ended */
			if (!atomic_load(&pool.stop)) {
				pool.rc = rc < 0 ? rc : 0;
				atomic_store(&pool.stop, true);
				pthread_cond_broadcast(&pool.cv);
				sem_post(&pool.ended);
			}
			break;
		}
	}
	pthread_mutex_unlock(&pool.mu);
	return NULL;
}

void fs_hand_off(void)
{
	if (!leading)
		return; /* -s (libfuse's own loop), or handed off already */
	leading = false;
	atomic_fetch_add(&pool.slow, 1);
	pthread_mutex_lock(&pool.mu);
	pool.leader = false;
	/* With no thread to spare, nobody reads until a request ends: the
	 * thread that ends it leads again. */
	if (pool.idle)
		pthread_cond_signal(&pool.cv);
	else
		spawn();
	pthread_mutex_unlock(&pool.mu);
}

void fs_loop_drain(void)
{
	pthread_mutex_lock(&pool.mu);
	if (!atomic_load(&pool.stop)) {
		atomic_store(&pool.drained, true);
		atomic_store(&pool.stop, true);
		pthread_cond_broadcast(&pool.cv);
		sem_post(&pool.ended);
	}
	pthread_mutex_unlock(&pool.mu);
}

bool fs_loop_drained(void)
{
	return atomic_load(&pool.drained);
}

int fs_loop(struct fuse_session *se, unsigned max_threads, struct held *held)
{
	sigset_t all, old;
	bool started;

	pool.max = max_threads ? max_threads : 1;
	if (pool.max > HELD_INFLIGHT)
		pool.max = HELD_INFLIGHT; /* each thread notes its request in a slot of its own */
	pool.ids = calloc(pool.max, sizeof(*pool.ids));
	pool.bufs = calloc(pool.max, sizeof(*pool.bufs));
	if (!pool.ids || !pool.bufs || sem_init(&pool.ended, 0, 0) != 0) {
		free(pool.ids);
		free(pool.bufs);
		return -ENOMEM;
	}
	pool.se = se;
	pool.rc = 0;
	pool.held = held;
	pool.spin_ns = parallel_wait_awake() ? LEAD_SPIN_NS : 0; /* else the CPU is wanted */
	int fd = fuse_session_fd(se), fl = fcntl(fd, F_GETFL);
	pool.end_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 || pool.end_fd < 0) {
		int rc = -errno;
		if (pool.end_fd >= 0)
			close(pool.end_fd);
		sem_destroy(&pool.ended);
		free(pool.ids);
		free(pool.bufs);
		return rc;
	}
	pool.leader = false;
	atomic_store(&pool.drained, false);
	atomic_store(&pool.stop, false);
	atomic_store(&pool.slow, 0);
	/* Threads inherit the mask: signals reach only this one. */
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	pthread_mutex_lock(&pool.mu);
	started = spawn();
	pthread_mutex_unlock(&pool.mu);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	/* A signal ends the wait (EINTR) after libfuse's handler marked the
	 * session exited; one that came just before the wait is seen within
	 * a second. */
	while (started && !fuse_session_exited(se)) {
		struct timespec until;
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_sec += 1;
		if (sem_timedwait(&pool.ended, &until) == 0)
			break;
	}
	pthread_mutex_lock(&pool.mu);
	atomic_store(&pool.stop, true);
	pthread_cond_broadcast(&pool.cv);
	unsigned n = pool.threads;
	pthread_mutex_unlock(&pool.mu);
	/* The leader's poll returns; the others see stop. */
	uint64_t one = 1;
	if (write(pool.end_fd, &one, sizeof(one)) < 0)
		log_err("cannot end the request loop: %s", strerror(errno));
	for (unsigned i = 0; i < n; i++)
		pthread_join(pool.ids[i], NULL);
	for (unsigned i = 0; i < pool.max; i++)
		free(pool.bufs[i].mem);
	free(pool.bufs);
	free(pool.ids);
	pool.bufs = NULL;
	pool.ids = NULL;
	pool.threads = 0;
	sem_destroy(&pool.ended);
	close(pool.end_fd);
	fuse_session_reset(se);
	return started ? pool.rc : -EAGAIN;
}
