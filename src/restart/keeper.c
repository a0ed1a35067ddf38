/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "restart/keeper.h"

/* Descriptors one holder keeps at most: a GPU slab each, for every loaded
 * version and rank. */
#define KEEPER_STORE_MAX 65536

struct keeper_msg keeper_msg_make(enum keeper_type type, const char *tag, int32_t value)
{
	struct keeper_msg m;

	memset(&m, 0, sizeof(m));
	m.type = type;
	m.value = value;
	if (tag)
		snprintf(m.tag, sizeof(m.tag), "%s", tag);
	return m;
}

int keeper_send(int sock, const struct keeper_msg *m, int fd)
{
	struct iovec iov = { .iov_base = (void *)m, .iov_len = sizeof(*m) };
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };

	if (fd >= 0) {
		memset(&u, 0, sizeof(u));
		msg.msg_control = u.buf;
		msg.msg_controllen = sizeof(u.buf);
		struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &fd, sizeof(int));
	}
	for (;;) {
		ssize_t n = sendmsg(sock, &msg, MSG_NOSIGNAL);
		if (n == (ssize_t)sizeof(*m))
			return 0;
		if (n < 0 && errno == EINTR)
			continue;
		return n < 0 ? (errno == EPIPE ? -ECONNRESET : -errno) : -EPROTO;
	}
}

/* The descriptors that came with msg: the first in *fd (when wanted),
 * every other one closed. */
static void take_fds(struct msghdr *msg, int *fd)
{
	for (struct cmsghdr *c = CMSG_FIRSTHDR(msg); c; c = CMSG_NXTHDR(msg, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < n; i++) {
			int got;
			memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
			if (fd && *fd < 0)
				*fd = got;
			else
				close(got);
		}
	}
}

int keeper_recv(int sock, struct keeper_msg *m, int *fd, int timeout_ms)
{
	union {
		char buf[CMSG_SPACE(4 * sizeof(int))];
		struct cmsghdr align;
	} u;
	struct iovec iov = { .iov_base = m, .iov_len = sizeof(*m) };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
			      .msg_controllen = sizeof(u.buf) };

	if (fd)
		*fd = -1;
	struct pollfd p = { .fd = sock, .events = POLLIN };
	int r;
	while ((r = poll(&p, 1, timeout_ms)) < 0 && errno == EINTR)
		;
	if (r < 0)
		return -errno;
	if (r == 0)
		return -ETIMEDOUT;
	ssize_t n;
	while ((n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC)) < 0 && errno == EINTR)
		;
	if (n < 0)
		return errno == ECONNRESET ? -ECONNRESET : -errno;
	take_fds(&msg, fd);
	if (n == 0)
		return -ECONNRESET;
	if (n != (ssize_t)sizeof(*m) || (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) ||
	    memchr(m->tag, '\0', sizeof(m->tag)) == NULL) {
		if (fd && *fd >= 0) {
			close(*fd);
			*fd = -1;
		}
		return -EPROTO;
	}
	return 0;
}

/* ---- the holder's store ------------------------------------------------------------- */

struct kept {
	char tag[KEEPER_TAG_MAX];
	int fd;
};

struct keeper_store {
	struct kept *v;
	size_t n, cap;
};

struct keeper_store *keeper_store_new(void)
{
	return calloc(1, sizeof(struct keeper_store));
}

void keeper_store_free(struct keeper_store *s)
{
	if (!s)
		return;
	for (size_t i = 0; i < s->n; i++)
		close(s->v[i].fd);
	free(s->v);
	free(s);
}

static struct kept *find(const struct keeper_store *s, const char *tag)
{
	for (size_t i = 0; i < s->n; i++)
		if (strcmp(s->v[i].tag, tag) == 0)
			return &s->v[i];
	return NULL;
}

