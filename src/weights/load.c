/* SPDX-License-Identifier: Apache-2.0 */
/* Loading a checkpoint onto GPUs: the request checked, every rank's slab
 * planned, room allocated, and the load thread that reads the files into
 * the slabs; the config's weights loaded at the mount; and unload, which
 * takes any weights out of the namespace. */
#include "autoconf.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/checkpoint.h"
#include "format/key.h"
#include "gpu/gpu.h"
#include "lib/log.h"
#include "state/expiry.h"
#include "state/ids.h"
#include "weights/weights.h"
#include "weights/weights_i.h"

/* ---- planning a load -------------------------------------------------------------- */

static int parse_gpus(const char *text, int *out, int cap, int *n)
{
	*n = 0;
	if (!text || !*text)
		return 0;
	const char *p = text;
	while (*p) {
		char *end;
		if (!isdigit((unsigned char)*p))
			return -EINVAL;
		long v = strtol(p, &end, 10);
		if (v < 0 || v > 1023 || *n == cap)
			return -EINVAL;
		for (int i = 0; i < *n; i++)
			if (out[i] == v)
				return -EINVAL;
		out[(*n)++] = (int)v;
		p = end;
		if (*p == ',')
			p++;
		else if (*p)
			return -EINVAL;
	}
	return 0;
}

uint64_t weights_align_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) / a * a;
}

/* The GPU of devs with this index, or NULL. */
const struct gpu_device *weights_device_find(const struct gpu_device *devs, int n, int index)
{
	for (int k = 0; k < n; k++)
		if (devs[k].index == index)
			return &devs[k];
	return NULL;
}

/* Lists rank r's tensors in file order (the order the loader reads them
 * in) and gives each its place in the slab by the layout (layout.c): the
 * same tensors published GPU-direct lie at the same offsets. */
static int plan_rank(struct weights *w, int r, int source_rank)
{
	struct weights_rank *wr = &w->ranks[r];
	size_t n = 0;

	for (size_t f = 0; f < w->ckpt.nfiles; f++) {
		const struct checkpoint_file *cf = &w->ckpt.files[f];
		if (cf->rank == -1 || cf->rank == source_rank)
			n += cf->st.count;
	}
	wr->pieces = calloc(n ? n : 1, sizeof(*wr->pieces));
	wr->tensors = calloc(n ? n : 1, sizeof(*wr->tensors));
	if (!wr->pieces || !wr->tensors)
		return -ENOMEM;
	for (size_t f = 0; f < w->ckpt.nfiles; f++) {
		const struct checkpoint_file *cf = &w->ckpt.files[f];
		if (cf->rank != -1 && cf->rank != source_rank)
			continue;
		for (size_t i = 0; i < cf->st.count; i++) {
			const struct safetensors_tensor *ts = &cf->st.tensors[i];
			wr->pieces[wr->npieces] = (struct gpu_piece){
				.file = (uint32_t)f, .file_offset = ts->offset, .size = ts->size,
			};
			wr->tensors[wr->npieces++] = ts;
			wr->total_bytes += ts->size;
		}
	}
	if (weights_rank_layout(wr, NULL, &w->granks[r].slab_size) < 0)
		return -ENOMEM;
	w->granks[r].device = wr->device;
	w->granks[r].pieces = wr->pieces;
	w->granks[r].npieces = wr->npieces;
	return 0;
}

/* ---- the load thread ------------------------------------------------------------ */

static void *load_main(void *arg)
{
	struct weights *w = arg;
	struct tree *t = w->t;
	char err[256] = "";
	int rc;

	rc = gpu_load(&w->load, err, sizeof(err));
	char *manifest = rc == 0 ? weights_build_manifest(w) : NULL;
	pthread_mutex_lock(&w->mu);
	w->finished_ns = weights_now_ns();
	double secs = (double)(w->finished_ns - w->started_ns) / 1e9;
	if (rc == 0 && !manifest) {
		rc = -ENOMEM;
		snprintf(err, sizeof(err), "out of memory building the manifest");
		gpu_unload(&w->load);
	}
	if (rc == 0) {
		w->manifest = manifest;
		w->manifest_len = strlen(manifest);
		w->state = READY;
		log_info("weights %s: ready, %" PRIu64 " bytes read in %.2f s (%.0f MB/s) onto %d GPU%s%s, "
			 "%u readers",
			 w->ver->name, w->bytes_total, secs, secs > 0 ? (double)w->bytes_total / secs / 1e6 : 0,
			 w->nranks, w->nranks > 1 ? "s" : "", w->load.used_nccl ? " (NCCL broadcast)" : "",
			 w->load.readers);
	} else {
		w->state = FAILED;
		w->gpu_freed = true; /* gpu_load frees what it allocated when it fails */
		snprintf(w->error, sizeof(w->error), "%s", err);
		log_err("weights %s: load of %s failed: %s", w->ver->name, w->ckpt.dir, err);
	}
	w->thread_done = true;
	weights_release_gpu_locked(w);
	pthread_mutex_unlock(&w->mu);
	if (rc == 0)
		weights_keep(w);

	/* The thread's reference goes before it counts itself out: shutdown
	 * frees what is left once no load runs. */
	node_unref(&w->node, 1);
	pthread_mutex_lock(&t->weights_mu);
	t->loads_running--;
	pthread_cond_broadcast(&t->weights_cv);
	pthread_mutex_unlock(&t->weights_mu);
	return NULL;
}

