/* SPDX-License-Identifier: Apache-2.0 */
/* libartfs: the engine side of ARTFS_IOC_ATTACH (see artfs/client.h). */
#include "autoconf.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "artfs/client.h"
#include "format/checkpoint.h"
#include "gpu/client/client_i.h"

#define MANIFEST_MAX (1u << 30)
/* How long an attach tries again when the daemon that gave the token went
 * before the slabs were fetched (a restart: the next one serves). */
#define ATTACH_RETRY_MS 10000
#define FETCH_TIMEOUT_MS 10000

int artfs_fingerprint(const char *checkpoint_dir, int tp_size, int tp_rank, int device,
		      struct artfs_fingerprint *fp, char *err, size_t errlen)
{
	struct checkpoint c;

	memset(fp, 0, sizeof(*fp));
	int rc = checkpoint_open(checkpoint_dir, &c, err, errlen);
	if (rc < 0)
		return rc;
	snprintf(fp->architecture, sizeof(fp->architecture), "%s", c.architecture);
	snprintf(fp->quant_method, sizeof(fp->quant_method), "%s", c.quant_method);
	memcpy(fp->quant_config_sha256, c.quant_config_sha256, 32);
	memcpy(fp->revision, c.revision, 32);
	snprintf(fp->dtypes, sizeof(fp->dtypes), "%s", c.dtypes);
	checkpoint_close(&c);
	fp->tp_size = (uint32_t)tp_size;
	fp->tp_rank = (uint32_t)tp_rank;
	return client_gpu_describe(device, &fp->cc_major, &fp->cc_minor, &fp->driver_version, err,
				   errlen);
}

static char *read_all(const char *path, size_t *len, char *err, size_t errlen)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return NULL;
	}
	size_t cap = 1 << 20, n = 0;
	char *buf = malloc(cap + 1);
	for (;;) {
		if (!buf)
			break;
		if (n == cap) {
			if (cap >= MANIFEST_MAX) {
				free(buf);
				buf = NULL;
				snprintf(err, errlen, "%s: larger than %u bytes", path, MANIFEST_MAX);
				break;
			}
			char *grown = realloc(buf, cap * 2 + 1);
			if (!grown) {
				free(buf);
				buf = NULL;
				break;
			}
			buf = grown;
			cap *= 2;
		}
		ssize_t r = read(fd, buf + n, cap - n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			snprintf(err, errlen, "%s: %s", path, strerror(errno));
			free(buf);
			buf = NULL;
			break;
		}
		if (r == 0)
			break;
		n += (size_t)r;
	}
	close(fd);
	if (buf) {
		buf[n] = '\0';
		*len = n;
	}
	return buf;
}

/* The tensors of this rank from manifest.json, bounded by the slabs. */
int client_load_manifest(struct artfs_weights *w, const char *mount, const char *wv, int rank,
			 char *err, size_t errlen)
{
	char path[4096];
	size_t len;

	snprintf(path, sizeof(path), "%s/%s/weights/manifest.json", mount, wv);
	char *text = read_all(path, &len, err, errlen);
	if (!text)
		return -EIO;
	json_error_t jerr;
	json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
	free(text);
	if (!root) {
		snprintf(err, errlen, "manifest.json: %s", jerr.text);
		return -EIO;
	}
	int rc = -EIO;
	json_t *r = json_array_get(json_object_get(root, "ranks"), (size_t)rank);
	json_t *tensors = json_object_get(r, "tensors");
	if (!json_is_object(tensors)) {
		snprintf(err, errlen, "manifest.json: no tensors for rank %d", rank);
		goto out;
	}
	size_t n = json_object_size(tensors), strings = 0;
	const char *name;
	json_t *t;
	json_object_foreach(tensors, name, t)
		strings += strlen(name) + 1 + strlen(json_string_value(json_object_get(t, "dtype")) ?: "") + 1;
	w->tensors = calloc(n ? n : 1, sizeof(*w->tensors));
	w->strings = malloc(strings + 1);
	if (!w->tensors || !w->strings) {
		rc = -ENOMEM;
		goto out;
	}
	char *s = w->strings;
	json_object_foreach(tensors, name, t) {
		struct artfs_tensor *at = &w->tensors[w->count];
		const char *dtype = json_string_value(json_object_get(t, "dtype"));
		json_t *shape = json_object_get(t, "shape");
		json_int_t slab = json_integer_value(json_object_get(t, "slab"));
		json_int_t off = json_integer_value(json_object_get(t, "offset"));
		json_int_t size = json_integer_value(json_object_get(t, "size"));
		if (!dtype || !json_is_array(shape) || json_array_size(shape) > 8 || slab < 0 ||
		    (uint32_t)slab >= w->slab_count || off < 0 || size < 0 ||
		    (uint64_t)off > w->slab_size[slab] || (uint64_t)size > w->slab_size[slab] - (uint64_t)off) {
			snprintf(err, errlen, "manifest.json: tensor \"%.100s\" is malformed", name);
			goto out;
		}
		at->name = strcpy(s, name);
		s += strlen(name) + 1;
		at->dtype = strcpy(s, dtype);
		s += strlen(dtype) + 1;
		at->ndim = (int)json_array_size(shape);
		for (int d = 0; d < at->ndim; d++)
			at->shape[d] = json_integer_value(json_array_get(shape, (size_t)d));
		at->data = (char *)w->slabs[slab] + off;
		at->size = (uint64_t)size;
		w->count++;
	}
	rc = 0;
out:
	json_decref(root);
	return rc;
}

