/* SPDX-License-Identifier: Apache-2.0 */
/* rank<k>: the open file of an attachment, and its ioctl that checks an
 * engine's request and grants a token for the slabs' descriptors (handed
 * out by the attach socket, socket.c). */
#include "autoconf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>

#include "lib/log.h"
#include "state/grant.h"
#include "weights/socket.h"
#include "weights/weights.h"
#include "weights/weights_i.h"

/* ---- attach ------------------------------------------------------------------ */

static const char *fingerprint_diff(const struct artfs_fingerprint *a,
				    const struct artfs_fingerprint *b)
{
	if (strncmp(a->architecture, b->architecture, sizeof(a->architecture)))
		return "architecture";
	if (strncmp(a->quant_method, b->quant_method, sizeof(a->quant_method)))
		return "quant_method";
	if (memcmp(a->quant_config_sha256, b->quant_config_sha256, 32))
		return "quant_config_sha256";
	if (memcmp(a->revision, b->revision, 32))
		return "revision";
	if (strncmp(a->dtypes, b->dtypes, sizeof(a->dtypes)))
		return "dtypes";
	if (a->tp_size != b->tp_size || a->tp_rank != b->tp_rank)
		return "tensor parallel size or rank";
	if (a->cc_major != b->cc_major || a->cc_minor != b->cc_minor)
		return "compute capability";
	if (a->driver_version != b->driver_version)
		return "driver version";
	return NULL;
}

int weights_attach_check(const struct artfs_attach *req, const struct artfs_fingerprint *loaded,
			 const char **why)
{
	*why = NULL;
	if (req->abi != ARTFS_ABI_VERSION) {
		*why = "abi";
		return -EINVAL;
	}
	if (loaded && (*why = fingerprint_diff(&req->expect, loaded)) != NULL)
		return -ESTALE;
	return 0;
}

/* Whether rank r has a slab of these weights (w->mu): a rank file opened
 * under a GPU-direct claim of more ranks than were then published has none. */
static bool rank_served(const struct weights *w, int r)
{
	return r < w->nranks && r < w->load.nranks && w->granks[r].fd >= 0 &&
	       (!w->gpu_direct || w->ranks[r].published);
}

static int weights_attach(struct tree *t, struct handle *h, const struct artfs_attach *in,
			  struct artfs_attach *out)
{
	struct rank_handle *rh = (struct rank_handle *)h;
	struct weights *w = rh->w;
	struct weights_rank *wr = &w->ranks[rh->rank];
	const char *wv = w->ver->name;
	const char *diff;

	if (weights_attach_check(in, NULL, &diff) < 0) {
		log_warn("attach %s/rank%d: ABI version %u, this daemon speaks %u", wv, rh->rank,
			 in->abi, ARTFS_ABI_VERSION);
		return -EINVAL;
	}
	pthread_mutex_lock(&w->mu);
	enum weights_state state = w->state;
	bool gone = w->unloaded;
	bool served = state == READY && rank_served(w, rh->rank);
	pthread_mutex_unlock(&w->mu);
	if (gone) {
		log_warn("attach %s/rank%d: the weights were unloaded", wv, rh->rank);
		return -ESTALE;
	}
	if (state == LOADING || state == EMPTY)
		return -EAGAIN;
	if (state == FAILED)
		return -EIO;
	if (!served) {
		log_warn("attach %s/rank%d: no such rank in the weights (%d ranks)", wv, rh->rank,
			 w->nranks);
		return -ESTALE;
	}
	if (!weights_quant_allowed(t, &w->ckpt)) {
		log_warn("attach %s/rank%d: quantization \"%s\" is not served zero-copy "
			 "(allow_quant= does not name it)", wv, rh->rank, w->ckpt.quant_method);
		return -EOPNOTSUPP;
	}
	if (weights_attach_check(in, &wr->fp, &diff) < 0) {
		log_warn("attach %s/rank%d: fingerprint mismatch: %s differs from the loaded weights",
			 wv, rh->rank, diff);
		return -ESTALE;
	}
	*out = *in;
	memcpy(out->device_uuid, wr->dev.uuid, 16);
	out->device_index = (uint32_t)wr->device;
	out->slab_count = 1;
	out->total_bytes = wr->total_bytes;
	memset(out->slab_size, 0, sizeof(out->slab_size));
	out->slab_size[0] = w->granks[rh->rank].slab_size;
	memcpy(out->layout, wr->layout, sizeof(out->layout));
	int rc = grants_issue(&t->grants, rh, weights_now_ns(), out->token);
	if (rc < 0)
		log_err("attach %s/rank%d: no token: %s", wv, rh->rank,
			rc == -EBUSY ? "too many attaches at once" : "no random bytes");
	return rc < 0 ? -EAGAIN : 0;
}

