/* SPDX-License-Identifier: Apache-2.0 */
/* Attaching, fed any bytes at all (include/artfs/artfs.h):
 *   - the ARTFS_IOC_ATTACH request, struct artfs_attach as an engine hands
 *     it over, through weights_attach_check, the checks of the request
 *     itself (abi version, expected fingerprint against the loaded one),
 *     compared with a plain reading of the header: the character arrays
 *     need not be terminated, and only what precedes a NUL counts;
 *   - a request on the .artfs/attach socket (attach_request_parse), which
 *     is one only at its exact size, magic and abi;
 *   - the record of ready weights a holder keeps (wrecord_decode): what
 *     decodes is within its bounds and encodes to bytes that decode to
 *     the same record. */
#include "autoconf.h"

#include <errno.h>
#include <string.h>

#include "artfs/artfs.h"
#include "format/weights_record.h"
#include "fuzz.h"
#include "weights/socket.h"
#include "weights/weights.h"

static bool text_equal(const char *a, const char *b, size_t size)
{
	size_t la = strnlen(a, size), lb = strnlen(b, size);
	return la == lb && memcmp(a, b, la) == 0;
}

static bool fingerprint_equal(const struct artfs_fingerprint *a, const struct artfs_fingerprint *b)
{
	return text_equal(a->architecture, b->architecture, sizeof(a->architecture)) &&
	       text_equal(a->quant_method, b->quant_method, sizeof(a->quant_method)) &&
	       memcmp(a->quant_config_sha256, b->quant_config_sha256, 32) == 0 &&
	       memcmp(a->revision, b->revision, 32) == 0 &&
	       text_equal(a->dtypes, b->dtypes, sizeof(a->dtypes)) &&
	       a->tp_size == b->tp_size && a->tp_rank == b->tp_rank &&
	       a->cc_major == b->cc_major && a->cc_minor == b->cc_minor &&
	       a->driver_version == b->driver_version;
}

static void slabs_request(const uint8_t *data, size_t size)
{
	struct artfs_slabs_request req;
	uint32_t magic = 0, abi = 0;

	if (size >= 8) {
		memcpy(&magic, data, 4);
		memcpy(&abi, data + 4, 4);
	}
	int rc = attach_request_parse(data, size, &req);
	bool one = size == sizeof(req) && magic == ARTFS_SLABS_MAGIC && abi == ARTFS_ABI_VERSION;
	FZ_CHECK(one ? rc == 0 && memcmp(&req, data, sizeof(req)) == 0 : rc == -EPROTO);
}

static void record(const uint8_t *data, size_t size)
{
	struct wrecord *r = calloc(1, sizeof(*r)), *again = calloc(1, sizeof(*again));
	char err[256];
	size_t len;

	if (wrecord_decode(data, size, r, err, sizeof(err)) == 0) {
		FZ_CHECK(r->nranks >= 1 && r->nranks <= WRECORD_RANKS_MAX && r->version[0]);
		FZ_CHECK(r->manifest && strlen(r->manifest) == r->manifest_len && r->status);
		for (int i = 0; i < r->nranks; i++)
			FZ_CHECK(r->ranks[i].slab_size % ARTFS_SLAB_ALIGN == 0 && r->ranks[i].slab_size &&
				 r->ranks[i].bytes <= r->ranks[i].slab_size);
		char *bytes = wrecord_encode(r, &len);
		FZ_CHECK(bytes != NULL);
		FZ_CHECK(wrecord_decode(bytes, len, again, err, sizeof(err)) == 0);
		FZ_CHECK(strcmp(again->version, r->version) == 0 && again->nranks == r->nranks &&
			 strcmp(again->status, r->status) == 0 &&
			 strcmp(again->manifest, r->manifest) == 0);
		for (int i = 0; i < r->nranks; i++)
			FZ_CHECK(memcmp(&again->ranks[i], &r->ranks[i], sizeof(r->ranks[i])) == 0);
		free(bytes);
		wrecord_free(again);
	}
	wrecord_free(r);
	free(r);
	free(again);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fuzz_in in = { data, size };

	if (size && data[0] == 's') {
		slabs_request(data + 1, size - 1);
		return 0;
	}
	if (size && data[0] == 'w') {
		record(data + 1, size - 1);
		return 0;
	}
	/* Heap copies of exactly the struct's size, so that ASan sees a read
	 * past either. */
	struct artfs_attach *req = malloc(sizeof(*req));
	struct artfs_fingerprint *loaded = malloc(sizeof(*loaded));
	const char *why;

	uint8_t mode = fz_u8(&in);
	size_t n = in.n < sizeof(*req) ? in.n : sizeof(*req);
	memset(req, 0, sizeof(*req));
	memcpy(req, in.p, n);
	in.p += n;
	in.n -= n;
	if (mode & 1)
		req->abi = ARTFS_ABI_VERSION;

	/* The loaded fingerprint: the request's own, with a change or two
	 * (so that equality is reached), or more bytes of the input. */
	if (mode & 2) {
		n = in.n < sizeof(*loaded) ? in.n : sizeof(*loaded);
		memset(loaded, 0, sizeof(*loaded));
		memcpy(loaded, in.p, n);
	} else {
		*loaded = req->expect;
		for (unsigned k = (mode >> 2) & 3; k; k--) {
			size_t at = fz_u16(&in) % sizeof(*loaded);
			((uint8_t *)loaded)[at] = fz_u8(&in);
		}
	}

	int rc = weights_attach_check(req, NULL, &why);
	if (req->abi != ARTFS_ABI_VERSION)
		FZ_CHECK(rc == -EINVAL && why);
	else
		FZ_CHECK(rc == 0 && !why);

	rc = weights_attach_check(req, loaded, &why);
	if (req->abi != ARTFS_ABI_VERSION)
		FZ_CHECK(rc == -EINVAL && why);
	else if (!fingerprint_equal(&req->expect, loaded))
		FZ_CHECK(rc == -ESTALE && why && *why);
	else
		FZ_CHECK(rc == 0 && !why);
	free(req);
	free(loaded);
	return 0;
}