/* The descriptors a token grants, from <mount>/.artfs/attach: 0 with
 * fds[0..*count) (new), or -errno (why in err). */
static int fetch_slabs(const char *mount, const uint8_t token[ARTFS_ATTACH_TOKEN_SIZE],
		       int fds[ARTFS_SLABS_MAX], uint64_t sizes[ARTFS_SLABS_MAX], uint32_t *count,
		       char *err, size_t errlen)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	struct artfs_slabs_request req = { .magic = ARTFS_SLABS_MAGIC, .abi = ARTFS_ABI_VERSION };
	struct artfs_slabs_reply reply;
	union {
		char buf[CMSG_SPACE(sizeof(int) * ARTFS_SLABS_MAX)];
		struct cmsghdr align;
	} u;
	struct iovec iov = { .iov_base = &reply, .iov_len = sizeof(reply) };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
			      .msg_controllen = sizeof(u.buf) };
	int n = snprintf(a.sun_path, sizeof(a.sun_path), "%s/" ARTFS_INFO_DIR "/" ARTFS_ATTACH_SOCKET,
			 mount);

	*count = 0;
	if (n < 0 || (size_t)n >= sizeof(a.sun_path)) {
		snprintf(err, errlen, "%s/" ARTFS_INFO_DIR "/" ARTFS_ATTACH_SOCKET ": path too long for a socket",
			 mount);
		return -ENAMETOOLONG;
	}
	memcpy(req.token, token, ARTFS_ATTACH_TOKEN_SIZE);
	int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof(a)) < 0 ||
	    send(s, &req, sizeof(req), MSG_NOSIGNAL) != (ssize_t)sizeof(req)) {
		int e = errno;
		snprintf(err, errlen, "%s: %s", a.sun_path, strerror(e));
		if (s >= 0)
			close(s);
		return -e;
	}
	struct pollfd p = { .fd = s, .events = POLLIN };
	int r;
	while ((r = poll(&p, 1, FETCH_TIMEOUT_MS)) < 0 && errno == EINTR)
		;
	ssize_t got = r > 0 ? recvmsg(s, &msg, MSG_CMSG_CLOEXEC) : -1;
	int e = r == 0 ? ETIMEDOUT : errno;
	close(s);
	uint32_t nfds = 0;
	for (struct cmsghdr *c = got > 0 ? CMSG_FIRSTHDR(&msg) : NULL; c; c = CMSG_NXTHDR(&msg, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < k; i++) {
			int fd;
			memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
			if (nfds < ARTFS_SLABS_MAX)
				fds[nfds++] = fd;
			else
				close(fd);
		}
	}
	int rc = 0;
	if (got < 0)
		rc = -e, snprintf(err, errlen, "%s: %s", a.sun_path, strerror(e));
	else if (got == 0)
		rc = -ECONNRESET, snprintf(err, errlen, "%s: the daemon went before it replied", a.sun_path);
	else if (got != (ssize_t)sizeof(reply) || reply.magic != ARTFS_SLABS_MAGIC ||
		 (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)))
		rc = -EPROTO, snprintf(err, errlen, "%s: not a reply of this ABI", a.sun_path);
	else if (reply.error < 0)
		rc = reply.error, snprintf(err, errlen, "%s: %s", a.sun_path, strerror(-reply.error));
	else if (reply.slab_count < 1 || reply.slab_count > ARTFS_SLABS_MAX || nfds != reply.slab_count)
		rc = -EPROTO, snprintf(err, errlen, "%s: %u slabs with %u descriptors", a.sun_path,
				      reply.slab_count, nfds);
	if (rc < 0) {
		for (uint32_t i = 0; i < nfds; i++)
			close(fds[i]);
		return rc;
	}
	memcpy(sizes, reply.slab_size, sizeof(uint64_t) * reply.slab_count);
	*count = reply.slab_count;
	return 0;
}

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int client_attach_fetch(int fd, const char *mount, const char *path,
			const struct artfs_fingerprint *expect, const uint8_t *want_layout,
			int fds[ARTFS_SLABS_MAX], uint64_t slab_size[ARTFS_SLABS_MAX],
			uint8_t layout[ARTFS_LAYOUT_SIZE], char *err, size_t errlen)
{
	struct artfs_attach a;
	uint64_t sizes[ARTFS_SLABS_MAX];
	uint32_t count;
	int64_t until = now_ms() + ATTACH_RETRY_MS;

	for (;;) {
		memset(&a, 0, sizeof(a));
		a.abi = ARTFS_ABI_VERSION;
		a.expect = *expect;
		if (ioctl(fd, ARTFS_IOC_ATTACH, &a) < 0) {
			int rc = -errno;
			snprintf(err, errlen, "%s: attach: %s", path, strerror(errno));
			return rc;
		}
		if (a.slab_count < 1 || a.slab_count > ARTFS_SLABS_MAX) {
			snprintf(err, errlen, "%s: attach returned %u slabs", path, a.slab_count);
			return -EIO;
		}
		memcpy(layout, a.layout, ARTFS_LAYOUT_SIZE);
		if (want_layout && memcmp(want_layout, a.layout, ARTFS_LAYOUT_SIZE) != 0) {
			char was[17], is[17];
			for (int i = 0; i < 8; i++) {
				snprintf(was + 2 * i, 3, "%02x", want_layout[i]);
				snprintf(is + 2 * i, 3, "%02x", a.layout[i]);
			}
			snprintf(err, errlen, "%s: its layout %s... is not the layout in place %s... (other "
				 "tensor names, dtypes or shapes): no flip in place; bind it anew instead",
				 path, is, was);
			return -EXDEV;
		}
		int rc = fetch_slabs(mount, a.token, fds, sizes, &count, err, errlen);
		if (rc == 0 && count == a.slab_count &&
		    memcmp(sizes, a.slab_size, sizeof(uint64_t) * count) == 0) {
			memcpy(slab_size, sizes, sizeof(uint64_t) * count);
			return (int)count;
		}
		if (rc == 0) {
			for (uint32_t i = 0; i < count; i++)
				close(fds[i]);
			snprintf(err, errlen, "%s: the slabs fetched are not those the attach named", path);
			return -EPROTO;
		}
		bool again = rc == -ENOENT || rc == -ECONNRESET || rc == -ECONNREFUSED || rc == -EPIPE;
		if (!again || now_ms() > until)
			return rc;
		usleep(2000);
	}
}

