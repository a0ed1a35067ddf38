/* SPDX-License-Identifier: Apache-2.0 */
/* The GPU-direct publish (DESIGN.md §4.3): mkdir <wv>/weights makes empty
 * weights, and each rank written to their .publish is copied GPU to GPU
 * into a slab of its own; the last rank makes them ready. */
#include "autoconf.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/checkpoint.h"
#include "format/key.h"
#include "format/publish_blob.h"
#include "gpu/gpu.h"
#include "lib/log.h"
#include "lib/sha256.h"
#include "weights/weights.h"
#include "weights/weights_i.h"

/* ---- GPU-direct publish (DESIGN.md §4.3) ------------------------------------------- */

/* Frees empty weights that never became their version's. */
static void empty_discard(struct weights *w)
{
	free(w->granks);
	free(w->ckpt.dir);
	free(w);
}

int weights_mkdir(struct tree *t, struct version *v, struct node **out)
{
	struct weights *w = calloc(1, sizeof(*w) + (size_t)RANKS_MAX * sizeof(struct weights_rank));

	if (!w)
		return -ENOMEM;
	w->t = t;
	w->ver = v;
	w->granks = calloc(RANKS_MAX, sizeof(*w->granks));
	w->ckpt.dir = strdup("");
	if (!w->granks || !w->ckpt.dir) {
		empty_discard(w);
		return -ENOMEM;
	}
	for (int r = 0; r < RANKS_MAX; r++)
		w->granks[r].fd = -1; /* no slab yet: 0 would be a descriptor */
	weights_init_nodes(w, RANKS_MAX);
	w->state = EMPTY;
	w->gpu_direct = true;
	w->thread_done = true; /* no load thread */
	w->gpu_freed = true;   /* nothing allocated yet */
	w->load.ranks = w->granks;
	w->started_ns = weights_now_ns();

	pthread_mutex_lock(&t->lock);
	int rc = v->removed ? -ENOENT : v->weights ? -EEXIST : 0;
	if (rc == 0) {
		node_ref(&v->node); /* w->ver's */
		v->weights = w;
		node_ref(&w->dir); /* the caller's */
		*out = &w->dir;
	}
	pthread_mutex_unlock(&t->lock);
	if (rc < 0) {
		pthread_mutex_destroy(&w->mu);
		empty_discard(w);
		return rc;
	}
	weights_all_add(t, w, false);
	log_info("weights %s: empty, waiting for a GPU-direct publish", v->name);
	return 0;
}

struct direct_handle {
	struct handle h;
	struct weights *w;           /* referenced */
	pthread_mutex_t mu;
	uint8_t *buf;
	size_t len, cap;
	bool done, too_long;
	int result;
	char reply[384];
};

static const struct handle_ops direct_ops;

int direct_open(struct tree *t, struct weights *w, int flags, struct handle **h,
			struct open_reply *r)
{
	(void)t;
	if ((flags & O_ACCMODE) == O_RDONLY)
		return -EACCES;
	struct direct_handle *ph = calloc(1, sizeof(*ph));
	if (!ph)
		return -ENOMEM;
	handle_init(&ph->h, &direct_ops);
	pthread_mutex_init(&ph->mu, NULL);
	ph->w = w;
	node_ref(&w->node);
	r->direct_io = true; /* the reply is read with pread(fd, .., 0) after fsync */
	*h = &ph->h;
	return 0;
}

static int direct_write(struct tree *t, struct handle *h, uint64_t off, const void *buf, size_t len,
			 uint64_t owner)
{
	struct direct_handle *ph = (struct direct_handle *)h;
	int rc = (int)len;

	(void)t, (void)owner;
	pthread_mutex_lock(&ph->mu);
	if (ph->done || off != ph->len)
		rc = -EINVAL; /* one blob per open, written in order */
	else if (len > WBLOB_BYTES_MAX - ph->len) {
		ph->too_long = true;
		rc = -EFBIG;
	} else {
		if (ph->len + len > ph->cap) {
			size_t cap = ph->cap ? ph->cap : 64 << 10;
			while (cap < ph->len + len)
				cap *= 2;
			uint8_t *b = realloc(ph->buf, cap);
			if (!b)
				rc = -ENOMEM;
			else {
				ph->buf = b;
				ph->cap = cap;
			}
		}
		if (rc > 0) {
			memcpy(ph->buf + ph->len, buf, len);
			ph->len += len;
		}
	}
	pthread_mutex_unlock(&ph->mu);
	return rc;
}

