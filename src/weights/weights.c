#include "autoconf.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/checkpoint.h"
#include "format/key.h"
#include "format/publish_blob.h"
#include "format/weights_record.h"
#include "gpu/gpu.h"
#include "lib/log.h"
#include "lib/sha256.h"
#include "restart/keeper.h"
#include "state/expiry.h"
#include "state/grant.h"
#include "state/ids.h"
#include "state/text.h"
#include "store/store.h"
#include "weights/socket.h"
#include "weights/weights.h"

#define RANKS_MAX 64

struct weights_rank {
	struct node node;            /* rank<k>: owned by the weights */
	int device;
	struct gpu_device dev;
	struct artfs_fingerprint fp;
	uint64_t total_bytes;        /* tensor bytes */
	struct gpu_piece *pieces;    /* rank's tensors, in file order */
	const struct safetensors_tensor **tensors; /* the same order: what each piece is */
	size_t npieces;
	uint32_t attached;           /* open rank<k> files (w->mu) */
	/* GPU-direct publish: the rank's own tensor table (names in one buffer) */
	struct safetensors_tensor *own;
	char *names;
	bool published, publishing;  /* w->mu */
};

/* EMPTY: made by mkdir <wv>/weights, waiting for a publish of every rank. */
enum weights_state { LOADING = 0, READY, FAILED, EMPTY };

struct weights {
	struct node node;            /* NODE_WEIGHTS: owns the nodes below */
	struct node dir;
	struct node files[WEIGHTS_FILE_COUNT];
	struct weights *next_all;    /* t->weights list (t->weights_mu) */
	struct tree *t;
	struct version *ver;         /* referenced */
	pthread_mutex_t mu;
	enum weights_state state;
	bool unloaded;               /* gone from the namespace */
	bool thread_done;
	bool gpu_freed;
	uint32_t attached;
	char error[256];
	char gpus[256];              /* the GPU list, for status */
	struct checkpoint ckpt;
	const char **paths;
	uint64_t *sizes;
	struct gpu_load load;
	struct gpu_rank *granks;
	uint64_t bytes_total;        /* bytes read from disk for a full load */
	int64_t started_ns, finished_ns;
	bool gpu_direct;             /* made by publishes, not by a load */
	char source[96];             /* gpu-direct: where the tensors came from */
	int ranks_published;
	double copy_seconds;         /* gpu-direct: the device copies of the last publish */
	double open_seconds;         /* ... opening its IPC handles */
	double alloc_seconds;        /* ... allocating its slab; a load: every rank's slab */
	char *manifest;
	size_t manifest_len;
	/* Kept by the holder (DESIGN.md §8): its slabs' descriptors and its
	 * record, under tags that begin with kept_tag; a daemon's successor
	 * serves them. status_kept: the status of weights taken over from a
	 * daemon before, as it was when they became ready. */
	bool kept;
	char kept_tag[48];
	char *status_kept;
	int nranks;
	struct weights_rank ranks[];
};

struct rank_handle {
	struct handle h;
	struct weights *w;           /* referenced */
	int rank;
};

static const char *const file_names[WEIGHTS_FILE_COUNT] = {
	[WEIGHTS_MANIFEST] = "manifest.json",
	[WEIGHTS_STATUS] = "status",
	[WEIGHTS_PUBLISH] = ARTFS_PUBLISH_NAME,
};

static void weights_keep(struct weights *w);
static void weights_unkeep_locked(struct weights *w);
static char *status_text(struct weights *w);

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static struct weights *weights_of(struct node *n)
{
	return (struct weights *)n->owner;
}

struct node *weights_dir_node(struct weights *w)
{
	return &w->dir;
}

/* ---- GPU memory lifetime ---------------------------------------------------- */

/* Lets go of the slabs once this daemon is done with them: unloaded (or
 * shutting down) and the load thread finished. An engine's mapping keeps
 * the memory of the slabs it attached until it unmaps them (or ends), and
 * the holder's descriptors keep that of kept weights for the next daemon.
 * Called with w->mu held. */
static void release_gpu_locked(struct weights *w)
{
	if (w->gpu_freed || !w->unloaded || !w->thread_done)
		return;
	gpu_unload(&w->load);
	w->gpu_freed = true;
	log_info("weights %s: this daemon let go of their GPU memory%s", w->ver->name,
		 w->kept ? " (the holder keeps it)" : w->attached ? " (attached engines still map it)"
								   : "");
}

static void weights_free(struct weights *w)
{
	struct tree *t = w->t;

	pthread_mutex_lock(&t->weights_mu);
	for (struct weights **p = &t->weights; *p; p = &(*p)->next_all)
		if (*p == w) {
			*p = w->next_all;
			break;
		}
	pthread_mutex_unlock(&t->weights_mu);
	pthread_mutex_lock(&w->mu);
	w->unloaded = true;
	release_gpu_locked(w);
	pthread_mutex_unlock(&w->mu);
	for (int r = 0; r < w->nranks; r++) {
		free(w->ranks[r].pieces);
		free(w->ranks[r].tensors);
		free(w->ranks[r].own);
		free(w->ranks[r].names);
	}
	free(w->granks);
	free(w->paths);
	free(w->sizes);
	free(w->manifest);
	free(w->status_kept);
	checkpoint_close(&w->ckpt);
	pthread_mutex_destroy(&w->mu);
	node_unref(&w->ver->node, 1);
	free(w);
}

/* The index frees a weights node through this when its last reference goes. */
static void weights_node_free(struct node *n)
{
	weights_free((struct weights *)n);
}

/* The weights node and the nodes it owns (weights/, its files, rank<k>),
 * all sharing its count: one reference, the version's. */
static void init_nodes(struct weights *w, int nranks)
{
	pthread_mutex_init(&w->mu, NULL);
	w->node.type = NODE_WEIGHTS;
	index_set_weights_free(weights_node_free);
	atomic_init(&w->node.refs, 1);
	w->dir.type = NODE_WEIGHTS_DIR;
	w->dir.owner = &w->node;
	for (int i = 0; i < WEIGHTS_FILE_COUNT; i++) {
		w->files[i].type = NODE_WEIGHTS_FILE;
		w->files[i].sub = (uint8_t)i;
		w->files[i].owner = &w->node;
	}
	for (int r = 0; r < nranks; r++) {
		w->ranks[r].node.type = NODE_WEIGHTS_RANK;
		w->ranks[r].node.sub = (uint8_t)r;
		w->ranks[r].node.owner = &w->node;
	}
}

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

