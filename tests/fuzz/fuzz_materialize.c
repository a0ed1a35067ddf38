/* SPDX-License-Identifier: Apache-2.0 */
/* The .materialize request (DESIGN.md §3.4): materialize_parse of the text
 * a client writes, then materialize_check of the layout over envelopes
 * built from the input (as envelope_parse leaves them: 1..8 positive
 * dimensions, a known dtype, block or tail). The check is compared with a
 * plain reading of the rules, and a parsed request must parse again the
 * same from its canonical text. */
#include "autoconf.h"

#include <errno.h>
#include <inttypes.h>
#include <string.h>

#include "format/key.h"
#include "fuzz.h"
#include "r3/materialize.h"

#define ENVS_MAX 64

static const char *const dtypes[] = { "|u1", "<u2", "|i1", "<i4", ">u2" };

/* The rules of §3.4, read literally, in 128-bit arithmetic. */
static int reference_check(const struct materialize_request *req, const struct envelope *envs,
			   uint64_t *token_end_out)
{
	unsigned __int128 bs = req->has_block_size ? req->block_size : envs[0].array.shape[0];
	unsigned __int128 total = 0, start = 0;

	for (size_t i = 0; i < req->count; i++)
		total += envs[i].array.shape[0];
	unsigned __int128 te = req->has_token_end ? req->token_end : total;
	if (te > UINT64_MAX)
		return -EBADMSG; /* token_end is a u64 */
	for (size_t i = 0; i < req->count; i++) {
		const struct envelope *e = &envs[i];
		if (e->source_token_start != start || start >= te)
			return -EBADMSG;
		unsigned __int128 want = te - start < bs ? te - start : bs;
		if (e->array.shape[0] != want)
			return -EBADMSG;
		if (e->kind != (want == bs ? ENVELOPE_BLOCK : ENVELOPE_TAIL))
			return -EBADMSG;
		if (strcmp(e->array.dtype, envs[0].array.dtype) != 0 || e->array.ndim != envs[0].array.ndim)
			return -EBADMSG;
		for (unsigned d = 1; d < e->array.ndim; d++)
			if (e->array.shape[d] != envs[0].array.shape[d])
				return -EBADMSG;
		start += want;
	}
	if (start != te)
		return -EBADMSG;
	*token_end_out = (uint64_t)te;
	return 0;
}

static uint64_t positive(struct fuzz_in *in)
{
	uint64_t v = fz_num(in) & INT64_MAX; /* what JSON integers allow */
	return v ? v : 1;
}

/* Envelopes that form req exactly (from its token_end and block_size, or
 * from the input), then a few changes from the input. */
static void build(struct fuzz_in *in, const struct materialize_request *req, struct envelope *envs)
{
	uint8_t mode = fz_u8(in);
	struct array_desc base;

	memset(&base, 0, sizeof(base));
	array_dtype_set(&base, dtypes[mode % 5]);
	base.ndim = (uint8_t)(1 + (mode >> 3) % ARTFS_NDIM_MAX);
	for (unsigned d = 1; d < base.ndim; d++)
		base.shape[d] = 1 + fz_u8(in) % 64;
	uint64_t bs = req->has_block_size ? req->block_size : 1 + fz_u8(in) % 32;
	uint64_t te = req->has_token_end ? req->token_end : bs * req->count - fz_u8(in) % bs;
	uint64_t start = 0;

	for (size_t i = 0; i < req->count; i++) {
		struct envelope *e = &envs[i];
		memset(e, 0, sizeof(*e));
		e->array = base;
		uint64_t rows = te > start ? (te - start < bs ? te - start : bs) : 1;
		e->array.shape[0] = rows;
		e->kind = rows == bs ? ENVELOPE_BLOCK : ENVELOPE_TAIL;
		e->source_token_start = start;
		start += rows;
	}
	if (mode & 0x80) { /* anything at all, object by object */
		for (size_t i = 0; i < req->count && in->n; i++) {
			struct envelope *e = &envs[i];
			uint8_t sel = fz_u8(in);
			array_dtype_set(&e->array, dtypes[sel % 5]);
			e->array.ndim = (uint8_t)(1 + (sel >> 3) % ARTFS_NDIM_MAX);
			for (unsigned d = 0; d < e->array.ndim; d++)
				e->array.shape[d] = sel & 0x40 ? positive(in) : 1 + fz_u8(in) % 4;
			e->kind = sel & 0x80 ? ENVELOPE_BLOCK : ENVELOPE_TAIL;
			e->source_token_start = fz_num(in) & INT64_MAX;
		}
		return;
	}
	/* A few changes to a good layout. */
	for (unsigned k = fz_u8(in) % 4; k && in->n; k--) {
		struct envelope *e = &envs[fz_u8(in) % req->count];
		switch (fz_u8(in) % 6) {
		case 0: e->array.shape[0] = positive(in); break;
		case 1: e->source_token_start = fz_num(in) & INT64_MAX; break;
		case 2: e->kind = e->kind == ENVELOPE_BLOCK ? ENVELOPE_TAIL : ENVELOPE_BLOCK; break;
		case 3: array_dtype_set(&e->array, dtypes[fz_u8(in) % 5]); break;
		case 4: e->array.ndim = (uint8_t)(1 + fz_u8(in) % ARTFS_NDIM_MAX); break;
		default: e->array.shape[e->array.ndim - 1] = positive(in); break;
		}
	}
}

