/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <stdint.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "lib/log.h"
#include "weights/socket.h"

#define BACKLOG 256

/* ---- the log: a flood of clients writes a few lines a second -------------------------- */

#define LOG_PER_SECOND 5

static struct {
	pthread_mutex_t mu;
	int64_t second;       /* CLOCK_MONOTONIC second of the lines counted */
	unsigned lines;       /* logged in that second */
	uint64_t suppressed;  /* not logged since the last line that said so */
} alog = { .mu = PTHREAD_MUTEX_INITIALIZER };

static int64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Says how many lines were left out, once their second is over. */
static void alog_flush(void)
{
	int64_t now = mono_ms() / 1000;
	uint64_t left = 0;

	pthread_mutex_lock(&alog.mu);
	if (now != alog.second && alog.suppressed) {
		left = alog.suppressed;
		alog.suppressed = 0;
	}
	pthread_mutex_unlock(&alog.mu);
	if (left)
		log_warn("attach socket: %llu more lines about its clients were not logged "
			 "(at most %d a second)", (unsigned long long)left, LOG_PER_SECOND);
}

static bool alog_pending(void)
{
	pthread_mutex_lock(&alog.mu);
	bool any = alog.suppressed != 0;
	pthread_mutex_unlock(&alog.mu);
	return any;
}

/* What clients cause: any local user may connect, so at most
 * LOG_PER_SECOND lines a second (165,690 lines in 6 s without). */
static void __attribute__((format(printf, 1, 2))) alog_warn(const char *fmt, ...)
{
	int64_t now = mono_ms() / 1000;
	char line[512];
	va_list ap;

	alog_flush();
	pthread_mutex_lock(&alog.mu);
	if (now != alog.second) {
		alog.second = now;
		alog.lines = 0;
	}
	bool say = alog.lines < LOG_PER_SECOND;
	if (say)
		alog.lines++;
	else
		alog.suppressed++;
	pthread_mutex_unlock(&alog.mu);
	if (!say)
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	log_warn("%s", line);
}

/* ---- closing what a client may have passed ----------------------------------------------- */

/* A client's connection may hold descriptors it passed (SCM_RIGHTS) that
 * were never received: closing it drops them, and the last close of one
 * can block (a TCP socket with SO_LINGER and unsent data: its linger
 * time; a file of a stalled FUSE mount). Such connections are closed on a
 * thread of their own that nothing waits for, not on the attach thread
 * (which an upgrade joins); a process's exit ends that thread's wait. */
#define CLOSER_MAX 1024

static struct {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool started;
	unsigned head, n;
	int fd[CLOSER_MAX];
	uint64_t kept;        /* left open: the queue was full */
} closer = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };

static void *closer_main(void *arg)
{
	(void)arg;
	setpriority(PRIO_PROCESS, (id_t)gettid(), 19);
	pthread_mutex_lock(&closer.mu);
	for (;;) {
		while (closer.n == 0)
			pthread_cond_wait(&closer.cv, &closer.mu);
		int fd = closer.fd[closer.head];
		closer.head = (closer.head + 1) % CLOSER_MAX;
		closer.n--;
		pthread_mutex_unlock(&closer.mu);
		close(fd);
		pthread_mutex_lock(&closer.mu);
	}
	return NULL;
}

/* fd is closed by the closer thread. Where it cannot take it (its queue
 * full behind closes that block, no thread), fd stays open until the
 * process ends (its exit does not wait for a linger) rather than block
 * the attach thread. */
static void closer_give(int fd)
{
	pthread_mutex_lock(&closer.mu);
	if (!closer.started) {
		pthread_t th;
		pthread_attr_t a;
		pthread_attr_init(&a);
		pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
		closer.started = pthread_create(&th, &a, closer_main, NULL) == 0;
		pthread_attr_destroy(&a);
	}
	bool taken = closer.started && closer.n < CLOSER_MAX;
	if (taken) {
		closer.fd[(closer.head + closer.n++) % CLOSER_MAX] = fd;
		pthread_cond_signal(&closer.cv);
	} else {
		closer.kept++;
	}
	uint64_t kept = closer.kept;
	pthread_mutex_unlock(&closer.mu);
	if (!taken)
		alog_warn("attach socket: a connection that holds descriptors its client passed "
			  "is left open (%llu so far): the closes before it block",
			  (unsigned long long)kept);
}

