/* SPDX-License-Identifier: Apache-2.0 */
/* The bookkeeping of an attachment in place (flip in place, DESIGN.md
 * §4.3): where each slab lies in a range of addresses, which version's
 * allocation is mapped there, and a flip that maps another version's at the
 * same addresses or, failing, puts the old ones back. Only the driver table
 * touches the GPU, so the unit tests run this with a fake one. */
#include "autoconf.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "gpu/client/client_i.h"

int range_open(struct client_range *r, const struct range_driver *d, uint64_t base, uint64_t len,
	       const uint64_t *sizes, uint32_t count, char *err, size_t errlen)
{
	uint64_t need = 0;

	memset(r, 0, sizeof(*r));
	if (count < 1 || count > ARTFS_SLABS_MAX) {
		snprintf(err, errlen, "%u slabs (1 to %d)", count, ARTFS_SLABS_MAX);
		return -EINVAL;
	}
	for (uint32_t i = 0; i < count; i++) {
		if (sizes[i] == 0 || sizes[i] % ARTFS_SLAB_ALIGN || sizes[i] > UINT64_MAX / 2 - need) {
			snprintf(err, errlen, "slab %u: %llu bytes, not a multiple of 2 MiB", i,
				 (unsigned long long)sizes[i]);
			return -EINVAL;
		}
		r->at[i] = need; /* relative until the base is known */
		r->size[i] = sizes[i];
		need += sizes[i];
	}
	if (base % ARTFS_SLAB_ALIGN) {
		snprintf(err, errlen, "the range at 0x%llx is not 2 MiB aligned", (unsigned long long)base);
		return -EINVAL;
	}
	if (base && len < need) {
		snprintf(err, errlen, "the range holds %llu bytes; the slabs need %llu",
			 (unsigned long long)len, (unsigned long long)need);
		return -ENOSPC;
	}
	if (!base) {
		int rc = d->reserve(need, &base, err, errlen);
		if (rc < 0)
			return rc;
		len = need;
		r->owned = true;
	}
	r->base = base;
	r->len = len;
	r->count = count;
	for (uint32_t i = 0; i < count; i++)
		r->at[i] += base;
	return 0;
}

/* Unmaps slabs [0, n) (those mapped) and maps the handles h there again:
 * the way back after a failed flip. */
static int remap(struct client_range *r, const struct range_driver *d, uint32_t n, const uint64_t *h,
		 char *err, size_t errlen)
{
	int rc = 0;

	for (uint32_t i = 0; i < n; i++) {
		if (r->mapped[i])
			d->unmap(r->at[i], r->size[i]);
		r->mapped[i] = false;
		char why[160];
		int e = d->map(r->at[i], r->size[i], h[i], why, sizeof(why));
		if (e == 0)
			r->mapped[i] = true;
		else if (rc == 0) {
			rc = e;
			snprintf(err, errlen, "%s", why);
		}
	}
	return rc;
}

int range_map(struct client_range *r, const struct range_driver *d, const int *fds,
	      const uint64_t *sizes, uint32_t count, char *err, size_t errlen)
{
	uint64_t h[ARTFS_SLABS_MAX];
	const bool flip = r->holding;
	uint32_t n = 0;
	int rc = 0;

	if (count != r->count || memcmp(sizes, r->size, sizeof(uint64_t) * count) != 0) {
		snprintf(err, errlen, "%u slab%s of other sizes than the %u in place: another layout",
			 count, count == 1 ? "" : "s", r->count);
		return -EXDEV;
	}
	/* Every allocation first: a descriptor that does not import changes nothing. */
	for (; n < count && rc == 0; n++)
		rc = d->import(fds[n], &h[n], err, errlen);
	if (rc < 0) {
		for (uint32_t i = 0; i + 1 < n; i++)
			d->release(h[i]);
		return rc;
	}
	for (uint32_t i = 0; i < count; i++) {
		if (r->mapped[i])
			d->unmap(r->at[i], r->size[i]);
		r->mapped[i] = false;
		rc = d->map(r->at[i], r->size[i], h[i], err, errlen);
		if (rc == 0) {
			r->mapped[i] = true;
			continue;
		}
		if (flip) {
			char again[160];
			size_t l = strlen(err);
			if (remap(r, d, i + 1, r->handle, again, sizeof(again)) < 0)
				snprintf(err + l, errlen > l ? errlen - l : 0,
					 "; and the version before could not be mapped again: %s", again);
		} else {
			for (uint32_t k = 0; k < i; k++) {
				d->unmap(r->at[k], r->size[k]);
				r->mapped[k] = false;
			}
		}
		for (uint32_t k = 0; k < count; k++)
			d->release(h[k]);
		return rc;
	}
	for (uint32_t i = 0; i < count; i++) {
		if (flip)
			d->release(r->handle[i]);
		r->handle[i] = h[i];
	}
	r->holding = true;
	return 0;
}

void range_close(struct client_range *r, const struct range_driver *d)
{
	for (uint32_t i = 0; i < r->count; i++) {
		if (r->mapped[i])
			d->unmap(r->at[i], r->size[i]);
		if (r->holding)
			d->release(r->handle[i]);
		r->mapped[i] = false;
	}
	r->holding = false;
	if (r->owned && r->base)
		d->free(r->base, r->len);
	r->base = r->len = 0;
	r->count = 0;
	r->owned = false;
}
