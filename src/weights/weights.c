/* SPDX-License-Identifier: Apache-2.0 */
/* The weights of each version: the registry (the tree's list and the
 * version's pointer, the version made for weights), their GPU memory's
 * lifetime, shutdown, and their status text. The rest of the folder:
 * load.c (a load, and unload), manifest.c, files.c (the weights/ nodes), attach.c (rank<k>), keep.c
 * (kept by the holder), direct.c (the GPU-direct publish), socket.c (the
 * attach socket); weights_i.h is what they share. */
#include "autoconf.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu/gpu.h"
#include "lib/log.h"
#include "weights/weights.h"
#include "weights/weights_i.h"

int64_t weights_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---- GPU memory lifetime ---------------------------------------------------- */

/* Lets go of the slabs once this daemon is done with them: unloaded (or
 * shutting down) and the load thread finished. An engine's mapping keeps
 * the memory of the slabs it attached until it unmaps them (or ends), and
 * the holder's descriptors keep that of kept weights for the next daemon.
 * Called with w->mu held. */
void weights_release_gpu_locked(struct weights *w)
{
	if (w->gpu_freed || !w->unloaded || !w->thread_done)
		return;
	gpu_unload(&w->load);
	w->gpu_freed = true;
	log_info("weights %s: this daemon let go of their GPU memory%s", w->ver->name,
		 w->kept ? " (the holder keeps it)" : w->attached ? " (attached engines still map it)"
								   : "");
}

void weights_free(struct weights *w)
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
	weights_release_gpu_locked(w);
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
void weights_init_nodes(struct weights *w, int nranks)
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

/* ---- the registry and shutdown ---------------------------------------------------- */

/* Puts w on the tree's list, which shutdown frees; a load also counts as
 * running until its thread ends. */
void weights_all_add(struct tree *t, struct weights *w, bool loading)
{
	pthread_mutex_lock(&t->weights_mu);
	w->next_all = t->weights;
	t->weights = w;
	if (loading)
		t->loads_running++;
	pthread_mutex_unlock(&t->weights_mu);
}

struct version *weights_version_for(struct tree *t, const char *wv, int *rc)
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

/* ---- status ------------------------------------------------------------------ */

char *weights_status_text(struct weights *w)
{
	static const char *const states[] = { "loading", "ready", "failed", "empty" };
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);

	if (!f)
		return NULL;
	pthread_mutex_lock(&w->mu);
	uint64_t done = atomic_load(&w->load.bytes_read);
	int64_t end = w->state == LOADING ? weights_now_ns() : w->finished_ns;
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
		fprintf(f, "seconds = %.6f\n",
			w->finished_ns ? (double)(w->finished_ns - w->started_ns) / 1e9 : 0.0);
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