static uint64_t align_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) / a * a;
}

/* The GPU of devs with this index, or NULL. */
static const struct gpu_device *device_find(const struct gpu_device *devs, int n, int index)
{
	for (int k = 0; k < n; k++)
		if (devs[k].index == index)
			return &devs[k];
	return NULL;
}

/* Gives every tensor of rank r a 256-byte aligned place in its slab, in
 * file order (so that a read of consecutive file bytes lands in
 * consecutive slab bytes). */
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
	uint64_t at = 0;
	for (size_t f = 0; f < w->ckpt.nfiles; f++) {
		const struct checkpoint_file *cf = &w->ckpt.files[f];
		if (cf->rank != -1 && cf->rank != source_rank)
			continue;
		for (size_t i = 0; i < cf->st.count; i++) {
			const struct safetensors_tensor *ts = &cf->st.tensors[i];
			at = align_up(at, ARTFS_TENSOR_ALIGN);
			wr->pieces[wr->npieces] = (struct gpu_piece){
				.file = (uint32_t)f, .file_offset = ts->offset, .size = ts->size, .slab_offset = at,
			};
			wr->tensors[wr->npieces++] = ts;
			at += ts->size;
			wr->total_bytes += ts->size;
		}
	}
	w->granks[r].device = wr->device;
	w->granks[r].slab_size = align_up(at ? at : 1, ARTFS_SLAB_ALIGN);
	w->granks[r].pieces = wr->pieces;
	w->granks[r].npieces = wr->npieces;
	return 0;
}

/* What the GPU adds to a fingerprint, loaded or published alike. */
static void fingerprint_device(struct artfs_fingerprint *fp, const struct gpu_device *d)
{
	fp->cc_major = (uint32_t)d->cc_major;
	fp->cc_minor = (uint32_t)d->cc_minor;
	fp->driver_version = (uint32_t)d->driver_version;
}

static void fingerprint(struct weights *w, int r, int tp_size)
{
	struct artfs_fingerprint *fp = &w->ranks[r].fp;
	const struct gpu_device *d = &w->ranks[r].dev;

	memset(fp, 0, sizeof(*fp));
	snprintf(fp->architecture, sizeof(fp->architecture), "%s", w->ckpt.architecture);
	snprintf(fp->quant_method, sizeof(fp->quant_method), "%s", w->ckpt.quant_method);
	memcpy(fp->quant_config_sha256, w->ckpt.quant_config_sha256, 32);
	memcpy(fp->revision, w->ckpt.revision, 32);
	snprintf(fp->dtypes, sizeof(fp->dtypes), "%s", w->ckpt.dtypes);
	fp->tp_size = (uint32_t)tp_size;
	fp->tp_rank = tp_size == 1 ? 0 : (uint32_t)r;
	fingerprint_device(fp, d);
}

/* ---- the manifest ------------------------------------------------------------ */

static json_t *fingerprint_json(const struct artfs_fingerprint *fp)
{
	char quant[65], rev[65], cc[16];

	key_hex(fp->quant_config_sha256, 32, quant);
	key_hex(fp->revision, 32, rev);
	snprintf(cc, sizeof(cc), "%u.%u", fp->cc_major, fp->cc_minor);
	return json_pack("{s:s, s:s, s:s, s:s, s:s, s:i, s:i, s:s, s:i}",
			 "architecture", fp->architecture, "quant_method", fp->quant_method,
			 "quant_config_sha256", quant, "revision", rev, "dtypes", fp->dtypes,
			 "tp_size", (int)fp->tp_size, "tp_rank", (int)fp->tp_rank,
			 "compute_capability", cc, "driver_version", (int)fp->driver_version);
}

static char *build_manifest(struct weights *w)
{
	json_t *ranks = json_array();

	for (int r = 0; r < w->nranks && ranks; r++) {
		struct weights_rank *wr = &w->ranks[r];
		char uuid[33];
		key_hex(wr->dev.uuid, 16, uuid);
		json_t *tensors = json_object();
		for (size_t i = 0; i < wr->npieces && tensors; i++) {
			const struct safetensors_tensor *ts = wr->tensors[i];
			json_t *shape = json_array();
			for (unsigned d = 0; d < ts->ndim; d++)
				json_array_append_new(shape, json_integer((json_int_t)ts->shape[d]));
			json_object_set_new(tensors, ts->name,
					    json_pack("{s:s, s:o, s:i, s:I, s:I}", "dtype",
						      safetensors_dtype_name(ts->dtype), "shape", shape, "slab", 0,
						      "offset", (json_int_t)wr->pieces[i].slab_offset,
						      "size", (json_int_t)ts->size));
		}
		json_t *slabs = json_pack("[{s:I}]", "size", (json_int_t)w->granks[r].slab_size);
		json_array_append_new(ranks, json_pack("{s:i, s:i, s:s, s:o, s:o, s:I, s:o}", "rank", r,
						       "device", wr->device, "device_uuid", uuid,
						       "fingerprint", fingerprint_json(&wr->fp),
						       "slabs", slabs, "bytes", (json_int_t)wr->total_bytes,
						       "tensors", tensors));
	}
	json_t *root = json_pack("{s:s, s:s, s:s, s:i, s:o}", "weight_version", w->ver->name,
				 "checkpoint", w->gpu_direct ? w->source : w->ckpt.dir,
				 "layout", w->gpu_direct ? "gpu-direct"
				 : w->ckpt.layout == CHECKPOINT_HF ? "huggingface" : "vllm-sharded",
				 "tp_size", (int)w->ranks[0].fp.tp_size, "ranks", ranks);
	if (!root)
		return NULL;
	char *text = json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
	json_decref(root);
	return text;
}

/* ---- the load thread ------------------------------------------------------------ */