/* The next message of conn, received (or only peeked at) without taking
 * any descriptor it carries: SO_PASSCRED (set at accept) gives every
 * message credentials, so that no credentials is the end of the stream
 * and a message that carried descriptors is MSG_CTRUNC. Its length, -errno,
 * or -EBADMSG for a message with descriptors (dropped with the
 * connection); *eof when none is left. */
static ssize_t recv_clean(int conn, void *buf, size_t len, int flags, bool *eof)
{
	struct iovec iov = { .iov_base = buf, .iov_len = len };
	union {
		char buf[CMSG_SPACE(sizeof(struct ucred))];
		struct cmsghdr align;
	} u;
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
			      .msg_controllen = sizeof(u.buf) };
	ssize_t n;

	while ((n = recvmsg(conn, &msg, flags | MSG_DONTWAIT | MSG_TRUNC | MSG_CMSG_CLOEXEC)) < 0 &&
	       errno == EINTR)
		;
	*eof = false;
	if (n < 0)
		return -errno;
	if (msg.msg_flags & MSG_CTRUNC)
		return -EBADMSG;
	*eof = n == 0 && msg.msg_controllen == 0;
	return n;
}

/* Messages a connection may still hold when it is closed: a few are
 * received to see that none carries descriptors; past those the closer
 * thread closes it. */
#define DRAIN_MAX 8

/* Ends a client's connection without a close that could block (see
 * closer): once no more can come (SHUT_RD), a connection that holds no
 * passed descriptor is closed here, any other by the closer thread. */
static void conn_release(int conn)
{
	uint8_t b[64];
	bool eof;

	if (shutdown(conn, SHUT_RD) < 0 && errno != ENOTCONN) {
		closer_give(conn);
		return;
	}
	for (int i = 0; i < DRAIN_MAX; i++) {
		ssize_t n = recv_clean(conn, b, sizeof(b), MSG_PEEK, &eof);
		if (n < 0 && n != -EAGAIN)
			break;
		if (eof || n == -EAGAIN) {
			close(conn);
			return;
		}
		if (recv_clean(conn, b, sizeof(b), 0, &eof) < 0) /* the clean one peeked at */
			break;
	}
	closer_give(conn);
}

int attach_request_parse(const void *buf, size_t len, struct artfs_slabs_request *req)
{
	if (len != sizeof(*req))
		return -EPROTO;
	memcpy(req, buf, sizeof(*req));
	if (req->magic != ARTFS_SLABS_MAGIC || req->abi != ARTFS_ABI_VERSION)
		return -EPROTO;
	return 0;
}

static int send_reply(int conn, const struct artfs_slabs_reply *r, const int *fds, uint32_t n)
{
	struct iovec iov = { .iov_base = (void *)r, .iov_len = sizeof(*r) };
	union {
		char buf[CMSG_SPACE(sizeof(int) * ARTFS_SLABS_MAX)];
		struct cmsghdr align;
	} u;
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };

	if (n) {
		memset(&u, 0, sizeof(u));
		msg.msg_control = u.buf;
		msg.msg_controllen = CMSG_SPACE(sizeof(int) * n);
		struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * n);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * n);
	}
	for (;;) {
		ssize_t sent = sendmsg(conn, &msg, MSG_NOSIGNAL);
		if (sent == (ssize_t)sizeof(*r))
			return 0;
		if (sent < 0 && errno == EINTR)
			continue;
		return sent < 0 ? -errno : -EPROTO;
	}
}