int artfs_weights_attach(const char *mount, const char *wv, int rank,
			 const struct artfs_fingerprint *expect, struct artfs_weights **out,
			 char *err, size_t errlen)
{
	char path[4096];
	int fds[ARTFS_SLABS_MAX];
	int rc;

	struct artfs_weights *w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	snprintf(path, sizeof(path), "%s/%s/weights/rank%d", mount, wv, rank);
	w->fd = open(path, O_RDONLY | O_CLOEXEC);
	if (w->fd < 0) {
		rc = -errno;
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		free(w);
		return rc;
	}
	rc = client_attach_fetch(w->fd, mount, path, expect, NULL, fds, w->slab_size, w->layout, err,
				 errlen);
	if (rc < 0)
		goto fail;
	uint32_t count = (uint32_t)rc;
	w->device = client_gpu_current();
	rc = 0;
	for (uint32_t i = 0; i < count; i++) {
		char why[192];
		if (rc == 0)
			rc = client_gpu_import(fds[i], w->slab_size[i], &w->slabs[i], why, sizeof(why));
		close(fds[i]); /* the mapping keeps the memory */
		if (rc < 0)
			snprintf(err, errlen, "%s: %s", path, why);
		else
			w->slab_count = i + 1;
	}
	if (rc < 0)
		goto fail;
	rc = client_load_manifest(w, mount, wv, rank, err, errlen);
	if (rc < 0)
		goto fail;
	*out = w;
	return 0;
fail:
	artfs_weights_detach(w);
	return rc;
}

size_t artfs_weights_count(const struct artfs_weights *w)
{
	return w->count;
}

const struct artfs_tensor *artfs_weights_tensor(const struct artfs_weights *w, size_t i)
{
	return i < w->count ? &w->tensors[i] : NULL;
}

const struct artfs_tensor *artfs_weights_find(const struct artfs_weights *w, const char *name)
{
	for (size_t i = 0; i < w->count; i++)
		if (strcmp(w->tensors[i].name, name) == 0)
			return &w->tensors[i];
	return NULL;
}

int artfs_weights_fd(const struct artfs_weights *w)
{
	return w->fd;
}

void artfs_weights_detach(struct artfs_weights *w)
{
	if (!w)
		return;
	if (w->in_place)
		range_close(&w->range, client_gpu_range_driver());
	else
		for (uint32_t i = 0; i < w->slab_count; i++)
			client_gpu_unmap(w->slabs[i], w->slab_size[i]);
	if (w->fd >= 0)
		close(w->fd);
	free(w->tensors);
	free(w->strings);
	free(w->mount);
	free(w);
}
