/* SPDX-License-Identifier: Apache-2.0 */
/* What the files of src/weights/ share (other folders see only
 * weights/weights.h): the weights and their ranks, and the functions one
 * file of the folder gives the others. */
#ifndef ARTFS_WEIGHTS_I_H
#define ARTFS_WEIGHTS_I_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "artfs/artfs.h"
#include "format/checkpoint.h"
#include "gpu/gpu.h"
#include "state/base.h"
#include "weights/weights.h"

#define RANKS_MAX 64

struct weights_rank {
	struct node node;            /* rank<k>: owned by the weights */
	int device;
	struct gpu_device dev;
	struct artfs_fingerprint fp;
	uint64_t total_bytes;        /* tensor bytes */
	uint8_t layout[32];          /* weights_layout_digest of the slab; 0s: unknown */
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

/* weights.c: the registry, GPU memory lifetime, status. */
int64_t weights_now_ns(void);
/* Lets go of the slabs once unloaded and the load thread finished (w->mu held). */
void weights_release_gpu_locked(struct weights *w);
void weights_free(struct weights *w);
/* The weights node and the nodes it owns, sharing its count. */
void weights_init_nodes(struct weights *w, int nranks);
/* Puts w on the tree's list; a load also counts as running. */
void weights_all_add(struct tree *t, struct weights *w, bool loading);
/* wv's version (referenced), made if missing; NULL with -errno in *rc. */
struct version *weights_version_for(struct tree *t, const char *wv, int *rc);
/* The status file's text (malloc'd), or NULL without memory. */
char *weights_status_text(struct weights *w);

/* load.c: planning a load. */
uint64_t weights_align_up(uint64_t v, uint64_t a);
const struct gpu_device *weights_device_find(const struct gpu_device *devs, int n, int index);
/* Whether c's quantization is served zero-copy (allow_quant=). */
bool weights_quant_allowed(struct tree *t, const struct checkpoint *c);

/* manifest.c: fingerprints and manifest.json. */
void weights_fingerprint_device(struct artfs_fingerprint *fp, const struct gpu_device *d);
void weights_fingerprint(struct weights *w, int r, int tp_size);
char *weights_build_manifest(struct weights *w);
/* Each rank's layout digest, as w->manifest says it (taken over). */
void weights_layouts_from_manifest(struct weights *w);
/* Places rank wr's tensors (wr->tensors, wr->pieces: npieces; alias as
 * weights_layout_place) and sets their slab offsets, *slab_size and
 * wr->layout. 0 or -ENOMEM. */
int weights_rank_layout(struct weights_rank *wr, const size_t *alias, uint64_t *slab_size);

/* keep.c: kept by the holder (DESIGN.md §8). */
void weights_keep(struct weights *w);
void weights_unkeep_locked(struct weights *w);

/* attach.c: the handle of an open rank<k>. */
extern const struct handle_ops rank_ops;

/* direct.c: opening .publish for a GPU-direct publish. */
int direct_open(struct tree *t, struct weights *w, int flags, struct handle **h,
		struct open_reply *r);

#endif