/* The request's canonical text; parsing it gives the same request. */
static void round_trip(const struct materialize_request *req)
{
	size_t cap = 128 + req->count * (ARTFS_HASH_HEX_MAX + 1), len = 0;
	char *text = malloc(cap), hex[ARTFS_HASH_HEX_MAX + 1];
	struct materialize_request again;
	char err[128];

	if (req->has_token_end)
		len += (size_t)snprintf(text + len, cap - len, "token_end %" PRIu64 "\n", req->token_end);
	if (req->has_block_size)
		len += (size_t)snprintf(text + len, cap - len, "block_size %" PRIu64 "\n", req->block_size);
	for (size_t i = 0; i < req->count; i++) {
		key_hex(req->blocks[i].hash, req->blocks[i].len, hex);
		len += (size_t)snprintf(text + len, cap - len, "%s\n", hex);
	}
	FZ_CHECK(materialize_parse(text, len, &again, err, sizeof(err)) == 0);
	FZ_CHECK(again.has_token_end == req->has_token_end && again.token_end == req->token_end);
	FZ_CHECK(again.has_block_size == req->has_block_size && again.block_size == req->block_size);
	FZ_CHECK(again.count == req->count);
	for (size_t i = 0; i < req->count; i++)
		FZ_CHECK(again.blocks[i].len == req->blocks[i].len &&
			 memcmp(again.blocks[i].hash, req->blocks[i].hash, req->blocks[i].len) == 0);
	materialize_request_free(&again);
	free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fuzz_in in = { data, size };
	struct materialize_request req;
	char err[160];

	/* The request text runs to the first 0xff byte (never in a request),
	 * the rest describes the objects. */
	const uint8_t *ff = memchr(data, 0xff, size);
	size_t text_len = ff ? (size_t)(ff - data) : size;
	in.p += ff ? text_len + 1 : text_len;
	in.n -= ff ? text_len + 1 : text_len;

	/* Exactly the text's bytes, so that ASan sees any read past them. */
	char *text = malloc(text_len ? text_len : 1);
	memcpy(text, data, text_len);
	err[0] = '\0';
	int rc = materialize_parse(text, text_len, &req, err, sizeof(err));
	free(text);
	FZ_CHECK(rc == 0 || rc == -EINVAL || rc == -ENOMEM);
	if (rc < 0) {
		FZ_CHECK(err[0] != '\0' && req.count == 0 && req.blocks == NULL);
		return 0;
	}
	FZ_CHECK(req.count >= 1 && req.count <= MATERIALIZE_BLOCKS_MAX);
	FZ_CHECK(!req.has_token_end || req.token_end > 0);
	FZ_CHECK(!req.has_block_size || req.block_size > 0);
	for (size_t i = 0; i < req.count; i++)
		FZ_CHECK(req.blocks[i].len >= 1 && req.blocks[i].len <= ARTFS_HASH_BYTES_MAX);
	round_trip(&req);

	if (req.count <= ENVS_MAX) {
		struct envelope *envs = calloc(req.count, sizeof(*envs));
		uint64_t te = 0, ref_te = 0;
		build(&in, &req, envs);
		rc = materialize_check(&req, envs, &te, err, sizeof(err));
		int ref = reference_check(&req, envs, &ref_te);
		FZ_CHECK(rc == 0 || rc == -EBADMSG);
		FZ_CHECK(rc == ref);
		FZ_CHECK(rc < 0 || te == ref_te);
		free(envs);
	}
	materialize_request_free(&req);
	return 0;
}
