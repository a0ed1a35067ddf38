/* SPDX-License-Identifier: Apache-2.0 */
/* What loaded or published weights say of themselves: each rank's
 * weights_fingerprint (what an attach must expect) and manifest.json. */
#include "autoconf.h"

#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "format/key.h"
#include "weights/weights.h"
#include "weights/weights_i.h"

/* ---- the fingerprint ----------------------------------------------------------- */

/* What the GPU adds to a fingerprint, loaded or published alike. */
void weights_fingerprint_device(struct artfs_fingerprint *fp, const struct gpu_device *d)
{
	fp->cc_major = (uint32_t)d->cc_major;
	fp->cc_minor = (uint32_t)d->cc_minor;
	fp->driver_version = (uint32_t)d->driver_version;
}

void weights_fingerprint(struct weights *w, int r, int tp_size)
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
	weights_fingerprint_device(fp, d);
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

char *weights_build_manifest(struct weights *w)
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
		char layout[65];
		key_hex(wr->layout, 32, layout);
		json_array_append_new(ranks, json_pack("{s:i, s:i, s:s, s:o, s:o, s:s, s:I, s:o}", "rank", r,
						       "device", wr->device, "device_uuid", uuid,
						       "fingerprint", fingerprint_json(&wr->fp),
						       "slabs", slabs, "layout", layout,
						       "bytes", (json_int_t)wr->total_bytes,
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

/* A digest of 64 hex digits into out; anything else leaves it 0s (a
 * manifest of a daemon before layouts: no flip in place). */
static void layout_parse(const char *hex, uint8_t out[32])
{
	uint8_t v[32];

	memset(out, 0, 32);
	if (!hex || strlen(hex) != 64)
		return;
	for (int i = 0; i < 64; i++) {
		int c = hex[i], d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
		if (d < 0)
			return;
		if (i % 2 == 0)
			v[i / 2] = (uint8_t)(d << 4);
		else
			v[i / 2] |= (uint8_t)d;
	}
	memcpy(out, v, 32);
}

void weights_layouts_from_manifest(struct weights *w)
{
	json_t *root = w->manifest ? json_loadb(w->manifest, w->manifest_len, 0, NULL) : NULL;
	json_t *ranks = json_object_get(root, "ranks");

	for (int r = 0; r < w->nranks; r++)
		layout_parse(json_string_value(json_object_get(json_array_get(ranks, (size_t)r), "layout")),
			     w->ranks[r].layout);
	json_decref(root);
}
