/* SPDX-License-Identifier: Apache-2.0 */
/* libartfs in place (DESIGN.md §4.3, flip in place): an attachment whose
 * slabs lie in a range of addresses that stays, and its flip to another
 * version of the same layout, so that every tensor pointer and every CUDA
 * graph captured on them stays valid. The range bookkeeping is range.c. */
#include "autoconf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "artfs/client.h"
#include "gpu/client/client_i.h"

static bool layout_known(const uint8_t layout[ARTFS_LAYOUT_SIZE])
{
	for (int i = 0; i < ARTFS_LAYOUT_SIZE; i++)
		if (layout[i])
			return true;
	return false;
}

static void close_all(int *fds, int n)
{
	for (int i = 0; i < n; i++)
		close(fds[i]);
}

int artfs_weights_attach_at(const char *mount, const char *wv, int rank,
			    const struct artfs_fingerprint *expect, void *base, size_t len,
			    struct artfs_weights **out, char *err, size_t errlen)
{
	const struct range_driver *d = client_gpu_range_driver();
	char path[4096];
	int fds[ARTFS_SLABS_MAX];
	int rc;

	struct artfs_weights *w = calloc(1, sizeof(*w));
	if (!w || !(w->mount = strdup(mount))) {
		free(w);
		return -ENOMEM;
	}
	w->in_place = true;
	w->rank = rank;
	snprintf(path, sizeof(path), "%s/%s/weights/rank%d", mount, wv, rank);
	w->fd = open(path, O_RDONLY | O_CLOEXEC);
	if (w->fd < 0) {
		rc = -errno;
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		artfs_weights_detach(w);
		return rc;
	}
	rc = client_attach_fetch(w->fd, mount, path, expect, NULL, fds, w->slab_size, w->layout, err,
				 errlen);
	if (rc < 0) {
		artfs_weights_detach(w);
		return rc;
	}
	uint32_t count = (uint32_t)rc;
	w->device = client_gpu_current();
	char why[256];
	rc = range_open(&w->range, d, (uint64_t)(uintptr_t)base, len, w->slab_size, count, why, sizeof(why));
	if (rc == 0)
		rc = range_map(&w->range, d, fds, w->slab_size, count, why, sizeof(why));
	close_all(fds, (int)count); /* the mappings keep the memory */
	if (rc < 0) {
		snprintf(err, errlen, "%s: %s", path, why);
		artfs_weights_detach(w);
		return rc;
	}
	w->slab_count = count;
	for (uint32_t i = 0; i < count; i++)
		w->slabs[i] = (void *)(uintptr_t)w->range.at[i];
	rc = client_load_manifest(w, mount, wv, rank, err, errlen);
	if (rc < 0) {
		artfs_weights_detach(w);
		return rc;
	}
	*out = w;
	return 0;
}

int artfs_weights_flip(struct artfs_weights *w, const char *wv,
		       const struct artfs_fingerprint *expect, char *err, size_t errlen)
{
	const struct range_driver *d = client_gpu_range_driver();
	uint64_t sizes[ARTFS_SLABS_MAX];
	uint8_t layout[ARTFS_LAYOUT_SIZE];
	int fds[ARTFS_SLABS_MAX];
	char path[4096];

	snprintf(path, sizeof(path), "%s/%s/weights/rank%d", w->mount ? w->mount : "", wv, w->rank);
	if (!w->in_place) {
		snprintf(err, errlen, "%s: the weights in use were not attached in place "
			 "(artfs_weights_attach_at): bind them anew instead", path);
		return -EINVAL;
	}
	if (!layout_known(w->layout)) {
		snprintf(err, errlen, "%s: the daemon said no layout of the weights in place (a daemon "
			 "before flips in place): bind them anew instead", path);
		return -EXDEV;
	}
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		int rc = -errno;
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return rc;
	}
	int rc = client_attach_fetch(fd, w->mount, path, expect, w->layout, fds, sizes, layout, err,
				     errlen);
	if (rc < 0) {
		close(fd);
		return rc;
	}
	uint32_t count = (uint32_t)rc;
	char why[384];
	/* Nothing may read the old slabs while they are swapped. */
	rc = client_gpu_sync(why, sizeof(why));
	if (rc == 0)
		rc = range_map(&w->range, d, fds, sizes, count, why, sizeof(why));
	close_all(fds, (int)count);
	if (rc < 0) {
		snprintf(err, errlen, "%s: %s", path, why);
		close(fd);
		return rc;
	}
	/* The old version's attachment ends here: unload frees it now. */
	close(w->fd);
	w->fd = fd;
	return 0;
}

const uint8_t *artfs_weights_layout(const struct artfs_weights *w)
{
	return w->layout;
}