/* ---- load and unload ------------------------------------------------------------- */

bool weights_quant_allowed(struct tree *t, const struct checkpoint *c)
{
	if (!c->quant_method[0] || (strcmp(c->quant_method, "fp8") == 0 && c->quant_block_fp8))
		return true;
	/* allow_quant= is a comma-separated list of quant_method names. */
	const char *list = t->cfg->allow_quant;
	size_t n = strlen(c->quant_method);
	for (const char *p = list; p && *p;) {
		const char *comma = strchr(p, ',');
		size_t len = comma ? (size_t)(comma - p) : strlen(p);
		if (len == n && strncmp(p, c->quant_method, n) == 0)
			return true;
		p = comma ? comma + 1 : NULL;
	}
	return false;
}

/* What a load request names: a valid version and an absolute directory, a
 * GPU list that parses, and GPUs to load onto (devs). */
static int load_check_request(const char *wv, const char *dir, const char *gpus, int *gpu_list,
			      int *ngpus, struct gpu_device *devs, int *ndevs)
{
	char err[256];

	if (!key_version_name_valid(wv) || dir[0] != '/') {
		log_warn("load %.130s: needs a weight version name and an absolute directory", wv);
		return -EINVAL;
	}
	if (parse_gpus(gpus, gpu_list, RANKS_MAX, ngpus) < 0) {
		log_warn("load %s: bad GPU list \"%.64s\" (e.g. 0,1,2)", wv, gpus);
		return -EINVAL;
	}
	*ndevs = gpu_devices(devs, RANKS_MAX, err, sizeof(err));
	if (*ndevs < 0) {
		log_warn("load %s: %s", wv, err);
		return -ENODEV;
	}
	return 0;
}

/* How many ranks the checkpoint loads as, and onto which GPUs: a sharded
 * checkpoint has its own count, a Hugging Face one a rank per GPU given
 * (every GPU when none is). Fills gpu_list when it was empty. */
static int load_choose_ranks(const char *wv, const struct checkpoint *ckpt,
			     const struct gpu_device *devs, int ndevs, int *gpu_list, int ngpus,
			     int *nranks)
{
	int n = ckpt->layout == CHECKPOINT_VLLM_SHARDED ? ckpt->ranks : (ngpus ? ngpus : ndevs);

	if (ngpus == 0)
		for (int i = 0; i < n && i < ndevs; i++)
			gpu_list[i] = devs[i].index;
	if ((ngpus && ngpus != n) || n > ndevs || n < 1 || n > RANKS_MAX) {
		log_warn("load %s: the checkpoint has %d ranks, %d GPUs were given, %d exist", wv, n,
			 ngpus, ndevs);
		return -EINVAL;
	}
	for (int r = 0; r < n; r++)
		if (!weights_device_find(devs, ndevs, gpu_list[r])) {
			log_warn("load %s: no GPU %d", wv, gpu_list[r]);
			return -EINVAL;
		}
	*nranks = n;
	return 0;
}

/* Every rank's GPU, slab plan and fingerprint, and the files the load
 * reads, in w->load. */