static void *load_main(void *arg)
{
	struct weights *w = arg;
	struct tree *t = w->t;
	char err[256] = "";
	int rc;

	rc = gpu_load(&w->load, err, sizeof(err));
	char *manifest = rc == 0 ? build_manifest(w) : NULL;
	pthread_mutex_lock(&w->mu);
	w->finished_ns = now_ns();
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
	release_gpu_locked(w);
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

static struct version *version_for(struct tree *t, const char *wv, int *rc)
{
	pthread_mutex_lock(&t->lock);
	struct version *v = index_version_find(&t->idx, wv);
	if (v)
		node_ref(&v->node);
	pthread_mutex_unlock(&t->lock);
	if (v)
		return v;
	/* Weights may come before any R3 object: make the version. */
	*rc = version_make(t, wv, &v);
	if (*rc == -EEXIST)
		*rc = 0;
	return *rc < 0 ? NULL : v;
}

static bool quant_allowed(struct tree *t, const struct checkpoint *c)
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
		if (!device_find(devs, ndevs, gpu_list[r])) {
			log_warn("load %s: no GPU %d", wv, gpu_list[r]);
			return -EINVAL;
		}
	*nranks = n;
	return 0;
}

/* Every rank's GPU, slab plan and fingerprint, and the files the load
 * reads, in w->load. */
static int load_plan(struct weights *w, const struct gpu_device *devs, int ndevs, const int *gpu_list)
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
		const struct gpu_device *d = device_find(devs, ndevs, gpu_list[r]);
		wr->device = gpu_list[r];
		if (d)
			wr->dev = *d;
		used += snprintf(w->gpus + used, sizeof(w->gpus) - used, "%s%d", r ? "," : "", wr->device);
		rc = plan_rank(w, r, sharded ? r : -1);
		fingerprint(w, r, sharded ? w->nranks : 1);
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
	struct version *v = version_for(t, wv, &rc);

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
	init_nodes(w, nranks);
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

	w->started_ns = now_ns();
	w->thread_done = true; /* until the thread starts: weights_free may free */
	w->gpu_freed = true;
	int rc = gpu_alloc(&w->load, err, sizeof(err));
	w->alloc_seconds = (double)(now_ns() - w->started_ns) / 1e9;
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

/* Puts w on the tree's list, which shutdown frees; a load also counts as
 * running until its thread ends. */
static void all_add(struct tree *t, struct weights *w, bool loading)
{
	pthread_mutex_lock(&t->weights_mu);
	w->next_all = t->weights;
	t->weights = w;
	if (loading)
		t->loads_running++;
	pthread_mutex_unlock(&t->weights_mu);
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
	if (!quant_allowed(t, &ckpt))
		log_warn("load %s: quantization \"%s\" is not served zero-copy unless allow_quant= "
			 "names it; attaches will fail with EOPNOTSUPP", wv, ckpt.quant_method);
	rc = load_alloc(w, wv);
	if (rc == 0)
		rc = load_take_version(t, w, wv);
	if (rc < 0)
		return rc;
	all_add(t, w, true);
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
	release_gpu_locked(w);
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

void weights_shutdown(struct tree *t)
{
	gpu_warmup_stop();
	pthread_mutex_lock(&t->weights_mu);
	for (struct weights *w = t->weights; w; w = w->next_all)
		atomic_store(&w->load.cancel, 1);
	while (t->loads_running)
		pthread_cond_wait(&t->weights_cv, &t->weights_mu);
	struct weights *all = t->weights;
	t->weights = NULL;
	pthread_mutex_unlock(&t->weights_mu);
	/* The kernel is gone: free whatever it still referenced. */
	for (struct weights *w = all, *next; w; w = next) {
		next = w->next_all;
		pthread_mutex_lock(&t->lock);
		if (w->ver->weights == w)
			w->ver->weights = NULL;
		pthread_mutex_unlock(&t->lock);
		pthread_mutex_lock(&w->mu);
		w->attached = 0;
		pthread_mutex_unlock(&w->mu);
		w->next_all = NULL;
		weights_free(w);
	}
}

/* ---- the namespace ------------------------------------------------------------- */

static bool rank_name(const char *name, int nranks, int *rank)
{
	if (strncmp(name, "rank", 4) != 0 || !isdigit((unsigned char)name[4]) ||
	    (name[4] == '0' && name[5]))
		return false;
	char *end;
	long r = strtol(name + 4, &end, 10);
	if (*end || r < 0 || r >= nranks)
		return false;
	*rank = (int)r;
	return true;
}

int weights_lookup(struct tree *t, struct node *dir, const char *name, struct node **out)
{
	struct weights *w = weights_of(dir);
	int rank;

	pthread_mutex_lock(&w->mu);
	bool gone = w->unloaded, ready = w->state == READY;
	pthread_mutex_unlock(&w->mu);
	if (gone)
		return -ENOENT;
	if (strcmp(name, file_names[WEIGHTS_STATUS]) == 0)
		*out = &w->files[WEIGHTS_STATUS];
	else if (strcmp(name, file_names[WEIGHTS_PUBLISH]) == 0)
		*out = &w->files[WEIGHTS_PUBLISH];
	else if (strcmp(name, file_names[WEIGHTS_MANIFEST]) == 0 && ready)
		*out = &w->files[WEIGHTS_MANIFEST];
	else if (rank_name(name, w->nranks, &rank))
		*out = &w->ranks[rank].node;
	else
		return -ENOENT;
	node_ref(*out);
	return 0;
}

int weights_getattr(struct tree *t, struct node *n, struct stat *st, double *timeout)
{
	struct weights *w = weights_of(n);

	memset(st, 0, sizeof(*st));
	st->st_ino = node_id(t, n);
	st->st_uid = t->cfg->uid;
	st->st_gid = t->cfg->gid;
	st->st_nlink = 1;
	st->st_blksize = 128 * 1024;
	st->st_atim.tv_sec = st->st_mtim.tv_sec = st->st_ctim.tv_sec = w->ver->created;
	*timeout = 0;
	pthread_mutex_lock(&w->mu);
	bool gone = w->unloaded;
	size_t manifest_len = w->manifest_len;
	pthread_mutex_unlock(&w->mu);
	if (gone)
		return -ENOENT;
	switch (n->type) {
	case NODE_WEIGHTS_DIR:
		st->st_mode = S_IFDIR | (0555 & ~t->cfg->umask);
		st->st_nlink = 2;
		break;
	case NODE_WEIGHTS_FILE:
		st->st_mode = S_IFREG | (0444 & ~t->cfg->umask);
		if (n->sub == WEIGHTS_MANIFEST) {
			st->st_size = (off_t)manifest_len; /* fixed once ready */
			*timeout = 1.0;
		}
		if (n->sub == WEIGHTS_PUBLISH)
			st->st_mode = S_IFREG | (0666 & ~t->cfg->umask);
		break;
	default: /* rank<k>: read-only, its content is the ioctl */
		st->st_mode = S_IFREG | (0444 & ~t->cfg->umask);
		break;
	}
	return 0;
}

static char *status_text(struct weights *w)
{
	static const char *const states[] = { "loading", "ready", "failed", "empty" };
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);

	if (!f)
		return NULL;
	pthread_mutex_lock(&w->mu);
	uint64_t done = atomic_load(&w->load.bytes_read);
	int64_t end = w->state == LOADING ? now_ns() : w->finished_ns;
	double secs = (double)(end - w->started_ns) / 1e9;
	if (w->status_kept) { /* taken over: as it was, and what changed since */
		fprintf(f, "%staken_over = yes (loaded by a daemon before this one)\nattached = %u\n",
			w->status_kept, w->attached);
		goto done;
	}
	fprintf(f, "state = %s\n", states[w->state]);
	if (w->gpu_direct || w->state == EMPTY) {
		fprintf(f, "source = %s\n", w->source[0] ? w->source : "gpu-direct (waiting for a publish)");
		fprintf(f, "ranks_published = %d/%d\n", w->ranks_published, w->nranks);
		fprintf(f, "gpus = %s\n", w->gpus);
		fprintf(f, "bytes_total = %" PRIu64 "\n", w->bytes_total);
		fprintf(f, "copy_seconds = %.6f\n", w->copy_seconds);
		fprintf(f, "open_seconds = %.6f\n", w->open_seconds);
		fprintf(f, "alloc_seconds = %.6f\n", w->alloc_seconds);
		fprintf(f, "seconds = %.6f\n", w->finished_ns ? (double)(w->finished_ns - w->started_ns) / 1e9 : 0.0);
		fprintf(f, "attached = %u\n", w->attached);
		fprintf(f, "error = %s\n", w->error);
		goto done;
	}
	fprintf(f, "source = checkpoint\n");
	fprintf(f, "checkpoint = %s\n", w->ckpt.dir);
	fprintf(f, "layout = %s\n", w->ckpt.layout == CHECKPOINT_HF ? "huggingface" : "vllm-sharded");
	fprintf(f, "gpus = %s\n", w->gpus);
	fprintf(f, "bytes_done = %" PRIu64 "\n", done);
	fprintf(f, "bytes_total = %" PRIu64 "\n", w->bytes_total);
	fprintf(f, "seconds = %.3f\n", secs);
	fprintf(f, "alloc_seconds = %.6f\n", w->alloc_seconds);
	fprintf(f, "rate_mb_per_s = %.1f\n", secs > 0 ? (double)done / secs / 1e6 : 0.0);
	fprintf(f, "load_threads = %u\n", w->load.readers);
	fprintf(f, "broadcast = %s\n", w->nranks == 1 || w->ckpt.layout != CHECKPOINT_HF ? "none"
				       : w->state == LOADING ? "pending"
				       : w->load.used_nccl ? "nccl" : "host");
	fprintf(f, "attached = %u\n", w->attached);
	fprintf(f, "error = %s\n", w->error);
done:
	pthread_mutex_unlock(&w->mu);
	if (fclose(f) != 0) {
		free(text);
		return NULL;
	}
	return text;
}

