/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "format/key.h"
#include "format/weights_record.h"

#define MAGIC "artfs-weights 1\n"

static json_t *fingerprint_json(const struct artfs_fingerprint *fp)
{
	char quant[65], rev[65];

	key_hex(fp->quant_config_sha256, 32, quant);
	key_hex(fp->revision, 32, rev);
	return json_pack("{s:s%, s:s%, s:s, s:s, s:s%, s:I, s:I, s:I, s:I, s:I}",
			 "architecture", fp->architecture, strnlen(fp->architecture, sizeof(fp->architecture)),
			 "quant_method", fp->quant_method, strnlen(fp->quant_method, sizeof(fp->quant_method)),
			 "quant_config_sha256", quant, "revision", rev,
			 "dtypes", fp->dtypes, strnlen(fp->dtypes, sizeof(fp->dtypes)),
			 "tp_size", (json_int_t)fp->tp_size, "tp_rank", (json_int_t)fp->tp_rank,
			 "cc_major", (json_int_t)fp->cc_major, "cc_minor", (json_int_t)fp->cc_minor,
			 "driver_version", (json_int_t)fp->driver_version);
}

char *wrecord_encode(const struct wrecord *r, size_t *len)
{
	char uuid[33];

	if (r->nranks < 1 || r->nranks > WRECORD_RANKS_MAX || !r->manifest || !r->status)
		return NULL;
	json_t *ranks = json_array();
	for (int i = 0; i < r->nranks && ranks; i++) {
		const struct wrecord_rank *k = &r->ranks[i];
		key_hex(k->uuid, 16, uuid);
		if (json_array_append_new(ranks, json_pack("{s:i, s:s, s:I, s:I, s:o}", "device", k->device,
							   "uuid", uuid, "slab_size", (json_int_t)k->slab_size,
							   "bytes", (json_int_t)k->bytes,
							   "fingerprint", fingerprint_json(&k->fp))) < 0) {
			json_decref(ranks);
			ranks = NULL;
		}
	}
	json_t *root = ranks ? json_pack("{s:s, s:s, s:b, s:s, s:o}", "version", r->version,
					 "quant_method", r->quant_method, "quant_block_fp8",
					 r->quant_block_fp8, "status", r->status, "ranks", ranks)
			     : NULL;
	if (!root)
		return NULL;
	char *head = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
	json_decref(root);
	if (!head)
		return NULL;
	size_t hl = strlen(head), ml = r->manifest_len, ol = strlen(MAGIC);
	char *out = malloc(ol + hl + 1 + ml);
	if (out) {
		memcpy(out, MAGIC, ol);
		memcpy(out + ol, head, hl);
		out[ol + hl] = '\n';
		memcpy(out + ol + hl + 1, r->manifest, ml);
		*len = ol + hl + 1 + ml;
	}
	free(head);
	return out;
}

/* A string member of o copied into out (size bytes, NUL included). */
static bool get_text(json_t *o, const char *name, char *out, size_t size)
{
	json_t *v = json_object_get(o, name);

	if (!json_is_string(v) || json_string_length(v) >= size ||
	    strlen(json_string_value(v)) != json_string_length(v))
		return false;
	memcpy(out, json_string_value(v), json_string_length(v) + 1);
	return true;
}

static bool get_uint(json_t *o, const char *name, uint64_t max, uint64_t *out)
{
	json_t *v = json_object_get(o, name);

	if (!json_is_integer(v) || json_integer_value(v) < 0 || (uint64_t)json_integer_value(v) > max)
		return false;
	*out = (uint64_t)json_integer_value(v);
	return true;
}

static bool get_hex32(json_t *o, const char *name, uint8_t out[32])
{
	char hex[65];

	return get_text(o, name, hex, sizeof(hex)) && strlen(hex) == 64 &&
	       key_sha256_decode(hex, out) == 0;
}

static bool get_fingerprint(json_t *o, struct artfs_fingerprint *fp)
{
	uint64_t v[6];

	memset(fp, 0, sizeof(*fp));
	if (!json_is_object(o) || !get_text(o, "architecture", fp->architecture, sizeof(fp->architecture)) ||
	    !get_text(o, "quant_method", fp->quant_method, sizeof(fp->quant_method)) ||
	    !get_hex32(o, "quant_config_sha256", fp->quant_config_sha256) ||
	    !get_hex32(o, "revision", fp->revision) ||
	    !get_text(o, "dtypes", fp->dtypes, sizeof(fp->dtypes)) ||
	    !get_uint(o, "tp_size", WRECORD_RANKS_MAX, &v[0]) || !get_uint(o, "tp_rank", WRECORD_RANKS_MAX, &v[1]) ||
	    !get_uint(o, "cc_major", UINT32_MAX, &v[2]) || !get_uint(o, "cc_minor", UINT32_MAX, &v[3]) ||
	    !get_uint(o, "driver_version", UINT32_MAX, &v[4]))
		return false;
	fp->tp_size = (uint32_t)v[0];
	fp->tp_rank = (uint32_t)v[1];
	fp->cc_major = (uint32_t)v[2];
	fp->cc_minor = (uint32_t)v[3];
	fp->driver_version = (uint32_t)v[4];
	return true;
}

