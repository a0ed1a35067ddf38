/* SPDX-License-Identifier: Apache-2.0 */
/* Where a rank's tensors lie in its slab, and the digest of that layout
 * (DESIGN.md §4.3, flip in place): a function of the tensors alone (names,
 * dtypes, shapes, which ones are tied), never of file or blob order, so
 * that a load and a GPU-direct publish of the same tensors share one
 * layout and an engine can map one version's slab where another's was. */
#include "autoconf.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "lib/sha256.h"
#include "weights/weights.h"
#include "weights/weights_i.h"

#define LAYOUT_MAGIC "artfs-layout 1\n"

struct by_name {
	const struct safetensors_tensor *const *t;
	size_t i;
};

static int name_order(const void *a, const void *b)
{
	const struct by_name *x = a, *y = b;
	int c = strcmp(x->t[x->i]->name, y->t[y->i]->name);

	return c ? c : (x->i > y->i) - (x->i < y->i);
}

/* The tensor whose bytes t[i] shares (itself when none), following the
 * chain; a chain longer than n is a loop and ends where it is. */
static size_t root_of(const size_t *alias, size_t n, size_t i)
{
	for (size_t steps = 0; alias && alias[i] < n && alias[i] != i && steps < n; steps++)
		i = alias[i];
	return i;
}

static uint64_t align_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) / a * a;
}

int weights_layout_place(const struct safetensors_tensor *const *t, const size_t *alias, size_t n,
			 uint64_t *offsets, uint64_t *slab_size)
{
	struct by_name *order = malloc((n ? n : 1) * sizeof(*order));
	bool *placed = calloc(n ? n : 1, sizeof(*placed));

	if (!order || !placed) {
		free(order);
		free(placed);
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++)
		order[i] = (struct by_name){ t, i };
	qsort(order, n, sizeof(*order), name_order);
	/* A group of tied tensors takes its place where its first name falls. */
	uint64_t at = 0;
	for (size_t k = 0; k < n; k++) {
		size_t r = root_of(alias, n, order[k].i);
		if (!placed[r]) {
			at = align_up(at, ARTFS_TENSOR_ALIGN);
			offsets[r] = at;
			at += t[r]->size;
			placed[r] = true;
		}
		offsets[order[k].i] = offsets[r];
	}
	*slab_size = align_up(at ? at : 1, ARTFS_SLAB_ALIGN);
	free(order);
	free(placed);
	return 0;
}

static void put_be(struct sha256 *s, uint64_t v, int bytes)
{
	uint8_t be[8];

	for (int j = 0; j < bytes; j++)
		be[j] = (uint8_t)(v >> (8 * (bytes - 1 - j)));
	sha256_update(s, be, (size_t)bytes);
}

int weights_layout_digest(const struct safetensors_tensor *const *t, const uint64_t *offsets,
			  size_t n, uint64_t slab_size, uint8_t out[32])
{
	struct by_name *order = malloc((n ? n : 1) * sizeof(*order));
	struct sha256 s;

	if (!order || sha256_begin(&s) < 0) {
		free(order);
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++)
		order[i] = (struct by_name){ t, i };
	qsort(order, n, sizeof(*order), name_order);
	sha256_update(&s, LAYOUT_MAGIC, strlen(LAYOUT_MAGIC));
	for (size_t k = 0; k < n; k++) {
		const struct safetensors_tensor *x = t[order[k].i];
		const char *dt = safetensors_dtype_name(x->dtype);
		sha256_update(&s, x->name, strlen(x->name) + 1);
		sha256_update(&s, dt, strlen(dt) + 1);
		put_be(&s, x->ndim, 4);
		for (unsigned d = 0; d < x->ndim; d++)
			put_be(&s, x->shape[d], 8);
		put_be(&s, 0, 4); /* slab */
		put_be(&s, offsets[order[k].i], 8);
		put_be(&s, x->size, 8);
	}
	put_be(&s, 1, 4); /* slab count, then each slab's size */
	put_be(&s, slab_size, 8);
	sha256_end(&s, out);
	free(order);
	return 0;
}

int weights_rank_layout(struct weights_rank *wr, const size_t *alias, uint64_t *slab_size)
{
	uint64_t *off = malloc((wr->npieces ? wr->npieces : 1) * sizeof(*off));
	int rc = off ? weights_layout_place(wr->tensors, alias, wr->npieces, off, slab_size) : -ENOMEM;

	if (rc == 0)
		rc = weights_layout_digest(wr->tensors, off, wr->npieces, *slab_size, wr->layout);
	for (size_t i = 0; rc == 0 && i < wr->npieces; i++)
		wr->pieces[i].slab_offset = off[i];
	free(off);
	return rc;
}