/* Which tensors are tied: alias[i] is the first tensor with the same
 * handle, offset and size as tensor i (it shares its bytes), or SIZE_MAX. */
static int direct_aliases(const struct wblob *b, size_t *alias)
{
	size_t n = b->ntensors, cap = 1;

	while (cap < 2 * n)
		cap *= 2;
	size_t *tab = malloc(cap * sizeof(*tab)); /* an open table over (handle, offset, size) */
	if (!tab)
		return -ENOMEM;
	for (size_t i = 0; i < cap; i++)
		tab[i] = SIZE_MAX;
	for (size_t i = 0; i < n; i++) {
		const struct wblob_tensor *x = &b->tensors[i];
		uint64_t hsh = (x->src_offset * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)x->handle << 40) ^ x->t.size;
		size_t k = (size_t)(hsh ^ (hsh >> 29)) & (cap - 1);
		alias[i] = SIZE_MAX;
		for (; tab[k] != SIZE_MAX; k = (k + 1) & (cap - 1)) {
			const struct wblob_tensor *y = &b->tensors[tab[k]];
			if (y->handle == x->handle && y->src_offset == x->src_offset && y->t.size == x->t.size) {
				alias[i] = tab[k];
				break;
			}
		}
		if (alias[i] == SIZE_MAX)
			tab[k] = i;
	}
	free(tab);
	return 0;
}

/* Where each tensor goes in the slab: the layout of layout.c (the same as a
 * load of the same tensors); tied tensors share one place and one copy.
 * layout: the digest. */
static int direct_plan(const struct wblob *b, struct gpu_piece *pieces, struct gpu_copy **copies,
			size_t *ncopies, uint64_t *slab_size, uint64_t *bytes, uint8_t layout[32])
{
	size_t n = b->ntensors;
	struct gpu_copy *c = malloc(n * sizeof(*c));
	size_t *alias = malloc(n * sizeof(*alias));
	uint64_t *off = malloc(n * sizeof(*off));
	const struct safetensors_tensor **ts = malloc(n * sizeof(*ts));
	int rc = c && alias && off && ts ? direct_aliases(b, alias) : -ENOMEM;

	for (size_t i = 0; rc == 0 && i < n; i++)
		ts[i] = &b->tensors[i].t;
	if (rc == 0)
		rc = weights_layout_place(ts, alias, n, off, slab_size);
	if (rc == 0)
		rc = weights_layout_digest(ts, off, n, *slab_size, layout);
	*ncopies = 0;
	*bytes = 0;
	for (size_t i = 0; rc == 0 && i < n; i++) {
		const struct wblob_tensor *x = &b->tensors[i];
		pieces[i] = (struct gpu_piece){ .size = x->t.size, .slab_offset = off[i] };
		if (alias[i] != SIZE_MAX)
			continue;
		c[(*ncopies)++] = (struct gpu_copy){ .handle = x->handle, .src_offset = x->src_offset,
						     .size = x->t.size, .slab_offset = off[i] };
		*bytes += x->t.size;
	}
	free(alias);
	free(off);
	free(ts);
	if (rc < 0) {
		free(c);
		return rc;
	}
	*copies = c;
	return 0;
}

/* The fingerprint of a published rank: the revision hashes its tensor table
 * (name, dtype, shape, in blob order); dtypes is the sorted set. */
static void direct_fingerprint(struct weights *w, int r, const struct wblob *b)
{
	struct artfs_fingerprint *fp = &w->ranks[r].fp;
	const struct gpu_device *d = &w->ranks[r].dev;
	struct sha256 s;
	bool seen[SAFETENSORS_DTYPE_COUNT] = { false };

	memset(fp, 0, sizeof(*fp));
	snprintf(fp->architecture, sizeof(fp->architecture), "%s", b->head.architecture);
	snprintf(fp->quant_method, sizeof(fp->quant_method), "%s", b->head.quant_method);
	if (sha256_begin(&s) == 0) {
		for (size_t i = 0; i < b->ntensors; i++) {
			const struct safetensors_tensor *ts = &b->tensors[i].t;
			const char *dn = safetensors_dtype_name(ts->dtype);
			sha256_update(&s, ts->name, strlen(ts->name) + 1);
			sha256_update(&s, dn, strlen(dn) + 1);
			for (unsigned k = 0; k < ts->ndim; k++) {
				uint8_t be[8];
				for (int j = 0; j < 8; j++)
					be[j] = (uint8_t)(ts->shape[k] >> (56 - 8 * j));
				sha256_update(&s, be, 8);
			}
			sha256_update(&s, "\n", 1);
		}
		sha256_end(&s, fp->revision);
	}
	for (size_t i = 0; i < b->ntensors; i++)
		seen[b->tensors[i].t.dtype] = true;
	checkpoint_dtype_list(seen, fp->dtypes, sizeof(fp->dtypes));
	fp->tp_size = b->head.tp_size;
	fp->tp_rank = b->head.rank;
	weights_fingerprint_device(fp, d);
}