static const struct handle_ops rank_ops;
static int publish_open(struct tree *t, struct weights *w, int flags, struct handle **h,
			struct open_reply *r);

int weights_open(struct tree *t, struct node *n, int flags, struct handle **h,
		 struct open_reply *r)
{
	struct weights *w = weights_of(n);

	if (n->type == NODE_WEIGHTS_FILE && n->sub == WEIGHTS_PUBLISH)
		return publish_open(t, w, flags, h, r);
	if ((flags & O_ACCMODE) != O_RDONLY)
		return -EACCES;
	if (n->type == NODE_WEIGHTS_FILE) {
		char *text;
		if (n->sub == WEIGHTS_STATUS) {
			text = status_text(w);
			r->direct_io = true;
		} else {
			pthread_mutex_lock(&w->mu);
			text = w->manifest ? strdup(w->manifest) : NULL;
			pthread_mutex_unlock(&w->mu);
			r->keep_cache = true;
		}
		return text ? text_open(text, h, r) : -ENOMEM;
	}
	if (n->type != NODE_WEIGHTS_RANK)
		return -EISDIR;
	struct rank_handle *rh = calloc(1, sizeof(*rh));
	if (!rh)
		return -ENOMEM;
	pthread_mutex_lock(&w->mu);
	if (w->unloaded) {
		pthread_mutex_unlock(&w->mu);
		free(rh);
		return -ENOENT;
	}
	w->attached++;
	w->ranks[n->sub].attached++;
	pthread_mutex_unlock(&w->mu);
	handle_init(&rh->h, &rank_ops);
	rh->w = w;
	rh->rank = n->sub;
	node_ref(&w->node);
	r->direct_io = true;
	r->noflush = true;
	*h = &rh->h;
	return 0;
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
	release_gpu_locked(w);
	pthread_mutex_unlock(&w->mu);
	node_unref(&w->node, 1);
	free(rh);
}

void weights_list(struct tree *t, struct node *dir,
		  void (*add)(void *ctx, const char *name, uint64_t ino, unsigned char type), void *ctx)
{
	struct weights *w = weights_of(dir);
	char name[16];

	pthread_mutex_lock(&w->mu);
	bool ready = w->state == READY, gone = w->unloaded;
	pthread_mutex_unlock(&w->mu);
	if (gone)
		return;
	if (ready)
		add(ctx, file_names[WEIGHTS_MANIFEST], node_id(t, &w->files[WEIGHTS_MANIFEST]), DT_REG);
	add(ctx, file_names[WEIGHTS_STATUS], node_id(t, &w->files[WEIGHTS_STATUS]), DT_REG);
	add(ctx, file_names[WEIGHTS_PUBLISH], node_id(t, &w->files[WEIGHTS_PUBLISH]), DT_REG);
	for (int r = 0; r < w->nranks; r++) {
		snprintf(name, sizeof(name), "rank%d", r);
		add(ctx, name, node_id(t, &w->ranks[r].node), DT_REG);
	}
}