static int load_plan(struct weights *w, const struct gpu_device *devs, int ndevs,
		     const int *gpu_list)
{
	const struct checkpoint *ckpt = &w->ckpt;
	const bool sharded = ckpt->layout == CHECKPOINT_VLLM_SHARDED;
	size_t used = 0;

	w->granks = calloc((size_t)w->nranks, sizeof(*w->granks));
	w->paths = calloc(ckpt->nfiles ? ckpt->nfiles : 1, sizeof(*w->paths));
	w->sizes = calloc(ckpt->nfiles ? ckpt->nfiles : 1, sizeof(*w->sizes));
	int rc = w->granks && w->paths && w->sizes ? 0 : -ENOMEM;
	for (int r = 0; r < w->nranks && w->granks; r++)
		w->granks[r].fd = -1;
	for (int r = 0; r < w->nranks && rc == 0; r++) {
		struct weights_rank *wr = &w->ranks[r];
		const struct gpu_device *d = weights_device_find(devs, ndevs, gpu_list[r]);
		wr->device = gpu_list[r];
		if (d)
			wr->dev = *d;
		used += snprintf(w->gpus + used, sizeof(w->gpus) - used, "%s%d", r ? "," : "", wr->device);
		rc = plan_rank(w, r, sharded ? r : -1);
		weights_fingerprint(w, r, sharded ? w->nranks : 1);
	}
	for (size_t f = 0; f < ckpt->nfiles && rc == 0; f++) {
		w->paths[f] = ckpt->files[f].path;
		w->sizes[f] = ckpt->files[f].st.file_size;
		w->bytes_total += ckpt->files[f].st.file_size - ckpt->files[f].st.data_start;
	}
	if (rc < 0)
		return rc;
	w->load.paths = w->paths;
	w->load.sizes = w->sizes;
	w->load.nfiles = ckpt->nfiles;
	w->load.ranks = w->granks;
	w->load.nranks = w->nranks;
	w->load.replicated = ckpt->layout == CHECKPOINT_HF;
	return 0;
}

/* The weights of a load into wv (made if missing), planned. They own ckpt
 * from here on, on failure too. */
static int load_new(struct tree *t, const char *wv, struct checkpoint *ckpt, int nranks,
		    const struct gpu_device *devs, int ndevs, const int *gpu_list, struct weights **out)
{
	int rc = 0;
	struct version *v = weights_version_for(t, wv, &rc);

	if (!v) {
		checkpoint_close(ckpt);
		return rc;
	}
	struct weights *w = calloc(1, sizeof(*w) + (size_t)nranks * sizeof(struct weights_rank));
	if (!w) {
		node_unref(&v->node, 1);
		checkpoint_close(ckpt);
		return -ENOMEM;
	}
	w->t = t;
	w->ver = v; /* our reference from version_for */
	w->ckpt = *ckpt;
	w->nranks = nranks;
	weights_init_nodes(w, nranks);
	rc = load_plan(w, devs, ndevs, gpu_list);
	if (rc < 0) {
		weights_free(w);
		return rc;
	}
	*out = w;
	return 0;
}

/* Room on every GPU first: a load that does not fit fails now, with
 * ENOMEM, and touches nothing that is attached. Frees w on failure. */
static int load_alloc(struct weights *w, const char *wv)
{
	char err[256];

	w->started_ns = weights_now_ns();
	w->thread_done = true; /* until the thread starts: weights_free may free */
	w->gpu_freed = true;
	int rc = gpu_alloc(&w->load, err, sizeof(err));
	w->alloc_seconds = (double)(weights_now_ns() - w->started_ns) / 1e9;
	if (rc < 0) {
		log_warn("load %s: %s", wv, err);
		weights_free(w);
		return rc == -ENOMEM ? -ENOMEM : rc == -EINVAL ? -EINVAL : -ENODEV;
	}
	return 0;
}

/* Makes w its version's weights, unless the version was removed or has
 * weights meanwhile: then w and its slabs are freed. */
static int load_take_version(struct tree *t, struct weights *w, const char *wv)
{
	struct version *v = w->ver;

	pthread_mutex_lock(&t->lock);
	if (v->removed || v->weights) {
		int rc = v->removed ? -ENOENT : -EEXIST;
		pthread_mutex_unlock(&t->lock);
		log_warn("load %s: %s", wv, rc == -EEXIST ? "weights of this version are already loaded "
			 "(loaded weights are immutable: use a new version)" : "the version was removed");
		gpu_unload(&w->load);
		weights_free(w);
		return rc;
	}
	w->thread_done = false;
	w->gpu_freed = false;
	v->weights = w;
	pthread_mutex_unlock(&t->lock);
	return 0;
}

/* Starts the load thread. Without one the load has failed: status says
 * so, and its slabs are freed. */
static int load_start(struct tree *t, struct weights *w)
{
	node_ref(&w->node); /* the thread's */
	pthread_attr_t attr;
	pthread_t thread;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	int rc = pthread_create(&thread, &attr, load_main, w);
	pthread_attr_destroy(&attr);
	if (rc == 0)
		return 0;
	pthread_mutex_lock(&t->weights_mu);
	t->loads_running--;
	pthread_mutex_unlock(&t->weights_mu);
	pthread_mutex_lock(&w->mu);
	w->state = FAILED;
	w->thread_done = true;
	gpu_unload(&w->load);
	w->gpu_freed = true;
	snprintf(w->error, sizeof(w->error), "cannot start the load thread");
	pthread_mutex_unlock(&w->mu);
	node_unref(&w->node, 1);
	return -EAGAIN;
}