/* Takes the blob's tensor table as rank r's own (names copied). */
static int direct_own_table(struct weights_rank *wr, const struct wblob *b,
			    struct gpu_piece *pieces)
{
	size_t nb = 0;

	for (size_t i = 0; i < b->ntensors; i++)
		nb += strlen(b->tensors[i].t.name) + 1;
	wr->own = calloc(b->ntensors, sizeof(*wr->own));
	wr->tensors = calloc(b->ntensors, sizeof(*wr->tensors));
	wr->names = malloc(nb);
	if (!wr->own || !wr->tensors || !wr->names) {
		free(wr->own);
		free(wr->tensors);
		free(wr->names);
		wr->own = NULL;
		wr->tensors = NULL;
		wr->names = NULL;
		return -ENOMEM;
	}
	char *p = wr->names;
	for (size_t i = 0; i < b->ntensors; i++) {
		wr->own[i] = b->tensors[i].t;
		size_t l = strlen(b->tensors[i].t.name) + 1;
		memcpy(p, b->tensors[i].t.name, l);
		wr->own[i].name = p;
		p += l;
		wr->tensors[i] = &wr->own[i];
	}
	wr->pieces = pieces;
	wr->npieces = b->ntensors;
	return 0;
}

/* One rank's publish as it goes: the blob, where its tensors go in the
 * slab, the copy and the GPU it landed on. */
struct direct_job {
	struct wblob b;
	int rank;
	struct gpu_piece *pieces;    /* b.ntensors; the rank's once it is published */
	uint64_t bytes;
	struct gpu_rank dst;
	struct gpu_publish gp;
	struct gpu_device dev;       /* dst's, when dev_known */
	bool dev_known;
	uint8_t layout[32];          /* the slab's layout digest */
};

/* Claims the blob's rank of w for this publish: w waits for it (made by
 * mkdir, not loaded, the rank neither published nor being published) and
 * the blob's tp_size is that of the ranks before it. */
static int direct_claim(struct weights *w, const struct wblob *b, char *err, size_t errlen)
{
	int r = (int)b->head.rank, rc = 0;

	pthread_mutex_lock(&w->mu);
	if (w->unloaded)
		rc = -ENOENT, snprintf(err, errlen, "the weights were unloaded");
	else if (!w->gpu_direct || w->state != EMPTY || w->ranks[r].published || w->ranks[r].publishing)
		rc = -EEXIST, snprintf(err, errlen, "%s", !w->gpu_direct
				       ? "the version already has loaded weights (use a new version)"
				       : "this rank is already published (weights are immutable: use a new version)");
	else if (w->nranks && (uint32_t)w->nranks != b->head.tp_size)
		rc = -EINVAL, snprintf(err, errlen, "tp_size %u, earlier ranks said %d", b->head.tp_size,
				       w->nranks);
	if (rc == 0) {
		w->nranks = (int)b->head.tp_size;
		w->ranks[r].publishing = true;
	}
	pthread_mutex_unlock(&w->mu);
	return rc;
}

