/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "remote/redis.h"

/* An output buffer larger than this (a big value) is freed once sent. */
#define OUT_KEEP (1u << 20)
#define IN_CHUNK (128u << 10)
/* hiredis's parser moves what it holds to the front after each reply, so
 * it is fed this much at a time: many small replies in one read cost
 * little, not the square of the read. */
#define FEED_MAX (16u << 10)

struct redis_conn {
	redisContext *ctx;   /* the socket (non-blocking) and the reply parser */
	char *out;
	size_t out_len, out_off, out_cap;
	char *in;            /* received, fed to the parser from in_off */
	size_t in_len, in_off;
	uint64_t sent, received;
	char error[160];
};

int64_t redis_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static redisReplyObjectFunctions bounded;
static void *(*create_array)(const redisReadTask *, int);
static pthread_once_t bounded_once = PTHREAD_ONCE_INIT;

static void *bounded_array(const redisReadTask *task, int elements)
{
	return elements > (int)REDIS_REPLY_ELEMENTS_MAX ? NULL : create_array(task, elements);
}

static void bounded_init(void)
{
	redisReader *r = redisReaderCreate(); /* hiredis's own functions, to wrap */

	if (!r)
		return;
	bounded = *r->fn;
	create_array = bounded.createArray;
	bounded.createArray = bounded_array;
	redisReaderFree(r);
}

void redis_reader_bound(redisReader *r)
{
	pthread_once(&bounded_once, bounded_init);
	if (create_array)
		r->fn = &bounded;
}

int redis_poll_ms(int64_t deadline)
{
	int64_t left = deadline - redis_now();
	if (left <= 0)
		return 0;
	left = (left + 999999) / 1000000;
	return left > INT_MAX ? INT_MAX : (int)left;
}

__attribute__((format(printf, 3, 4)))
static int fail(struct redis_conn *c, int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(c->error, sizeof(c->error), fmt, ap);
	va_end(ap);
	return err;
}

int redis_conn_fd(const struct redis_conn *c)
{
	return c->ctx->fd;
}

bool redis_conn_has_output(const struct redis_conn *c)
{
	return c->out_off < c->out_len;
}

const char *redis_conn_error(const struct redis_conn *c)
{
	return c->error;
}

void redis_conn_take_bytes(struct redis_conn *c, uint64_t *sent, uint64_t *received)
{
	*sent = c->sent;
	*received = c->received;
	c->sent = c->received = 0;
}

static int reserve(struct redis_conn *c, size_t need)
{
	if (c->out_off == c->out_len)
		c->out_off = c->out_len = 0;
	if (need > SIZE_MAX - c->out_len)
		return -ENOMEM;
	if (c->out_len + need <= c->out_cap)
		return 0;
	size_t cap = c->out_cap ? c->out_cap : 4096;
	while (cap < c->out_len + need)
		cap = cap > SIZE_MAX / 2 ? c->out_len + need : cap * 2;
	char *out = realloc(c->out, cap);
	if (!out)
		return -ENOMEM;
	c->out = out;
	c->out_cap = cap;
	return 0;
}

int redis_conn_append(struct redis_conn *c, int argc, const char *const *argv, const size_t *lens)
{
	size_t need = 16;
	for (int i = 0; i < argc; i++) {
		if (lens[i] > SIZE_MAX / 2)
			return -ENOMEM;
		need += 24 + lens[i] + 2;
		if (need > SIZE_MAX / 2)
			return -ENOMEM;
	}
	if (reserve(c, need) < 0)
		return -ENOMEM;
	char *p = c->out + c->out_len;
	p += sprintf(p, "*%d\r\n", argc);
	for (int i = 0; i < argc; i++) {
		p += sprintf(p, "$%zu\r\n", lens[i]);
		if (lens[i])   /* an empty value may come as NULL */
			memcpy(p, argv[i], lens[i]);
		p += lens[i];
		*p++ = '\r';
		*p++ = '\n';
	}
	c->out_len = (size_t)(p - c->out);
	return 0;
}

int redis_conn_send(struct redis_conn *c)
{
	while (c->out_off < c->out_len) {
		ssize_t n = send(c->ctx->fd, c->out + c->out_off, c->out_len - c->out_off,
				 MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return 0;
			return fail(c, -EIO, "send: %s", strerror(errno));
		}
		c->out_off += (size_t)n;
		c->sent += (uint64_t)n;
	}
	c->out_off = c->out_len = 0;
	if (c->out_cap > OUT_KEEP) {
		free(c->out);
		c->out = NULL;
		c->out_cap = 0;
	}
	return 0;
}