static bool get_rank(json_t *o, struct wrecord_rank *k)
{
	char uuid[33];
	uint64_t device;

	if (!json_is_object(o) || !get_uint(o, "device", 1023, &device) ||
	    !get_text(o, "uuid", uuid, sizeof(uuid)) || strlen(uuid) != 32 ||
	    !get_uint(o, "slab_size", UINT64_MAX / 2, &k->slab_size) || k->slab_size == 0 ||
	    k->slab_size % ARTFS_SLAB_ALIGN || !get_uint(o, "bytes", k->slab_size, &k->bytes) ||
	    !get_fingerprint(json_object_get(o, "fingerprint"), &k->fp))
		return false;
	k->device = (int)device;
	for (int i = 0; i < 16; i++) {
		unsigned b;
		if (sscanf(uuid + 2 * i, "%2x", &b) != 1)
			return false;
		k->uuid[i] = (uint8_t)b;
	}
	return true;
}

static int decode_head(json_t *root, struct wrecord *r, char *err, size_t errlen)
{
	json_t *ranks = json_object_get(root, "ranks");
	json_t *status = json_object_get(root, "status");
	json_t *fp8 = json_object_get(root, "quant_block_fp8");

	if (!json_is_object(root) || !get_text(root, "version", r->version, sizeof(r->version)) ||
	    !r->version[0] || !get_text(root, "quant_method", r->quant_method, sizeof(r->quant_method)) ||
	    !json_is_boolean(fp8) || !json_is_string(status) ||
	    json_string_length(status) >= WRECORD_STATUS_MAX ||
	    strlen(json_string_value(status)) != json_string_length(status) ||
	    !json_is_array(ranks) || json_array_size(ranks) < 1 ||
	    json_array_size(ranks) > WRECORD_RANKS_MAX) {
		snprintf(err, errlen, "its header lacks a field or has one out of bounds");
		return -EINVAL;
	}
	r->quant_block_fp8 = json_is_true(fp8);
	r->nranks = (int)json_array_size(ranks);
	for (int i = 0; i < r->nranks; i++)
		if (!get_rank(json_array_get(ranks, (size_t)i), &r->ranks[i])) {
			snprintf(err, errlen, "rank %d is malformed", i);
			return -EINVAL;
		}
	r->status = strdup(json_string_value(status));
	if (!r->status) {
		snprintf(err, errlen, "out of memory");
		return -EINVAL;
	}
	return 0;
}

int wrecord_decode(const void *buf, size_t len, struct wrecord *r, char *err, size_t errlen)
{
	const char *p = buf;
	size_t ol = strlen(MAGIC);
	json_error_t jerr;

	memset(r, 0, sizeof(*r));
	if (len > WRECORD_BYTES_MAX || len < ol || memcmp(p, MAGIC, ol) != 0) {
		snprintf(err, errlen, "not a record of loaded weights (%zu bytes)", len);
		return -EINVAL;
	}
	const char *nl = memchr(p + ol, '\n', len - ol);
	if (!nl) {
		snprintf(err, errlen, "no end to its header");
		return -EINVAL;
	}
	json_t *root = json_loadb(p + ol, (size_t)(nl - p) - ol, JSON_REJECT_DUPLICATES, &jerr);
	if (!root) {
		snprintf(err, errlen, "its header: %s", jerr.text);
		return -EINVAL;
	}
	int rc = decode_head(root, r, err, errlen);
	json_decref(root);
	size_t ml = len - (size_t)(nl + 1 - p);
	if (rc == 0 && (ml == 0 || memchr(nl + 1, '\0', ml))) {
		snprintf(err, errlen, "its manifest is empty or holds a NUL");
		rc = -EINVAL;
	}
	if (rc == 0 && !(r->manifest = malloc(ml + 1))) {
		snprintf(err, errlen, "out of memory");
		rc = -EINVAL;
	}
	if (rc < 0) {
		wrecord_free(r);
		return rc;
	}
	memcpy(r->manifest, nl + 1, ml);
	r->manifest[ml] = '\0';
	r->manifest_len = ml;
	return 0;
}

void wrecord_free(struct wrecord *r)
{
	free(r->status);
	free(r->manifest);
	r->status = NULL;
	r->manifest = NULL;
}
