/* SPDX-License-Identifier: Apache-2.0 */
/* Preloaded GPU weights in the namespace (DESIGN.md §4):
 *
 *   <wv>/weights/manifest.json   tensor table and fingerprint, once ready
 *   <wv>/weights/status          state, bytes done/total, rate, error
 *   <wv>/weights/rank<k>         open it and ioctl(ARTFS_IOC_ATTACH)
 *   <wv>/weights/.publish        GPU-direct publish (write a blob, fsync)
 *
 * A load runs in its own thread through the GPU backend (gpu/); without
 * one, or without a device, a load answers ENODEV. An open rank<k> file is
 * an attachment: unload removes weights/ from the namespace at once and
 * frees GPU memory when the last attached file closes. */
#ifndef ARTFS_WEIGHTS_H
#define ARTFS_WEIGHTS_H

#include <stdint.h>

#include "artfs/artfs.h"
#include "format/safetensors.h"
#include "state/base.h"

enum weights_file { WEIGHTS_MANIFEST = 0, WEIGHTS_STATUS, WEIGHTS_PUBLISH, WEIGHTS_FILE_COUNT };

/* Starts loading the checkpoint in dir as the weights of version wv (made
 * if missing) onto the GPUs listed in gpus ("" = all for a Hugging Face
 * checkpoint, 0..R-1 for a sharded one). Returns once the checkpoint is
 * checked and the load thread runs: 0, -ENODEV (no GPU support), -ENOENT,
 * -EINVAL (the checkpoint or the GPU list), -EEXIST (already loaded). */
int weights_load(struct tree *t, const char *wv, const char *dir, const char *gpus);
/* mkdir <wv>/weights: an empty weights/ whose .publish takes a GPU-direct
 * publish of each rank (DESIGN.md §4.3). Returns 0 with the referenced
 * directory node in *out, -EEXIST (v has weights), -ENOENT (v removed). */
int weights_mkdir(struct tree *t, struct version *v, struct node **out);
/* Removes wv's weights from the namespace. -ENOENT if none. */
int weights_unload(struct tree *t, const char *wv);
/* Loads the config file's weights.<wv> = dir lines (logged, not fatal). */
void weights_preload(struct tree *t);
/* Cancels loads, waits for them, frees every weight's GPU memory. */
void weights_shutdown(struct tree *t);

/* The namespace under <wv>/weights. */
struct node *weights_dir_node(struct weights *w);
int weights_lookup(struct tree *t, struct node *dir, const char *name, struct node **out);
int weights_getattr(struct tree *t, struct node *n, struct stat *st, double *timeout);
int weights_open(struct tree *t, struct node *n, int flags, struct handle **h,
		 struct open_reply *r);
/* Names under <wv>/weights for a listing: calls add for each. */
void weights_list(struct tree *t, struct node *dir,
		  void (*add)(void *ctx, const char *name, uint64_t ino, unsigned char type), void *ctx);
/* The descriptors of the slabs that an attach token grants (the resolver
 * of the .artfs/attach socket, src/weights/socket.h; ctx is the tree). */
struct attach_slabs;
int weights_slabs_of_token(void *ctx, const uint8_t token[ARTFS_ATTACH_TOKEN_SIZE],
			   struct attach_slabs *out);

/* After a daemon before this one: serves again every weights the holder
 * keeps (their records and slabs), without reading a checkpoint; what it
 * cannot serve is dropped (logged). */
void weights_take_over(struct tree *t);
/* What a held node record says of a weights node (ids.c's hook), and the
 * node such a record names now (referenced), or NULL. */
struct held_node;
void weights_describe_node(const struct node *n, struct held_node *d);
struct node *weights_revive_node(struct tree *t, const struct held_node *r);

/* The checks of the request itself, pure (fuzzed on its own): the abi
 * version and, when loaded is given, the expected fingerprint against it.
 * Returns 0, -EINVAL (unknown abi) or -ESTALE; *why names what differs. */
int weights_attach_check(const struct artfs_attach *req, const struct artfs_fingerprint *loaded,
			 const char **why);

/* The layout of a rank's slab (layout.c, pure, unit-tested): tensors in
 * name order, each 256-byte aligned, a group of tied tensors (alias[i]: the
 * index whose bytes t[i] shares, or SIZE_MAX; NULL: none) once, where its
 * first name falls; the slab a multiple of 2 MiB. The same tensors give the
 * same offsets whatever their order. 0 or -ENOMEM. */
int weights_layout_place(const struct safetensors_tensor *const *t, const size_t *alias, size_t n,
			 uint64_t *offsets, uint64_t *slab_size);
/* SHA-256 over the canonical (name, dtype, shape, slab, offset, size) list
 * and the slab sizes: equal digests, one layout (manifest.json's
 * ranks[k].layout, the attach reply's layout). 0 or -ENOMEM. */
int weights_layout_digest(const struct safetensors_tensor *const *t, const uint64_t *offsets,
			  size_t n, uint64_t slab_size, uint8_t out[32]);

#endif