int attach_serve_conn(int conn, attach_resolve_fn resolve, void *ctx, int timeout_ms)
{
	/* One byte more than a request: a longer message is not one. */
	uint8_t buf[sizeof(struct artfs_slabs_request) + 1];
	struct artfs_slabs_request req;
	struct artfs_slabs_reply reply;
	struct attach_slabs slabs;
	struct pollfd p = { .fd = conn, .events = POLLIN };
	int r;

	while ((r = poll(&p, 1, timeout_ms)) < 0 && errno == EINTR)
		;
	if (r <= 0)
		return r == 0 ? -ETIMEDOUT : -errno;
	bool eof;
	/* A request that carries descriptors is never received (see closer). */
	ssize_t n = recv_clean(conn, buf, sizeof(buf), MSG_PEEK, &eof);
	if (n == -EBADMSG)
		return -EBADMSG;
	if (n >= 0)
		n = recv_clean(conn, buf, sizeof(buf), 0, &eof);
	if (n < 0)
		return (int)n;
	if (eof)
		return -ECONNRESET;
	memset(&reply, 0, sizeof(reply));
	reply.magic = ARTFS_SLABS_MAGIC;
	memset(&slabs, 0, sizeof(slabs));
	int rc = attach_request_parse(buf, (size_t)n, &req);
	if (rc == 0)
		rc = resolve(ctx, req.token, &slabs);
	if (rc == 0 && (slabs.count == 0 || slabs.count > ARTFS_SLABS_MAX))
		rc = -EIO;
	if (rc < 0) {
		for (uint32_t i = 0; i < slabs.count && i < ARTFS_SLABS_MAX; i++)
			close(slabs.fd[i]);
		reply.error = rc;
		return send_reply(conn, &reply, NULL, 0);
	}
	reply.slab_count = slabs.count;
	memcpy(reply.slab_size, slabs.size, sizeof(uint64_t) * slabs.count);
	rc = send_reply(conn, &reply, slabs.fd, slabs.count);
	for (uint32_t i = 0; i < slabs.count; i++)
		close(slabs.fd[i]);
	return rc;
}

/* The socket made at path, or -errno with the step that failed in *step;
 * no formatting, no allocation: a forked child calls it. */
static int socket_try(const struct sockaddr_un *a, const char **step)
{
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

	*step = "socket";
	if (fd < 0)
		return -errno;
	*step = "unlink";
	if (unlink(a->sun_path) < 0 && errno != ENOENT)
		goto fail;
	*step = "bind";
	if (bind(fd, (const struct sockaddr *)a, sizeof(*a)) < 0)
		goto fail;
	*step = "listen";
	if (listen(fd, BACKLOG) < 0)
		goto fail;
	return fd;
fail:;
	int e = errno;
	close(fd);
	return -e;
}

static int socket_address(const char *path, struct sockaddr_un *a, char *err, size_t errlen)
{
	memset(a, 0, sizeof(*a));
	a->sun_family = AF_UNIX;
	if (strlen(path) >= sizeof(a->sun_path)) {
		snprintf(err, errlen, "%s: longer than a socket's path may be", path);
		return -ENAMETOOLONG;
	}
	strcpy(a->sun_path, path);
	return 0;
}

int attach_socket_make(const char *path, char *err, size_t errlen)
{
	struct sockaddr_un a;
	const char *step;
	int rc = socket_address(path, &a, err, errlen);

	if (rc < 0)
		return rc;
	rc = socket_try(&a, &step);
	if (rc < 0)
		snprintf(err, errlen, "%s %s: %s", step, path, strerror(-rc));
	return rc;
}

/* What the child of attach_socket_make_apart sends: the result and, on
 * failure, which step failed (an index into steps[]). */
struct apart_answer {
	int32_t rc;
	int32_t step;
};

static const char *const steps[] = { "socket", "unlink", "bind", "listen" };