/* ---- kept by the holder (DESIGN.md §8) ---------------------------------------------- */

#define KEPT_ROOT "w/"

/* The tags of wv's weights begin with "w/<sha256(wv), 32 hex digits>/":
 * a version's name may be longer than a tag. */
static void kept_prefix(const char *wv, char out[48])
{
	uint8_t sum[32];
	char hex[65];

	sha256_once(wv, strlen(wv), sum);
	key_hex(sum, 16, hex);
	snprintf(out, 48, KEPT_ROOT "%.32s/", hex);
}

/* text without its "attached = " line (it changes; status says it anew). */
static void drop_attached_line(char *text)
{
	char *line = strstr(text, "attached = ");
	if (line && (line == text || line[-1] == '\n')) {
		char *end = strchr(line, '\n');
		memmove(line, end ? end + 1 : line + strlen(line), strlen(end ? end + 1 : "") + 1);
	}
}

/* The record of ready weights w (with w->mu held); NULL without memory. */
static char *record_of(struct weights *w, char *status, size_t *len)
{
	struct wrecord *rec = calloc(1, sizeof(*rec));
	char *out = NULL;

	if (!rec)
		return NULL;
	snprintf(rec->version, sizeof(rec->version), "%s", w->ver->name);
	snprintf(rec->quant_method, sizeof(rec->quant_method), "%s", w->ckpt.quant_method);
	rec->quant_block_fp8 = w->ckpt.quant_block_fp8;
	rec->status = status;
	rec->manifest = w->manifest;
	rec->manifest_len = w->manifest_len;
	rec->nranks = w->nranks;
	for (int r = 0; r < w->nranks; r++) {
		rec->ranks[r].device = w->ranks[r].device;
		memcpy(rec->ranks[r].uuid, w->ranks[r].dev.uuid, 16);
		rec->ranks[r].slab_size = w->granks[r].slab_size;
		rec->ranks[r].bytes = w->ranks[r].total_bytes;
		rec->ranks[r].fp = w->ranks[r].fp;
	}
	out = wrecord_encode(rec, len);
	free(rec);
	return out;
}

/* A memfd holding len bytes of text, or -errno. */
static int memfd_with(const char *name, const char *text, size_t len)
{
	int fd = memfd_create(name, MFD_CLOEXEC);
	if (fd < 0)
		return -errno;
	int rc = store_pwrite_all(fd, text, len, 0);
	if (rc < 0) {
		close(fd);
		return rc;
	}
	return fd;
}

/* Hands the holder w's slab descriptors, then its record (last: a record
 * names slabs that are all kept). w is ready; not called with w->mu held. */
static void weights_keep(struct weights *w)
{
	struct tree *t = w->t;
	char *status = status_text(w), prefix[48], tag[KEEPER_TAG_MAX];
	size_t len = 0;
	int rc = 0, memfd = -1;

	if (!status)
		return;
	drop_attached_line(status);
	kept_prefix(w->ver->name, prefix);
	pthread_mutex_lock(&w->mu);
	if (w->unloaded || w->state != READY || w->kept)
		goto out;
	char *bytes = record_of(w, status, &len);
	rc = bytes ? memfd_with("artfs-weights", bytes, len) : -ENOMEM;
	free(bytes);
	memfd = rc;
	for (int r = 0; r < w->nranks && rc >= 0; r++) {
		snprintf(tag, sizeof(tag), "%ss%d", prefix, r);
		rc = keeper_link_keep(&t->keeper, tag, w->granks[r].fd);
	}
	if (rc >= 0) {
		snprintf(tag, sizeof(tag), "%smeta", prefix);
		rc = keeper_link_keep(&t->keeper, tag, memfd);
	}
	if (rc < 0) {
		if (rc != -ENOTCONN) {
			keeper_link_drop(&t->keeper, prefix, true);
			log_warn("weights %s: the holder does not keep them (%s): they will not outlive "
				 "this daemon", w->ver->name, strerror(-rc));
		}
		goto out;
	}
	w->kept = true;
	snprintf(w->kept_tag, sizeof(w->kept_tag), "%s", prefix);
	log_info("weights %s: the holder keeps their %d slab%s", w->ver->name, w->nranks,
		 w->nranks > 1 ? "s" : "");
out:
	pthread_mutex_unlock(&w->mu);
	if (memfd >= 0)
		close(memfd);
	free(status);
}

/* Drops what the holder keeps of w (with w->mu held): unloaded. */
static void weights_unkeep_locked(struct weights *w)
{
	if (!w->kept)
		return;
	int rc = keeper_link_drop(&w->t->keeper, w->kept_tag, true);
	if (rc < 0)
		log_warn("weights %s: the holder may still keep their GPU memory: %s", w->ver->name,
			 strerror(-rc));
	w->kept = false;
}

/* What the holder keeps under KEPT_ROOT, as found at a takeover. */
struct kept_fd {
	char tag[KEEPER_TAG_MAX];
	int fd;
};

/* The descriptor kept under tag among k[0..n) (taken: -1 left there), or -1. */
static int kept_take(struct kept_fd *k, size_t n, const char *tag)
{
	for (size_t i = 0; i < n; i++)
		if (k[i].fd >= 0 && strcmp(k[i].tag, tag) == 0) {
			int fd = k[i].fd;
			k[i].fd = -1;
			return fd;
		}
	return -1;
}

/* The record in memfd fd, decoded. */
static int kept_record(int fd, struct wrecord *rec, char *err, size_t errlen)
{
	struct stat st;

	if (fstat(fd, &st) < 0 || st.st_size <= 0 || (uint64_t)st.st_size > WRECORD_BYTES_MAX) {
		snprintf(err, errlen, "its record is not a file of a size it may have");
		return -EINVAL;
	}
	void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	if (p == MAP_FAILED) {
		snprintf(err, errlen, "its record: %s", strerror(errno));
		return -EINVAL;
	}
	int rc = wrecord_decode(p, (size_t)st.st_size, rec, err, errlen);
	munmap(p, (size_t)st.st_size);
	return rc;
}

