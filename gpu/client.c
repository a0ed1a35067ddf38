/* libartfs: the engine side of ARTFS_IOC_ATTACH (see artfs/client.h). */
#include "autoconf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <jansson.h>

#include "artfs/client.h"
#include "checkpoint.h"
#include "client_gpu.h"

#define MANIFEST_MAX (1u << 30)

struct artfs_weights {
	int fd;
	int device;
	uint32_t slab_count;
	void *slabs[ARTFS_SLABS_MAX];
	size_t count;
	struct artfs_tensor *tensors;
	char *strings;            /* names and dtypes */
};

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
static int load_manifest(struct artfs_weights *w, const char *mount, const char *wv, int rank,
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
		    (uint32_t)slab >= w->slab_count || off < 0 || size < 0) {
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

int artfs_weights_attach(const char *mount, const char *wv, int rank,
			 const struct artfs_fingerprint *expect, struct artfs_weights **out,
			 char *err, size_t errlen)
{
	char path[4096];
	struct artfs_attach a;
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
	memset(&a, 0, sizeof(a));
	a.abi = ARTFS_ABI_VERSION;
	a.expect = *expect;
	if (ioctl(w->fd, ARTFS_IOC_ATTACH, &a) < 0) {
		rc = -errno;
		snprintf(err, errlen, "%s: attach: %s", path, strerror(errno));
		goto fail;
	}
	if (a.slab_count < 1 || a.slab_count > ARTFS_SLABS_MAX) {
		rc = -EIO;
		snprintf(err, errlen, "%s: attach returned %u slabs", path, a.slab_count);
		goto fail;
	}
	w->device = client_gpu_current();
	for (uint32_t i = 0; i < a.slab_count; i++) {
		char why[192];
		rc = client_gpu_open(a.slabs[i].ipc_handle, &w->slabs[i], why, sizeof(why));
		if (rc < 0) {
			snprintf(err, errlen, "%s: %s", path, why);
			goto fail;
		}
		w->slab_count = i + 1;
	}
	rc = load_manifest(w, mount, wv, rank, err, errlen);
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
	for (uint32_t i = 0; i < w->slab_count; i++)
		client_gpu_close(w->slabs[i]);
	if (w->fd >= 0)
		close(w->fd);
	free(w->tensors);
	free(w->strings);
	free(w);
}