static _Noreturn void apart_child(int out, const struct sockaddr_un *a, pid_t parent)
{
	const char *step = steps[0];
	struct apart_answer ans = { 0, 0 };
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(int))];
	} ctl;
	struct iovec iov = { .iov_base = &ans, .iov_len = sizeof(ans) };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1 };

	/* The daemon dies while this child waits on the mount: it is killed
	 * too, once a next daemon has answered what it asked. */
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != parent)
		_exit(1);
	int fd = socket_try(a, &step);
	if (fd < 0) {
		ans.rc = fd;
		for (int i = 0; i < (int)(sizeof(steps) / sizeof(steps[0])); i++)
			if (strcmp(step, steps[i]) == 0)
				ans.step = i;
	} else {
		memset(&ctl, 0, sizeof(ctl));
		m.msg_control = ctl.b;
		m.msg_controllen = sizeof(ctl.b);
		struct cmsghdr *c = CMSG_FIRSTHDR(&m);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &fd, sizeof(int));
	}
	_exit(sendmsg(out, &m, MSG_NOSIGNAL) == (ssize_t)sizeof(ans) ? 0 : 1);
}

/* The child's answer: the descriptor, or -errno with why in err. */
static int apart_receive(int in, const char *path, char *err, size_t errlen)
{
	struct apart_answer ans;
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(int))];
	} ctl;
	struct iovec iov = { .iov_base = &ans, .iov_len = sizeof(ans) };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b,
			    .msg_controllen = sizeof(ctl.b) };
	ssize_t n;

	do
		n = recvmsg(in, &m, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	struct cmsghdr *c = n == (ssize_t)sizeof(ans) ? CMSG_FIRSTHDR(&m) : NULL;
	if (c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
	    c->cmsg_len == CMSG_LEN(sizeof(int)) && ans.rc == 0) {
		int fd;
		memcpy(&fd, CMSG_DATA(c), sizeof(int));
		return fd;
	}
	if (n == (ssize_t)sizeof(ans) && ans.rc < 0 && ans.step >= 0 &&
	    ans.step < (int)(sizeof(steps) / sizeof(steps[0]))) {
		snprintf(err, errlen, "%s %s: %s", steps[ans.step], path, strerror(-ans.rc));
		return ans.rc;
	}
	snprintf(err, errlen, "the process that binds %s did not answer", path);
	return -EIO;
}

int attach_socket_make_apart(const char *path, char *err, size_t errlen)
{
	struct sockaddr_un a;
	int sv[2], status;
	int rc = socket_address(path, &a, err, errlen);

	if (rc < 0)
		return rc;
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
		snprintf(err, errlen, "socketpair: %s", strerror(errno));
		return -errno;
	}
	pid_t parent = getpid(), pid = fork();
	if (pid == 0) {
		close(sv[0]);
		apart_child(sv[1], &a, parent);
	}
	close(sv[1]);
	if (pid < 0) {
		int e = errno;
		close(sv[0]);
		snprintf(err, errlen, "fork: %s", strerror(e));
		return -e;
	}
	rc = apart_receive(sv[0], path, err, errlen);
	close(sv[0]);
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	return rc;
}

struct attach_server {
	pthread_t thread;
	int listen_fd;
	int stop[2];
	attach_resolve_fn resolve;
	void *ctx;
};

/* Connections whose request has not come yet: each is served when its
 * request is there, so that a client that connects and says nothing holds
 * up no other; one is dropped after its REQUEST_WAIT_MS, and the oldest
 * when PENDING_MAX wait. */
#define PENDING_MAX 64
#define REQUEST_WAIT_MS 1000

struct pending {
	int fd[PENDING_MAX];
	int64_t until_ms[PENDING_MAX];
	unsigned n;
};

static void pending_drop(struct pending *q, unsigned i)
{
	conn_release(q->fd[i]);
	q->n--;
	memmove(&q->fd[i], &q->fd[i + 1], (q->n - i) * sizeof(q->fd[0]));
	memmove(&q->until_ms[i], &q->until_ms[i + 1], (q->n - i) * sizeof(q->until_ms[0]));
}