/* Plans the rank's slab and copies the blob's tensors into it, GPU to GPU. */
static int direct_copy(struct direct_job *j, char *err, size_t errlen)
{
	struct gpu_copy *copies = NULL;
	size_t ncopies = 0;
	uint64_t slab_size = 0;

	j->pieces = calloc(j->b.ntensors, sizeof(*j->pieces));
	int rc = j->pieces ? direct_plan(&j->b, j->pieces, &copies, &ncopies, &slab_size, &j->bytes,
					   j->layout)
		 : -ENOMEM;
	j->dst = (struct gpu_rank){ .slab_size = slab_size, .fd = -1 };
	j->gp = (struct gpu_publish){
		.handles = j->b.handles, .nhandles = j->b.nhandles, .target_device = j->b.head.target_device,
		.copies = copies, .ncopies = ncopies, .dst = &j->dst,
	};
	memcpy(j->gp.source_uuid, j->b.head.source_uuid, 16);
	if (rc == 0)
		rc = gpu_publish(&j->gp, err, errlen);
	else
		snprintf(err, errlen, "out of memory");
	free(copies);
	if (rc == 0) {
		struct gpu_device devs[RANKS_MAX];
		char e2[128];
		int ndevs = gpu_devices(devs, RANKS_MAX, e2, sizeof(e2));
		const struct gpu_device *d = weights_device_find(devs, ndevs, j->dst.device);
		if (d) {
			j->dev = *d;
			j->dev_known = true;
		}
	}
	return rc;
}

/* w->gpus: the GPUs of the ranks published so far. */
static void list_published_gpus(struct weights *w)
{
	size_t used = 0;

	w->gpus[0] = '\0';
	for (int k = 0; k < w->nranks; k++)
		if (w->ranks[k].published)
			used += (size_t)snprintf(w->gpus + used, sizeof(w->gpus) - used, "%s%d",
						 used ? "," : "", w->ranks[k].device);
}

/* Every rank is published: w has its manifest and is ready. */
static int direct_ready_locked(struct weights *w, const struct artfs_publish_header *head,
				char *err, size_t errlen)
{
	snprintf(w->ckpt.architecture, sizeof(w->ckpt.architecture), "%s", head->architecture);
	snprintf(w->ckpt.quant_method, sizeof(w->ckpt.quant_method), "%s", head->quant_method);
	char *m = weights_build_manifest(w);
	if (!m) {
		snprintf(err, errlen, "out of memory building the manifest");
		return -ENOMEM;
	}
	w->manifest = m;
	w->manifest_len = strlen(m);
	w->state = READY;
	w->finished_ns = weights_now_ns();
	return 0;
}

/* The copied rank becomes w's: its GPU, slab, tensors and fingerprint, and
 * w's totals; the last rank makes w ready. With w->mu held. */
static int direct_rank_locked(struct weights *w, const struct direct_job *j, char *err,
			       size_t errlen)
{
	const int r = j->rank;
	struct weights_rank *wr = &w->ranks[r];

	wr->device = j->dst.device;
	wr->total_bytes = j->bytes;
	memcpy(wr->layout, j->layout, sizeof(wr->layout));
	wr->published = true;
	if (j->dev_known)
		wr->dev = j->dev;
	direct_fingerprint(w, r, &j->b);
	w->granks[r] = j->dst;
	w->granks[r].pieces = j->pieces;
	w->granks[r].npieces = j->b.ntensors;
	w->load.nranks = w->nranks;
	w->gpu_freed = false;
	w->bytes_total += j->bytes;
	w->copy_seconds = j->gp.copy_seconds;
	w->open_seconds = j->gp.open_seconds;
	w->alloc_seconds = j->gp.alloc_seconds;
	w->ranks_published++;
	char uuid[33];
	key_hex(j->b.head.source_uuid, 16, uuid);
	snprintf(w->source, sizeof(w->source), "gpu-direct from GPU %s", uuid);
	list_published_gpus(w);
	if (w->ranks_published != w->nranks)
		return 0;
	return direct_ready_locked(w, &j->b.head, err, errlen);
}

/* Settles the publish (rc: the copy's) in w: the rank is published, or it
 * waits for a publish again and what was made for it is freed. */
static int direct_settle(struct weights *w, struct direct_job *j, int rc, char *err, size_t errlen)
{
	pthread_mutex_lock(&w->mu);
	struct weights_rank *wr = &w->ranks[j->rank];
	wr->publishing = false;
	if (rc == 0 && (w->unloaded || direct_own_table(wr, &j->b, j->pieces) < 0)) {
		rc = w->unloaded ? -ENOENT : -ENOMEM;
		snprintf(err, errlen, w->unloaded ? "the weights were unloaded" : "out of memory");
		struct gpu_load one = { .ranks = &j->dst, .nranks = 1 };
		gpu_unload(&one); /* never made part of w->load */
	}
	if (rc < 0) {
		free(j->pieces);
		if (w->ranks_published == 0)
			w->nranks = 0;
	} else {
		rc = direct_rank_locked(w, j, err, errlen);
	}
	pthread_mutex_unlock(&w->mu);
	return rc;
}