/* A grant's use: the descriptors of its rank's slabs (the table locked:
 * the handle cannot go meanwhile). */
struct slabs_ask {
	struct attach_slabs *out;
};

static int slabs_of_grant(void *owner, void *ctx)
{
	struct rank_handle *rh = owner;
	struct weights *w = rh->w;
	struct attach_slabs *out = ((struct slabs_ask *)ctx)->out;
	int rc = 0;

	pthread_mutex_lock(&w->mu);
	if (w->unloaded || w->gpu_freed || !rank_served(w, rh->rank))
		rc = -ESTALE;
	else if ((out->fd[0] = fcntl(w->granks[rh->rank].fd, F_DUPFD_CLOEXEC, 0)) < 0)
		rc = -errno;
	if (rc == 0) {
		out->count = 1;
		out->size[0] = w->granks[rh->rank].slab_size;
	}
	pthread_mutex_unlock(&w->mu);
	return rc;
}

int weights_slabs_of_token(void *ctx, const uint8_t token[ARTFS_ATTACH_TOKEN_SIZE],
			   struct attach_slabs *out)
{
	struct tree *t = ctx;
	struct slabs_ask ask = { .out = out };

	out->count = 0;
	return grants_take(&t->grants, token, weights_now_ns(), slabs_of_grant, &ask);
}

static int rank_read(struct tree *t, struct handle *h, uint64_t off, size_t size,
		     const void **data, size_t *len)
{
	static const char nothing[1];

	*data = nothing; /* the attachment's content is the ioctl */
	*len = 0;
	return 0;
}

static void rank_release(struct tree *t, struct handle *h)
{
	struct rank_handle *rh = (struct rank_handle *)h;
	struct weights *w = rh->w;

	grants_drop_owner(&t->grants, rh);
	pthread_mutex_lock(&w->mu);
	w->attached--;
	w->ranks[rh->rank].attached--;
	weights_release_gpu_locked(w);
	pthread_mutex_unlock(&w->mu);
	node_unref(&w->node, 1);
	free(rh);
}

static int rank_ioctl(struct tree *t, struct handle *h, unsigned int cmd, const void *in,
		      size_t in_len, void *out, size_t out_len)
{
	struct artfs_attach req;
	struct rank_handle *rh = (struct rank_handle *)h;

	if (cmd == ARTFS_IOC_ATTACH_V1) {
		log_warn("attach %s/rank%d: an engine of attach ABI 1 (CUDA IPC handles, artfs 0.1); "
			 "this daemon serves ABI %d (descriptors of CUDA VMM slabs): rebuild the engine "
			 "against this libartfs or use this Python client", rh->w->ver->name, rh->rank,
			 ARTFS_ABI_VERSION);
		return -EINVAL;
	}
	if (cmd != ARTFS_IOC_ATTACH)
		return -ENOTTY;
	if (in_len < sizeof(req) || out_len < sizeof(req))
		return -EINVAL;
	memcpy(&req, in, sizeof(req));
	return weights_attach(t, h, &req, out);
}

/* rank<k> never becomes ready: an engine can wait in poll() and learn that
 * the daemon died (POLLERR). */
static unsigned rank_poll(struct tree *t, struct handle *h)
{
	(void)t, (void)h;
	return 0;
}

const struct handle_ops rank_ops = {
	.kind = "rank",
	.held_kind = HANDLE_RANK,
	.read = rank_read,
	.ioctl = rank_ioctl,
	.poll = rank_poll,
	.release = rank_release,
	.release_slow = true, /* the last one may free GPU memory */
};