static void accept_one(struct attach_server *s, struct pending *q)
{
	int conn = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);

	if (conn < 0) {
		if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED)
			alog_warn("attach socket: accept: %s", strerror(errno));
		return;
	}
	int on = 1;
	if (setsockopt(conn, SOL_SOCKET, SO_PASSCRED, &on, sizeof(on)) < 0) {
		alog_warn("attach socket: SO_PASSCRED: %s", strerror(errno));
		closer_give(conn); /* it could hold descriptors that recv_clean cannot see */
		return;
	}
	if (q->n == PENDING_MAX) {
		alog_warn("attach socket: %d clients connected without a request; the oldest is dropped",
			  PENDING_MAX);
		pending_drop(q, 0);
	}
	q->fd[q->n] = conn;
	q->until_ms[q->n++] = mono_ms() + REQUEST_WAIT_MS;
}

static void *serve_main(void *arg)
{
	struct attach_server *s = arg;
	struct pending q = { .n = 0 };
	struct pollfd p[2 + PENDING_MAX];

	for (;;) {
		int64_t now = mono_ms(), wait = -1;
		p[0] = (struct pollfd){ .fd = s->listen_fd, .events = POLLIN };
		p[1] = (struct pollfd){ .fd = s->stop[0], .events = POLLIN };
		for (unsigned i = 0; i < q.n; i++) {
			p[2 + i] = (struct pollfd){ .fd = q.fd[i], .events = POLLIN };
			int64_t left = q.until_ms[i] > now ? q.until_ms[i] - now : 0;
			wait = wait < 0 || left < wait ? left : wait;
		}
		if (alog_pending() && (wait < 0 || wait > 1000))
			wait = 1000; /* how many lines were left out is said within a second */
		if (poll(p, 2 + q.n, (int)wait) < 0) {
			if (errno == EINTR)
				continue;
			log_err("attach socket: poll: %s", strerror(errno));
			break;
		}
		if (p[1].revents)
			break;
		alog_flush();
		now = mono_ms();
		for (unsigned i = q.n; i-- > 0;) { /* from the end: drops move the rest down */
			if (!p[2 + i].revents && q.until_ms[i] > now)
				continue;
			int rc = p[2 + i].revents ? attach_serve_conn(q.fd[i], s->resolve, s->ctx, 0)
						  : -ETIMEDOUT;
			if (rc == -EBADMSG)
				alog_warn("attach socket: a client passed descriptors; its connection is "
					  "dropped unread");
			else if (rc < 0 && rc != -EPIPE && rc != -ECONNRESET)
				alog_warn("attach socket: a client's request: %s", strerror(-rc));
			pending_drop(&q, i);
		}
		if (p[0].revents & POLLIN)
			accept_one(s, &q);
	}
	while (q.n)
		pending_drop(&q, q.n - 1);
	return NULL;
}

struct attach_server *attach_server_start(int listen_fd, attach_resolve_fn resolve, void *ctx)
{
	struct attach_server *s = calloc(1, sizeof(*s));

	if (!s)
		return NULL;
	s->listen_fd = listen_fd;
	s->resolve = resolve;
	s->ctx = ctx;
	/* The listening socket is shared with the holder and the next daemon:
	 * accept must not block here when another took the connection. */
	int fl = fcntl(listen_fd, F_GETFL);
	if (fl < 0 || fcntl(listen_fd, F_SETFL, fl | O_NONBLOCK) < 0 ||
	    pipe2(s->stop, O_CLOEXEC) < 0) {
		free(s);
		return NULL;
	}
	if (pthread_create(&s->thread, NULL, serve_main, s) != 0) {
		close(s->stop[0]);
		close(s->stop[1]);
		free(s);
		return NULL;
	}
	return s;
}

void attach_server_stop(struct attach_server *s)
{
	if (!s)
		return;
	if (write(s->stop[1], "s", 1) != 1)
		log_warn("attach socket: cannot stop its thread: %s", strerror(errno));
	pthread_join(s->thread, NULL);
	close(s->stop[0]);
	close(s->stop[1]);
	free(s);
}