static int direct_run(struct tree *t, struct direct_handle *ph)
{
	struct weights *w = ph->w;
	const char *wv = w->ver->name;
	struct direct_job j;
	char err[256] = "";
	int rc;
	int64_t t0 = weights_now_ns();

	(void)t;
	memset(&j, 0, sizeof(j));
	if (ph->too_long) {
		snprintf(err, sizeof(err), "the blob is longer than %u bytes", WBLOB_BYTES_MAX);
		rc = -EFBIG;
		goto reply;
	}
	rc = wblob_parse(ph->buf, ph->len, &j.b, err, sizeof(err));
	if (rc < 0)
		goto reply;
	j.rank = (int)j.b.head.rank;
	rc = direct_claim(w, &j.b, err, sizeof(err));
	if (rc == 0) {
		rc = direct_copy(&j, err, sizeof(err));
		rc = direct_settle(w, &j, rc, err, sizeof(err));
	}
	if (rc == 0) {
		log_info("weights %s: rank %d published from GPU %d onto GPU %d%s: %zu tensors, %" PRIu64
			 " bytes, copied in %.4f s (%.0f GB/s), %.4f s in all", wv, j.rank,
			 j.gp.source_device, j.dst.device, j.gp.peer ? " (peer to peer)" : "", j.b.ntensors,
			 j.bytes, j.gp.copy_seconds,
			 j.gp.copy_seconds > 0 ? (double)j.bytes / j.gp.copy_seconds / 1e9 : 0.0,
			 (double)(weights_now_ns() - t0) / 1e9);
		snprintf(ph->reply, sizeof(ph->reply), "0 %zu %" PRIu64 " %.6f\n", j.b.ntensors, j.bytes,
			 j.gp.copy_seconds);
		weights_keep(w); /* once every rank is published */
	}
	wblob_free(&j.b);
	if (rc == 0)
		return 0;
reply:
	log_warn("publish %s: %s", wv, err);
	snprintf(ph->reply, sizeof(ph->reply), "%s %s\n", errno_name(-rc), err);
	return rc;
}

static int direct_finish(struct tree *t, struct direct_handle *ph)
{
	pthread_mutex_lock(&ph->mu);
	if (!ph->done && (ph->len || ph->too_long)) {
		ph->result = direct_run(t, ph);
		ph->done = true;
		free(ph->buf);
		ph->buf = NULL;
		ph->len = ph->cap = 0;
	}
	int rc = ph->result;
	pthread_mutex_unlock(&ph->mu);
	return rc;
}

static int direct_fsync(struct tree *t, struct handle *h)
{
	return direct_finish(t, (struct direct_handle *)h);
}

static int direct_flush(struct tree *t, struct handle *h, uint64_t owner)
{
	(void)owner;
	return direct_finish(t, (struct direct_handle *)h);
}

static int direct_read(struct tree *t, struct handle *h, uint64_t off, size_t size,
			const void **data, size_t *len)
{
	struct direct_handle *ph = (struct direct_handle *)h;
	size_t n;

	(void)t;
	pthread_mutex_lock(&ph->mu);
	n = ph->done ? strlen(ph->reply) : 0;
	pthread_mutex_unlock(&ph->mu);
	buffer_slice(ph->reply, n, off, size, data, len);
	return 0;
}

static void direct_release(struct tree *t, struct handle *h)
{
	struct direct_handle *ph = (struct direct_handle *)h;

	(void)t;
	free(ph->buf);
	pthread_mutex_destroy(&ph->mu);
	node_unref(&ph->w->node, 1);
	free(ph);
}

static bool direct_never_quick(struct tree *t, struct handle *h)
{
	(void)t, (void)h;
	return false;
}

static const struct handle_ops direct_ops = {
	.kind = "weights-publish",
	.held_kind = HANDLE_WEIGHTS_PUBLISH,
	.read = direct_read,
	.write = direct_write,
	.flush = direct_flush,
	.fsync = direct_fsync,
	.release = direct_release,
	.flush_quick = direct_never_quick,
};