int weights_load(struct tree *t, const char *wv, const char *dir, const char *gpus)
{
	struct gpu_device devs[RANKS_MAX];
	int gpu_list[RANKS_MAX], ngpus, ndevs, nranks;
	struct checkpoint ckpt;
	struct weights *w = NULL;
	char err[256];

	int rc = load_check_request(wv, dir, gpus, gpu_list, &ngpus, devs, &ndevs);
	if (rc < 0)
		return rc;
	rc = checkpoint_open(dir, &ckpt, err, sizeof(err));
	if (rc < 0) {
		log_warn("load %s: checkpoint %s: %s", wv, dir, err);
		return rc == -ENOMEM ? rc : rc == -ENOENT ? -ENOENT : -EINVAL;
	}
	rc = load_choose_ranks(wv, &ckpt, devs, ndevs, gpu_list, ngpus, &nranks);
	if (rc < 0) {
		checkpoint_close(&ckpt);
		return rc;
	}
	/* w owns what ckpt points to from here on; its fields stay ours to read. */
	rc = load_new(t, wv, &ckpt, nranks, devs, ndevs, gpu_list, &w);
	if (rc < 0)
		return rc;
	if (!weights_quant_allowed(t, &ckpt))
		log_warn("load %s: quantization \"%s\" is not served zero-copy unless allow_quant= "
			 "names it; attaches will fail with EOPNOTSUPP", wv, ckpt.quant_method);
	rc = load_alloc(w, wv);
	if (rc == 0)
		rc = load_take_version(t, w, wv);
	if (rc < 0)
		return rc;
	weights_all_add(t, w, true);
	log_info("weights %s: loading %s (%s, %zu files, %" PRIu64 " bytes) onto GPU %s", wv, dir,
		 ckpt.layout == CHECKPOINT_HF ? "Hugging Face, replicated" : "vLLM sharded",
		 ckpt.nfiles, w->bytes_total, w->gpus);
	return load_start(t, w);
}

int weights_unload(struct tree *t, const char *wv)
{
	pthread_mutex_lock(&t->lock);
	struct version *v = index_version_find(&t->idx, wv);
	struct weights *w = v ? v->weights : NULL;
	if (w)
		v->weights = NULL;
	uint64_t parent = v ? node_id(t, &v->node) : 0;
	pthread_mutex_unlock(&t->lock);
	if (!w)
		return -ENOENT;
	pthread_mutex_lock(&w->mu);
	w->unloaded = true;
	atomic_store(&w->load.cancel, 1);
	uint32_t attached = w->attached;
	weights_unkeep_locked(w);
	weights_release_gpu_locked(w);
	pthread_mutex_unlock(&w->mu);
	expiry_forget(t, parent, "weights");
	log_info("weights %s: unloaded%s", wv,
		 attached ? "; their GPU memory is freed once the attached engines unmap it" : "");
	node_unref(&w->node, 1); /* the version's */
	return 0;
}

/* How long a daemon that took over waits before it makes its GPU contexts
 * (ARTFS_WARMUP_DELAY_MS, default 2 s): engines attach right after a
 * restart, and a context made beside theirs slowed their attach by up to
 * a third on the GPU host. A load that comes first makes them itself. */
static unsigned warmup_delay_ms(const struct tree *t)
{
	const char *env = getenv("ARTFS_WARMUP_DELAY_MS");
	char *end;

	if (!t->took_over)
		return 0;
	if (env && *env) {
		unsigned long ms = strtoul(env, &end, 10);
		if (!*end && ms <= 60000)
			return (unsigned)ms;
	}
	return 2000;
}

static bool has_weights(struct tree *t, const char *wv)
{
	pthread_mutex_lock(&t->lock);
	struct version *v = index_version_find(&t->idx, wv);
	bool has = v && v->weights;
	pthread_mutex_unlock(&t->lock);
	return has;
}

/* The config's weights.<wv> = dir: loaded at the mount, and by a daemon
 * that took over only where the daemon before had not finished them
 * (those it had are served from the holder's descriptors). */
void weights_preload(struct tree *t)
{
	gpu_warmup_start(warmup_delay_ms(t));
	for (unsigned i = 0; i < t->cfg->nweights; i++) {
		const struct config_weights *cw = &t->cfg->weights[i];
		if (t->took_over && has_weights(t, cw->version))
			continue;
		int rc = weights_load(t, cw->version, cw->dir, "");
		if (rc < 0)
			log_err("config: weights.%s = %s: %s", cw->version, cw->dir, strerror(-rc));
	}
}