/* Ready weights from a record and their slabs' descriptors (taken). */
static struct weights *weights_from_record(struct tree *t, struct version *v, struct wrecord *rec,
					   const int *fds)
{
	struct weights *w = calloc(1, sizeof(*w) + (size_t)rec->nranks * sizeof(struct weights_rank));
	struct gpu_rank *g = calloc((size_t)rec->nranks, sizeof(*g));

	if (!w || !g) {
		free(w);
		free(g);
		return NULL;
	}
	w->t = t;
	w->ver = v;
	w->nranks = rec->nranks;
	init_nodes(w, rec->nranks);
	w->state = READY;
	w->thread_done = true;
	w->granks = g;
	w->load.ranks = g;
	w->load.nranks = rec->nranks;
	for (int r = 0; r < rec->nranks; r++) {
		struct weights_rank *wr = &w->ranks[r];
		wr->device = rec->ranks[r].device;
		wr->dev.index = rec->ranks[r].device;
		memcpy(wr->dev.uuid, rec->ranks[r].uuid, 16);
		wr->fp = rec->ranks[r].fp;
		wr->total_bytes = rec->ranks[r].bytes;
		g[r] = (struct gpu_rank){ .device = wr->device, .slab_size = rec->ranks[r].slab_size,
					  .fd = fds[r] };
		w->bytes_total += rec->ranks[r].bytes;
	}
	snprintf(w->ckpt.quant_method, sizeof(w->ckpt.quant_method), "%s", rec->quant_method);
	w->ckpt.quant_block_fp8 = rec->quant_block_fp8;
	w->manifest = rec->manifest;
	w->manifest_len = rec->manifest_len;
	w->status_kept = rec->status;
	rec->manifest = rec->status = NULL;
	w->started_ns = w->finished_ns = now_ns();
	return w;
}

/* Serves the weights that prefix's tags keep: 0, or -errno (why in err;
 * the caller drops the tags). */
static int take_over_one(struct tree *t, const char *prefix, int meta, struct kept_fd *k, size_t n,
			 char *err, size_t errlen)
{
	struct wrecord *rec = calloc(1, sizeof(*rec));
	int fds[WRECORD_RANKS_MAX], rc;
	char tag[KEEPER_TAG_MAX], want[48];

	if (!rec)
		return -ENOMEM;
	rc = kept_record(meta, rec, err, errlen);
	if (rc < 0) {
		free(rec);
		return rc;
	}
	kept_prefix(rec->version, want);
	if (strcmp(want, prefix) != 0 || !key_version_name_valid(rec->version)) {
		snprintf(err, errlen, "its record names version \"%s\", not that of its tags", rec->version);
		rc = -EINVAL;
	}
	for (int r = 0; r < rec->nranks; r++)
		fds[r] = -1;
	for (int r = 0; r < rec->nranks && rc == 0; r++) {
		snprintf(tag, sizeof(tag), "%ss%d", want, r);
		if ((fds[r] = kept_take(k, n, tag)) < 0) {
			snprintf(err, errlen, "the slab of rank %d is not kept", r);
			rc = -EINVAL;
		}
	}
	struct version *v = rc == 0 ? version_for(t, rec->version, &rc) : NULL;
	struct weights *w = v ? weights_from_record(t, v, rec, fds) : NULL;
	if (v && !w) {
		node_unref(&v->node, 1);
		rc = -ENOMEM;
	}
	if (w) {
		pthread_mutex_lock(&t->lock);
		bool taken = v->removed || v->weights;
		if (!taken)
			v->weights = w;
		pthread_mutex_unlock(&t->lock);
		if (taken) {
			snprintf(err, errlen, "its version has other weights");
			weights_free(w); /* closes the descriptors it took */
			rc = -EEXIST;
		} else {
			w->kept = true;
			memcpy(w->kept_tag, want, sizeof(want));
			all_add(t, w, false);
			log_info("weights %s: taken over from the daemon before (%d rank%s, %" PRIu64
				 " bytes), nothing read again", w->ver->name, w->nranks,
				 w->nranks > 1 ? "s" : "", w->bytes_total);
		}
	} else {
		for (int r = 0; r < rec->nranks; r++)
			if (fds[r] >= 0)
				close(fds[r]);
	}
	wrecord_free(rec);
	free(rec);
	return rc;
}

void weights_take_over(struct tree *t)
{
	struct kept_fd *k = NULL;
	size_t n = 0, cap = 0;
	char err[256];

	for (uint32_t i = 0;; i++) {
		struct kept_fd one;
		int rc = keeper_link_next(&t->keeper, KEPT_ROOT, i, one.tag, &one.fd);
		if (rc < 0) {
			if (rc != -ENOENT && rc != -ENOTCONN)
				log_err("takeover: cannot learn what the holder keeps: %s", strerror(-rc));
			break;
		}
		if (n == cap) {
			struct kept_fd *more = realloc(k, (cap = cap ? cap * 2 : 16) * sizeof(*k));
			if (!more) {
				close(one.fd);
				break;
			}
			k = more;
		}
		k[n++] = one;
	}
	for (size_t i = 0; i < n; i++) {
		size_t len = strlen(k[i].tag);
		if (k[i].fd < 0 || len < 5 || strcmp(k[i].tag + len - 5, "/meta") != 0)
			continue;
		char prefix[KEEPER_TAG_MAX];
		snprintf(prefix, sizeof(prefix), "%.*s", (int)(len - 4), k[i].tag);
		int meta = k[i].fd;
		k[i].fd = -1;
		if (take_over_one(t, prefix, meta, k, n, err, sizeof(err)) < 0) {
			log_err("takeover: the weights the holder keeps under %s are dropped: %s", prefix,
				err);
			keeper_link_drop(&t->keeper, prefix, true);
		}
		close(meta);
	}
	/* Slabs without a record: a daemon died while it handed them over. */
	for (size_t i = 0; i < n; i++)
		if (k[i].fd >= 0) {
			log_warn("takeover: %s is kept without a record of its weights: dropped", k[i].tag);
			keeper_link_drop(&t->keeper, k[i].tag, false);
			close(k[i].fd);
		}
	free(k);
}

