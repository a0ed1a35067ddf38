/* SPDX-License-Identifier: Apache-2.0 */
/* A checkpoint directory for the weight loader (DESIGN.md §4.1, §4.2):
 * which safetensors files, which rank each goes to, and what the
 * fingerprint says about them.
 *
 * Layout A, Hugging Face: every *.safetensors file (or, with a
 * model.safetensors.index.json, exactly the files its weight_map names),
 * every tensor on every rank. Layout B, vLLM sharded state: files
 * model-rank-<k>-part-<p>.safetensors, rank k's files on rank k, ranks
 * 0..R-1 with none missing. Names starting with '.' are ignored, as a glob
 * would; symlinks are followed (Hugging Face caches link into blobs/) but
 * must end at regular files. */
#ifndef ARTFS_CHECKPOINT_H
#define ARTFS_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "format/safetensors.h"

#define CHECKPOINT_FILES_MAX 100000
#define CHECKPOINT_TENSORS_MAX 4000000
#define CHECKPOINT_RANKS_MAX 4096
#define CHECKPOINT_CONFIG_MAX (16u << 20)  /* config.json */
#define CHECKPOINT_INDEX_MAX (64u << 20)   /* model.safetensors.index.json */

enum checkpoint_layout { CHECKPOINT_HF = 1, CHECKPOINT_VLLM_SHARDED };

struct checkpoint_file {
	char *name;          /* file name in the directory */
	char *path;          /* dir + "/" + name */
	int rank;            /* -1: every rank (layout A) */
	int part;            /* p of model-rank-<k>-part-<p>; -1 in layout A */
	struct safetensors_file st;   /* header; st.raw already freed */
};

struct checkpoint {
	char *dir;
	enum checkpoint_layout layout;
	int ranks;                         /* R for layout B, 0 for layout A */
	struct checkpoint_file *files;     /* the files used, sorted by name (strcmp) */
	size_t nfiles;
	size_t ntensors;                   /* over all files */
	char architecture[128];            /* config.json architectures[0], or "" */
	char quant_method[64];             /* quantization_config.quant_method, or "" */
	bool quant_block_fp8;              /* quant_method "fp8" with a weight_block_size */
	uint8_t quant_config_sha256[32];   /* of the canonical quantization_config; zeros if none */
	/* SHA-256 over, per file in name order: name, a 0 byte, file size (be64),
	 * N (be64), the N header bytes. */
	uint8_t revision[32];
	char dtypes[256];                  /* sorted set of dtype names: "BF16,F32" */
};

/* Finds, reads and checks every header of the checkpoint in dir, and
 * config.json if there is one. Returns 0, -ENOENT (no such directory, or
 * no safetensors files in it), -EINVAL (malformed: err names the file and
 * says why), -ENOMEM, or another negative errno of the I/O. On failure *c
 * is empty. */
int checkpoint_open(const char *dir, struct checkpoint *c, char *err, size_t errlen);

/* Frees what checkpoint_open allocated; safe on a zeroed or closed one. */
void checkpoint_close(struct checkpoint *c);

/* Bytes of tensor data that go to rank: in layout A all of them (for any
 * rank), in layout B those of rank's files (0 for a rank outside 0..R-1).
 * Saturates at UINT64_MAX. */
uint64_t checkpoint_rank_bytes(const struct checkpoint *c, int rank);

/* The dtype names that seen marks, sorted and comma separated ("BF16,F32"),
 * into out (cut at size): a checkpoint's dtypes, a published rank's too. */
void checkpoint_dtype_list(const bool seen[SAFETENSORS_DTYPE_COUNT], char *out, size_t size);

#endif