int keeper_store_keep(struct keeper_store *s, const char *tag, int fd)
{
	size_t len = strlen(tag);

	if (!len || len >= KEEPER_TAG_MAX)
		return -EINVAL;
	struct kept *k = find(s, tag);
	if (k) {
		close(k->fd);
		k->fd = fd;
		return 0;
	}
	if (s->n == KEEPER_STORE_MAX)
		return -ENOSPC;
	if (s->n == s->cap) {
		size_t cap = s->cap ? s->cap * 2 : 16;
		struct kept *v = realloc(s->v, cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		s->v = v;
		s->cap = cap;
	}
	k = &s->v[s->n++];
	memcpy(k->tag, tag, len + 1);
	k->fd = fd;
	return 0;
}

int keeper_store_get(const struct keeper_store *s, const char *tag)
{
	const struct kept *k = find(s, tag);

	return k ? k->fd : -ENOENT;
}

int keeper_store_drop(struct keeper_store *s, const char *tag, bool prefix)
{
	size_t len = strlen(tag);
	int dropped = 0;

	for (size_t i = 0; i < s->n;) {
		bool match = prefix ? strncmp(s->v[i].tag, tag, len) == 0
				    : strcmp(s->v[i].tag, tag) == 0;
		if (!match) {
			i++;
			continue;
		}
		close(s->v[i].fd);
		s->v[i] = s->v[--s->n];
		dropped++;
	}
	return dropped;
}

int keeper_store_nth(const struct keeper_store *s, const char *prefix, uint32_t index,
		     char tag_out[KEEPER_TAG_MAX])
{
	size_t len = strlen(prefix);

	for (size_t i = 0; i < s->n; i++) {
		if (strncmp(s->v[i].tag, prefix, len) != 0)
			continue;
		if (index-- == 0) {
			memcpy(tag_out, s->v[i].tag, KEEPER_TAG_MAX);
			return s->v[i].fd;
		}
	}
	return -ENOENT;
}

size_t keeper_store_count(const struct keeper_store *s)
{
	return s->n;
}

bool keeper_store_serve(struct keeper_store *s, int sock, const struct keeper_msg *m, int fd)
{
	struct keeper_msg a;

	switch (m->type) {
	case KEEPER_KEEP: {
		int rc = fd < 0 ? -EINVAL : keeper_store_keep(s, m->tag, fd);
		if (rc < 0 && fd >= 0)
			close(fd);
		a = keeper_msg_make(KEEPER_ACK, m->tag, rc);
		keeper_send(sock, &a, -1);
		return true;
	}
	case KEEPER_DROP:
		keeper_store_drop(s, m->tag, m->value == 1);
		a = keeper_msg_make(KEEPER_ACK, m->tag, 0);
		keeper_send(sock, &a, -1);
		return true;
	case KEEPER_FETCH: {
		int got = keeper_store_get(s, m->tag);
		a = keeper_msg_make(KEEPER_FD, m->tag, got < 0 ? got : 0);
		keeper_send(sock, &a, got);
		return true;
	}
	case KEEPER_NEXT: {
		char tag[KEEPER_TAG_MAX];
		int got = m->value < 0 ? -ENOENT : keeper_store_nth(s, m->tag, (uint32_t)m->value, tag);
		a = keeper_msg_make(KEEPER_FD, got < 0 ? m->tag : tag, got < 0 ? got : 0);
		keeper_send(sock, &a, got);
		return true;
	}
	default:
		return false;
	}
}

/* ---- the daemon's side -------------------------------------------------------------- */

/* Sends m and waits for the holder's answer of type want (its tag in
 * tag_out when given: NEXT's answer names another tag than m's). */
static int call_tagged(int link, const struct keeper_msg *m, int fd, enum keeper_type want,
		       int *got, char *tag_out)
{
	struct keeper_msg a;
	int rc = keeper_send(link, m, fd);

	if (rc < 0)
		return rc;
	rc = keeper_recv(link, &a, got, 10000);
	if (rc < 0)
		return rc;
	bool tag_ok = tag_out ? strncmp(a.tag, m->tag, strlen(m->tag)) == 0
			      : strcmp(a.tag, m->tag) == 0;
	if (tag_out)
		memcpy(tag_out, a.tag, KEEPER_TAG_MAX);
	if (a.type != want || !tag_ok) {
		if (got && *got >= 0) {
			close(*got);
			*got = -1;
		}
		return -EPROTO;
	}
	return a.value;
}

static int call(int link, const struct keeper_msg *m, int fd, enum keeper_type want, int *got)
{
	return call_tagged(link, m, fd, want, got, NULL);
}

int keeper_keep(int link, const char *tag, int fd)
{
	struct keeper_msg m = keeper_msg_make(KEEPER_KEEP, tag, 0);

	return call(link, &m, fd, KEEPER_ACK, NULL);
}

int keeper_fetch(int link, const char *tag, int *fd)
{
	struct keeper_msg m = keeper_msg_make(KEEPER_FETCH, tag, 0);
	int rc = call(link, &m, -1, KEEPER_FD, fd);

	if (rc == 0 && *fd < 0)
		rc = -EPROTO;
	if (rc < 0 && *fd >= 0) {
		close(*fd);
		*fd = -1;
	}
	return rc;
}

int keeper_drop(int link, const char *tag, bool prefix)
{
	struct keeper_msg m = keeper_msg_make(KEEPER_DROP, tag, prefix ? 1 : 0);

	return call(link, &m, -1, KEEPER_ACK, NULL);
}

int keeper_next(int link, const char *prefix, uint32_t index, char tag_out[KEEPER_TAG_MAX],
		int *fd)
{
	struct keeper_msg m = keeper_msg_make(KEEPER_NEXT, prefix, (int32_t)index);
	int rc;

	*fd = -1;
	if (index > INT32_MAX)
		return -ENOENT;
	rc = call_tagged(link, &m, -1, KEEPER_FD, fd, tag_out);
	if (rc == 0 && *fd < 0)
		rc = -EPROTO;
	if (rc < 0 && *fd >= 0) {
		close(*fd);
		*fd = -1;
	}
	return rc;
}

/* ---- the daemon's link, for its threads ------------------------------------------------- */

void keeper_link_init(struct keeper_link *k, int fd)
{
	k->fd = fd;
	pthread_mutex_init(&k->mu, NULL);
}

void keeper_link_destroy(struct keeper_link *k)
{
	pthread_mutex_destroy(&k->mu);
}

int keeper_link_keep(struct keeper_link *k, const char *tag, int fd)
{
	if (k->fd < 0)
		return -ENOTCONN;
	pthread_mutex_lock(&k->mu);
	int rc = keeper_keep(k->fd, tag, fd);
	pthread_mutex_unlock(&k->mu);
	return rc;
}

int keeper_link_fetch(struct keeper_link *k, const char *tag, int *fd)
{
	*fd = -1;
	if (k->fd < 0)
		return -ENOTCONN;
	pthread_mutex_lock(&k->mu);
	int rc = keeper_fetch(k->fd, tag, fd);
	pthread_mutex_unlock(&k->mu);
	return rc;
}

int keeper_link_drop(struct keeper_link *k, const char *tag, bool prefix)
{
	if (k->fd < 0)
		return -ENOTCONN;
	pthread_mutex_lock(&k->mu);
	int rc = keeper_drop(k->fd, tag, prefix);
	pthread_mutex_unlock(&k->mu);
	return rc;
}

int keeper_link_next(struct keeper_link *k, const char *prefix, uint32_t index,
		     char tag_out[KEEPER_TAG_MAX], int *fd)
{
	*fd = -1;
	if (k->fd < 0)
		return -ENOTCONN;
	pthread_mutex_lock(&k->mu);
	int rc = keeper_next(k->fd, prefix, index, tag_out, fd);
	pthread_mutex_unlock(&k->mu);
	return rc;
}