/* ---- nodes a daemon before gave ids ------------------------------------------------- */

void weights_describe_node(const struct node *n, struct held_node *d)
{
	if (n->type != NODE_WEIGHTS_DIR && n->type != NODE_WEIGHTS_FILE && n->type != NODE_WEIGHTS_RANK)
		return;
	const struct weights *w = (const struct weights *)n->owner;
	size_t len = strlen(w->ver->name);
	d->name_len = (uint8_t)(len > HELD_NAME_MAX ? HELD_NAME_MAX : len);
	memcpy(d->name, w->ver->name, d->name_len);
	d->name[d->name_len] = '\0';
	d->sub = n->sub;
}

struct node *weights_revive_node(struct tree *t, const struct held_node *r)
{
	char name[HELD_NAME_MAX + 1];
	uint8_t type = atomic_load(&r->type);
	struct node *n = NULL;

	memcpy(name, r->name, r->name_len);
	name[r->name_len] = '\0';
	pthread_mutex_lock(&t->lock);
	struct version *v = index_version_find(&t->idx, name);
	struct weights *w = v ? v->weights : NULL;
	if (w && type == NODE_WEIGHTS_DIR)
		n = &w->dir;
	else if (w && type == NODE_WEIGHTS_FILE && r->sub < WEIGHTS_FILE_COUNT)
		n = &w->files[r->sub];
	else if (w && type == NODE_WEIGHTS_RANK && r->sub < w->nranks)
		n = &w->ranks[r->sub].node;
	if (n)
		node_ref(n);
	pthread_mutex_unlock(&t->lock);
	return n;
}

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
	if (!quant_allowed(t, &w->ckpt)) {
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
	memset(out->reserved, 0, sizeof(out->reserved));
	int rc = grants_issue(&t->grants, rh, now_ns(), out->token);
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
	return grants_take(&t->grants, token, now_ns(), slabs_of_grant, &ask);
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

static const struct handle_ops rank_ops = {
	.kind = "rank",
	.held_kind = HANDLE_RANK,
	.read = rank_read,
	.ioctl = rank_ioctl,
	.poll = rank_poll,
	.release = rank_release,
	.release_slow = true, /* the last one may free GPU memory */
};

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
	init_nodes(w, RANKS_MAX);
	w->state = EMPTY;
	w->gpu_direct = true;
	w->thread_done = true; /* no load thread */
	w->gpu_freed = true;   /* nothing allocated yet */
	w->load.ranks = w->granks;
	w->started_ns = now_ns();

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
	all_add(t, w, false);
	log_info("weights %s: empty, waiting for a GPU-direct publish", v->name);
	return 0;
}

struct publish_handle {
	struct handle h;
	struct weights *w;           /* referenced */
	pthread_mutex_t mu;
	uint8_t *buf;
	size_t len, cap;
	bool done, too_long;
	int result;
	char reply[384];
};

static const struct handle_ops publish_ops;

static int publish_open(struct tree *t, struct weights *w, int flags, struct handle **h,
			struct open_reply *r)
{
	(void)t;
	if ((flags & O_ACCMODE) == O_RDONLY)
		return -EACCES;
	struct publish_handle *ph = calloc(1, sizeof(*ph));
	if (!ph)
		return -ENOMEM;
	handle_init(&ph->h, &publish_ops);
	pthread_mutex_init(&ph->mu, NULL);
	ph->w = w;
	node_ref(&w->node);
	r->direct_io = true; /* the reply is read with pread(fd, .., 0) after fsync */
	*h = &ph->h;
	return 0;
}

static int publish_write(struct tree *t, struct handle *h, uint64_t off, const void *buf, size_t len,
			 uint64_t owner)
{
	struct publish_handle *ph = (struct publish_handle *)h;
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

/* Where each tensor goes in the slab: blob order, 256-byte aligned; tensors
 * with the same handle, offset and size (tied) share one place and one copy. */
static int plan_publish(const struct wblob *b, struct gpu_piece *pieces, struct gpu_copy **copies,
			size_t *ncopies, uint64_t *slab_size, uint64_t *bytes)
{
	size_t n = b->ntensors;
	struct gpu_copy *c = malloc(n * sizeof(*c));

	if (!c)
		return -ENOMEM;
	/* tied: a simple hash of (handle, offset, size) over an open table */
	size_t cap = 1;
	while (cap < 2 * n)
		cap *= 2;
	size_t *tab = malloc(cap * sizeof(*tab));
	if (!tab) {
		free(c);
		return -ENOMEM;
	}
	for (size_t i = 0; i < cap; i++)
		tab[i] = SIZE_MAX;
	uint64_t at = 0;
	*ncopies = 0;
	*bytes = 0;
	for (size_t i = 0; i < n; i++) {
		const struct wblob_tensor *x = &b->tensors[i];
		uint64_t hsh = (x->src_offset * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)x->handle << 40) ^ x->t.size;
		size_t k = (size_t)(hsh ^ (hsh >> 29)) & (cap - 1);
		size_t found = SIZE_MAX;
		for (; tab[k] != SIZE_MAX; k = (k + 1) & (cap - 1)) {
			const struct wblob_tensor *y = &b->tensors[tab[k]];
			if (y->handle == x->handle && y->src_offset == x->src_offset && y->t.size == x->t.size) {
				found = tab[k];
				break;
			}
		}
		if (found != SIZE_MAX) {
			pieces[i] = pieces[found];
			continue;
		}
		tab[k] = i;
		at = align_up(at, ARTFS_TENSOR_ALIGN);
		pieces[i] = (struct gpu_piece){ .size = x->t.size, .slab_offset = at };
		c[(*ncopies)++] = (struct gpu_copy){ .handle = x->handle, .src_offset = x->src_offset,
						     .size = x->t.size, .slab_offset = at };
		at += x->t.size;
		*bytes += x->t.size;
	}
	free(tab);
	*copies = c;
	*slab_size = align_up(at ? at : 1, ARTFS_SLAB_ALIGN);
	return 0;
}

/* The fingerprint of a published rank: the revision hashes its tensor table
 * (name, dtype, shape, in blob order); dtypes is the sorted set. */
static void publish_fingerprint(struct weights *w, int r, const struct wblob *b)
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
	fingerprint_device(fp, d);
}