int redis_conn_receive(struct redis_conn *c)
{
	if (c->in_off < c->in_len)
		return 0;   /* not parsed yet */
	for (;;) {
		ssize_t n = recv(c->ctx->fd, c->in, IN_CHUNK, 0);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return 0;
			return fail(c, -EIO, "recv: %s", strerror(errno));
		}
		if (n == 0)
			return fail(c, -EIO, "%s", "connection closed by the server");
		c->received += (uint64_t)n;
		c->in_off = 0;
		c->in_len = (size_t)n;
		return 0;
	}
}

int redis_conn_reply(struct redis_conn *c, redisReply **reply)
{
	void *r = NULL;

	*reply = NULL;
	for (;;) {
		if (redisReaderGetReply(c->ctx->reader, &r) != REDIS_OK)
			return fail(c, -EIO, "protocol error: %s", c->ctx->reader->errstr);
		if (r || c->in_off == c->in_len)
			break;
		size_t n = c->in_len - c->in_off < FEED_MAX ? c->in_len - c->in_off : FEED_MAX;
		if (redisReaderFeed(c->ctx->reader, c->in + c->in_off, n) != REDIS_OK)
			return fail(c, -EIO, "reply parser: %s", c->ctx->reader->errstr);
		c->in_off += n;
	}
	*reply = r;
	return 0;
}

int redis_conn_call(struct redis_conn *c, int64_t deadline, int argc, const char *const *argv,
		    const size_t *lens, redisReply **reply)
{
	int rc = redis_conn_append(c, argc, argv, lens);
	if (rc < 0)
		return fail(c, rc, "%s", "out of memory");
	for (;;) {
		if ((rc = redis_conn_reply(c, reply)) < 0 || *reply)
			return rc;
		struct pollfd p = {
			.fd = c->ctx->fd,
			.events = POLLIN | (redis_conn_has_output(c) ? POLLOUT : 0),
		};
		int ms = redis_poll_ms(deadline);
		if (ms == 0)
			return fail(c, -ETIMEDOUT, "%s", "no reply in time");
		int n = poll(&p, 1, ms);
		if (n < 0 && errno != EINTR)
			return fail(c, -EIO, "poll: %s", strerror(errno));
		if (n <= 0)
			continue;
		if ((p.revents & POLLOUT) && (rc = redis_conn_send(c)) < 0)
			return rc;
		if ((p.revents & (POLLIN | POLLERR | POLLHUP)) && (rc = redis_conn_receive(c)) < 0)
			return rc;
	}
}

void redis_conn_close(struct redis_conn *c)
{
	if (!c)
		return;
	redisFree(c->ctx);
	free(c->out);
	free(c->in);
	free(c);
}

static int wait_connected(struct redis_conn *c, int64_t deadline)
{
	for (;;) {
		struct pollfd p = { .fd = c->ctx->fd, .events = POLLOUT };
		int ms = redis_poll_ms(deadline);
		if (ms == 0)
			return fail(c, -ETIMEDOUT, "%s", "connect timed out");
		int n = poll(&p, 1, ms);
		if (n < 0 && errno != EINTR)
			return fail(c, -EIO, "poll: %s", strerror(errno));
		if (n > 0)
			break;
	}
	int soerr = 0;
	socklen_t len = sizeof(soerr);
	if (getsockopt(c->ctx->fd, SOL_SOCKET, SO_ERROR, &soerr, &len) < 0)
		soerr = errno;
	if (soerr)
		return fail(c, -EIO, "connect: %s", strerror(soerr));
	return 0;
}

int redis_conn_open(const char *host, int port, const char *password, int64_t deadline,
		    struct redis_conn **out, char *err, size_t errlen)
{
	struct redis_conn *c = calloc(1, sizeof(*c));
	int rc;

	if (!c || !(c->in = malloc(IN_CHUNK)) || !(c->ctx = redisConnectNonBlock(host, port))) {
		snprintf(err, errlen, "out of memory");
		redis_conn_close(c);
		return -ENOMEM;
	}
	if (c->ctx->err) {
		rc = fail(c, -EIO, "connect: %s", c->ctx->errstr);
		goto failed;
	}
	redis_reader_bound(c->ctx->reader);
	if ((rc = wait_connected(c, deadline)) < 0)
		goto failed;
	redisEnableKeepAlive(c->ctx);
	if (password) {
		const char *argv[] = { "AUTH", password };
		size_t lens[] = { 4, strlen(password) };
		redisReply *reply;
		if ((rc = redis_conn_call(c, deadline, 2, argv, lens, &reply)) < 0)
			goto failed;
		if (reply->type == REDIS_REPLY_ERROR) {
			rc = fail(c, -EACCES, "AUTH refused: %s", reply->str);
			freeReplyObject(reply);
			goto failed;
		}
		freeReplyObject(reply);
	}
	*out = c;
	return 0;
failed:
	snprintf(err, errlen, "%s", c->error);
	redis_conn_close(c);
	return rc;
}