/* Takes the blob's tensor table as rank r's own (names copied). */
static int publish_keep(struct weights_rank *wr, const struct wblob *b, struct gpu_piece *pieces)
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
struct publish_job {
	struct wblob b;
	int rank;
	struct gpu_piece *pieces;    /* b.ntensors; the rank's once it is published */
	uint64_t bytes;
	struct gpu_rank dst;
	struct gpu_publish gp;
	struct gpu_device dev;       /* dst's, when dev_known */
	bool dev_known;
};

/* Claims the blob's rank of w for this publish: w waits for it (made by
 * mkdir, not loaded, the rank neither published nor being published) and
 * the blob's tp_size is that of the ranks before it. */
static int publish_claim(struct weights *w, const struct wblob *b, char *err, size_t errlen)
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
static int publish_copy(struct publish_job *j, char *err, size_t errlen)
{
	struct gpu_copy *copies = NULL;
	size_t ncopies = 0;
	uint64_t slab_size = 0;

	j->pieces = calloc(j->b.ntensors, sizeof(*j->pieces));
	int rc = j->pieces ? plan_publish(&j->b, j->pieces, &copies, &ncopies, &slab_size, &j->bytes)
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
		const struct gpu_device *d = device_find(devs, ndevs, j->dst.device);
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
static int publish_ready_locked(struct weights *w, const struct artfs_publish_header *head,
				char *err, size_t errlen)
{
	snprintf(w->ckpt.architecture, sizeof(w->ckpt.architecture), "%s", head->architecture);
	snprintf(w->ckpt.quant_method, sizeof(w->ckpt.quant_method), "%s", head->quant_method);
	char *m = build_manifest(w);
	if (!m) {
		snprintf(err, errlen, "out of memory building the manifest");
		return -ENOMEM;
	}
	w->manifest = m;
	w->manifest_len = strlen(m);
	w->state = READY;
	w->finished_ns = now_ns();
	return 0;
}

/* The copied rank becomes w's: its GPU, slab, tensors and fingerprint, and
 * w's totals; the last rank makes w ready. With w->mu held. */
static int publish_rank_locked(struct weights *w, const struct publish_job *j, char *err,
			       size_t errlen)
{
	const int r = j->rank;
	struct weights_rank *wr = &w->ranks[r];

	wr->device = j->dst.device;
	wr->total_bytes = j->bytes;
	wr->published = true;
	if (j->dev_known)
		wr->dev = j->dev;
	publish_fingerprint(w, r, &j->b);
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
	return publish_ready_locked(w, &j->b.head, err, errlen);
}

/* Settles the publish (rc: the copy's) in w: the rank is published, or it
 * waits for a publish again and what was made for it is freed. */
static int publish_settle(struct weights *w, struct publish_job *j, int rc, char *err, size_t errlen)
{
	pthread_mutex_lock(&w->mu);
	struct weights_rank *wr = &w->ranks[j->rank];
	wr->publishing = false;
	if (rc == 0 && (w->unloaded || publish_keep(wr, &j->b, j->pieces) < 0)) {
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
		rc = publish_rank_locked(w, j, err, errlen);
	}
	pthread_mutex_unlock(&w->mu);
	return rc;
}

static int publish_run(struct tree *t, struct publish_handle *ph)
{
	struct weights *w = ph->w;
	const char *wv = w->ver->name;
	struct publish_job j;
	char err[256] = "";
	int rc;
	int64_t t0 = now_ns();

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
	rc = publish_claim(w, &j.b, err, sizeof(err));
	if (rc == 0) {
		rc = publish_copy(&j, err, sizeof(err));
		rc = publish_settle(w, &j, rc, err, sizeof(err));
	}
	if (rc == 0) {
		log_info("weights %s: rank %d published from GPU %d onto GPU %d%s: %zu tensors, %" PRIu64
			 " bytes, copied in %.4f s (%.0f GB/s), %.4f s in all", wv, j.rank,
			 j.gp.source_device, j.dst.device, j.gp.peer ? " (peer to peer)" : "", j.b.ntensors,
			 j.bytes, j.gp.copy_seconds,
			 j.gp.copy_seconds > 0 ? (double)j.bytes / j.gp.copy_seconds / 1e9 : 0.0,
			 (double)(now_ns() - t0) / 1e9);
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

static int publish_finish(struct tree *t, struct publish_handle *ph)
{
	pthread_mutex_lock(&ph->mu);
	if (!ph->done && (ph->len || ph->too_long)) {
		ph->result = publish_run(t, ph);
		ph->done = true;
		free(ph->buf);
		ph->buf = NULL;
		ph->len = ph->cap = 0;
	}
	int rc = ph->result;
	pthread_mutex_unlock(&ph->mu);
	return rc;
}

static int publish_fsync(struct tree *t, struct handle *h)
{
	return publish_finish(t, (struct publish_handle *)h);
}

static int publish_flush(struct tree *t, struct handle *h, uint64_t owner)
{
	(void)owner;
	return publish_finish(t, (struct publish_handle *)h);
}

static int publish_read(struct tree *t, struct handle *h, uint64_t off, size_t size,
			const void **data, size_t *len)
{
	struct publish_handle *ph = (struct publish_handle *)h;
	size_t n;

	(void)t;
	pthread_mutex_lock(&ph->mu);
	n = ph->done ? strlen(ph->reply) : 0;
	pthread_mutex_unlock(&ph->mu);
	buffer_slice(ph->reply, n, off, size, data, len);
	return 0;
}

static void publish_release(struct tree *t, struct handle *h)
{
	struct publish_handle *ph = (struct publish_handle *)h;

	(void)t;
	free(ph->buf);
	pthread_mutex_destroy(&ph->mu);
	node_unref(&ph->w->node, 1);
	free(ph);
}

static bool publish_never_quick(struct tree *t, struct handle *h)
{
	(void)t, (void)h;
	return false;
}

static const struct handle_ops publish_ops = {
	.kind = "weights-publish",
	.held_kind = HANDLE_WEIGHTS_PUBLISH,
	.read = publish_read,
	.write = publish_write,
	.flush = publish_flush,
	.fsync = publish_fsync,
	.release = publish_release,
	.flush_quick = publish_never_quick,
};
