/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "lib/log.h"
#include "restart/held.h"

_Static_assert(sizeof(struct held_node) == 256, "node records are 256 bytes");
_Static_assert(sizeof(struct held_header) <= 2 * HELD_TEXT_PAGE, "the header fits its pages");

#define HEADER_BYTES (2 * (uint64_t)HELD_TEXT_PAGE)
#define INFLIGHT_BYTES ((uint64_t)HELD_INFLIGHT * sizeof(struct held_inflight))
#define NODES_BYTES ((uint64_t)HELD_NODES_MAX * sizeof(struct held_node))
#define HANDLES_BYTES ((uint64_t)HELD_HANDLES_MAX * sizeof(struct held_handle))
#define KEYS_BYTES (HELD_KEYS_BITS / 8)

static uint64_t page_up(uint64_t n)
{
	return (n + HELD_TEXT_PAGE - 1) / HELD_TEXT_PAGE * HELD_TEXT_PAGE;
}

static void layout(struct held_header *hdr)
{
	hdr->magic = HELD_MAGIC;
	hdr->layout = HELD_LAYOUT;
	hdr->inflight_off = HEADER_BYTES;
	hdr->nodes_off = page_up(hdr->inflight_off + INFLIGHT_BYTES);
	hdr->handles_off = page_up(hdr->nodes_off + NODES_BYTES);
	hdr->text_off = page_up(hdr->handles_off + HANDLES_BYTES);
	hdr->keys_off = page_up(hdr->text_off + HELD_TEXT_BYTES);
	hdr->size = hdr->keys_off + KEYS_BYTES;
}

int held_create(const void *init, size_t init_len, uint32_t flags)
{
	struct held_header hdr;

	if (init_len > HELD_INIT_MAX)
		return -EINVAL;
	memset(&hdr, 0, sizeof(hdr));
	layout(&hdr);
	hdr.flags = flags;
	hdr.init_len = (uint32_t)init_len;
	memcpy(hdr.init, init, init_len);
	int fd = memfd_create("artfs-held", 0); /* inherited by the daemons */
	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)hdr.size) < 0 || pwrite(fd, &hdr, sizeof(hdr), 0) != sizeof(hdr)) {
		int rc = -errno;
		close(fd);
		return rc;
	}
	return fd;
}

static int attach(struct held *h, void *base, size_t size, int fd, bool fresh)
{
	memset(h, 0, sizeof(*h));
	h->base = base;
	h->size = size;
	h->hdr = base;
	h->fd = fd;
	h->fresh = fresh;
	h->text_pages = HELD_TEXT_BYTES / HELD_TEXT_PAGE;
	h->text_used = calloc(h->text_pages / 64, sizeof(uint64_t));
	if (!h->text_used) {
		munmap(base, size);
		return -ENOMEM;
	}
	pthread_mutex_init(&h->mu, NULL);
	return 0;
}

static void scan_handles(struct held *h);

int held_map(int fd, struct held *h)
{
	struct held_header hdr, want;

	memset(&want, 0, sizeof(want));
	layout(&want);
	if (pread(fd, &hdr, sizeof(hdr), 0) != sizeof(hdr) || hdr.magic != HELD_MAGIC ||
	    hdr.layout != HELD_LAYOUT || hdr.size != want.size || hdr.text_off != want.text_off ||
	    hdr.keys_off != want.keys_off ||
	    hdr.init_len > HELD_INIT_MAX) {
		log_err("the holder's memory is not of this daemon's layout %u (it holds layout %u): "
			"this binary cannot take over this mount", HELD_LAYOUT, hdr.layout);
		return -EINVAL;
	}
	void *base = mmap(NULL, hdr.size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
	if (base == MAP_FAILED)
		return -errno;
	fcntl(fd, F_SETFD, FD_CLOEXEC);
	return attach(h, base, hdr.size, fd, false);
}

void held_take_over(struct held *h)
{
	pthread_mutex_lock(&h->mu);
	h->nfree_nodes = h->nfree_handles = 0;
	h->scanned_nodes = 0;
	h->scan_end = atomic_load(&h->hdr->nodes_high);
	memset(h->text_used, 0, h->text_pages / 64 * sizeof(uint64_t));
	pthread_mutex_unlock(&h->mu);
	scan_handles(h);
}

int held_map_private(struct held *h)
{
	struct held_header hdr;

	memset(&hdr, 0, sizeof(hdr));
	layout(&hdr);
	void *base = mmap(NULL, hdr.size, PROT_READ | PROT_WRITE,
			  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (base == MAP_FAILED)
		return -errno;
	memcpy(base, &hdr, sizeof(hdr));
	return attach(h, base, hdr.size, -1, true);
}

void held_unmap(struct held *h)
{
	if (!h->base)
		return;
	munmap(h->base, h->size);
	if (h->fd >= 0)
		close(h->fd);
	free(h->free_nodes);
	free(h->free_handles);
	free(h->text_used);
	pthread_mutex_destroy(&h->mu);
	memset(h, 0, sizeof(*h));
	h->fd = -1;
}

struct held_inflight *held_inflight(struct held *h, unsigned slot)
{
	if (slot >= HELD_INFLIGHT)
		return NULL;
	return (struct held_inflight *)(h->base + h->hdr->inflight_off) + slot;
}

static struct held_node *node_at(struct held *h, uint32_t slot)
{
	return (struct held_node *)(h->base + h->hdr->nodes_off) + slot;
}

static struct held_handle *handle_at(struct held *h, uint32_t slot)
{
	return (struct held_handle *)(h->base + h->hdr->handles_off) + slot;
}

/* ---- free lists --------------------------------------------------------------------- */

static bool push(uint32_t **v, size_t *n, size_t *cap, uint32_t slot)
{
	if (*n == *cap) {
		size_t c = *cap ? *cap * 2 : 256;
		uint32_t *g = realloc(*v, c * sizeof(**v));
		if (!g)
			return false; /* the slot stays unused until the next daemon */
		*v = g;
		*cap = c;
	}
	(*v)[(*n)++] = slot;
	return true;
}

/* Under h->mu: a free slot (from the list, else above the mark), or
 * UINT32_MAX when the table is full. */
static uint32_t take(uint32_t *v, size_t *n, _Atomic uint32_t *high, uint32_t max)
{
	if (*n)
		return v[--*n];
	uint32_t s = atomic_load(high);
	if (s >= max)
		return UINT32_MAX;
	atomic_store(high, s + 1); /* before the record is written: a new daemon scans it */
	return s;
}

uint64_t held_node_alloc(struct held *h, const struct held_node *desc)
{
	pthread_mutex_lock(&h->mu);
	uint32_t s = take(h->free_nodes, &h->nfree_nodes, &h->hdr->nodes_high, HELD_NODES_MAX);
	pthread_mutex_unlock(&h->mu);
	if (s == UINT32_MAX)
		return 0;
	struct held_node *r = node_at(h, s);
	uint32_t gen = r->gen + 1;
	uint8_t type = atomic_load(&desc->type);
	memcpy((uint8_t *)r + offsetof(struct held_node, sub), (const uint8_t *)desc +
	       offsetof(struct held_node, sub), sizeof(*r) - offsetof(struct held_node, sub));
	r->gen = gen;
	atomic_store(&r->nlookup, atomic_load(&desc->nlookup));
	atomic_store_explicit(&r->type, type, memory_order_release);
	return HELD_NODE_BASE + (uint64_t)s;
}

struct held_node *held_node_get(struct held *h, uint64_t id)
{
	if (id < HELD_NODE_BASE || id - HELD_NODE_BASE >= atomic_load(&h->hdr->nodes_high))
		return NULL;
	struct held_node *r = node_at(h, (uint32_t)(id - HELD_NODE_BASE));
	return atomic_load_explicit(&r->type, memory_order_acquire) ? r : NULL;
}

bool held_node_forget(struct held *h, uint64_t id, uint64_t nlookup)
{
	struct held_node *r = held_node_get(h, id);

	if (!r)
		return false;
	uint64_t had = atomic_load(&r->nlookup);
	do {
		if (had == 0)
			return false;
	} while (!atomic_compare_exchange_weak(&r->nlookup, &had,
					       had > nlookup ? had - nlookup : 0));
	if (had > nlookup)
		return false;
	uint32_t s = (uint32_t)(id - HELD_NODE_BASE);
	pthread_mutex_lock(&h->mu);
	atomic_store(&r->type, 0);
	/* A slot that the scan of a takeover has yet to reach is its to list. */
	if (s < h->scanned_nodes || s >= h->scan_end)
		push(&h->free_nodes, &h->nfree_nodes, &h->cap_nodes, s);
	pthread_mutex_unlock(&h->mu);
	return true;
}

/* ---- handles ----------------------------------------------------------------------- */

uint64_t held_handle_alloc(struct held *h, uint8_t kind, uint64_t node, uint16_t flags)
{
	pthread_mutex_lock(&h->mu);
	uint32_t s = take(h->free_handles, &h->nfree_handles, &h->hdr->handles_high,
			  HELD_HANDLES_MAX);
	pthread_mutex_unlock(&h->mu);
	if (s == UINT32_MAX)
		return 0;
	struct held_handle *r = handle_at(h, s);
	uint32_t gen = atomic_load(&r->gen) + 1;
	/* gen only ever grows, even for a daemon killed in the middle of this */
	atomic_store(&r->gen, gen);
	atomic_store(&r->state, 0);
	r->flags = flags;
	memset((uint8_t *)r + offsetof(struct held_handle, result), 0,
	       sizeof(*r) - offsetof(struct held_handle, result));
	r->node = node;
	atomic_store_explicit(&r->kind, kind, memory_order_release);
	return (uint64_t)gen << 32 | ((uint64_t)s + 1);
}

struct held_handle *held_handle_get(struct held *h, uint64_t fh)
{
	if ((fh & 0xffffffffu) == 0 || held_handle_slot(fh) >= atomic_load(&h->hdr->handles_high))
		return NULL;
	struct held_handle *r = handle_at(h, held_handle_slot(fh));
	if (!atomic_load_explicit(&r->kind, memory_order_acquire) ||
	    atomic_load(&r->gen) != (uint32_t)(fh >> 32))
		return NULL;
	return r;
}

void held_handles_each(struct held *h, uint8_t kind,
		       void (*fn)(const struct held_handle *r, uint64_t fh, void *ctx), void *ctx)
{
	uint32_t handles = atomic_load(&h->hdr->handles_high);

	for (uint32_t s = 0; s < handles && s < HELD_HANDLES_MAX; s++) {
		const struct held_handle *r = handle_at(h, s);
		if (atomic_load_explicit(&r->kind, memory_order_acquire) == kind)
			fn(r, (uint64_t)atomic_load(&r->gen) << 32 | ((uint64_t)s + 1), ctx);
	}
}

void held_nodes_taken_over_each(struct held *h, void (*fn)(uint64_t id, uint8_t type, void *ctx),
				void *ctx)
{
#ifdef MADV_POPULATE_READ
	/* The records' pages mapped in one call, not a fault each. */
	uintptr_t from = (uintptr_t)node_at(h, 0) & ~(uintptr_t)4095;
	uintptr_t to = (uintptr_t)node_at(h, h->scan_end);
	if (to > from)
		madvise((void *)from, to - from, MADV_POPULATE_READ);
#endif
	for (uint32_t s = 0; s < h->scan_end; s++) {
		uint8_t type = atomic_load_explicit(&node_at(h, s)->type, memory_order_acquire);
		if (type)
			fn(HELD_NODE_BASE + s, type, ctx);
	}
}

/* ---- text pages -------------------------------------------------------------------- */

static bool page_used(const struct held *h, size_t p)
{
	return h->text_used[p / 64] >> (p % 64) & 1;
}

static void pages_mark(struct held *h, size_t from, size_t n, bool used)
{
	for (size_t p = from; p < from + n; p++) {
		if (used)
			h->text_used[p / 64] |= 1ull << (p % 64);
		else
			h->text_used[p / 64] &= ~(1ull << (p % 64));
	}
}

/* Under h->mu: n free pages in a row, the first after the hint (then from
 * the start); SIZE_MAX if none. */
static size_t pages_find(struct held *h, size_t n)
{
	size_t start = h->text_hint < h->text_pages ? h->text_hint : 0;

	if (n > h->text_pages)
		return SIZE_MAX;
	for (int pass = 0; pass < 2; pass++) {
		size_t p = pass ? 0 : start;
		size_t limit = pass ? start + n : h->text_pages;
		if (limit > h->text_pages)
			limit = h->text_pages;
		while (p + n <= limit) {
			size_t k = 0;
			while (k < n && !page_used(h, p + k))
				k++;
			if (k == n) {
				h->text_hint = p + n;
				return p;
			}
			p += k + 1;
		}
	}
	return SIZE_MAX;
}

/* Under h->mu: gives the pages of a text back (their memory to the system
 * when they are many). */
static void pages_free(struct held *h, uint64_t at, uint64_t cap)
{
	size_t from = at / HELD_TEXT_PAGE, n = cap / HELD_TEXT_PAGE;

	if (!cap)
		return;
	pages_mark(h, from, n, false);
	if (n >= 16)
		madvise(h->base + h->hdr->text_off + at, cap, h->fd >= 0 ? MADV_REMOVE : MADV_DONTNEED);
}

int held_text_reserve(struct held *h, struct held_handle *hh, size_t cap)
{
	size_t n = (page_up(cap ? cap : 1)) / HELD_TEXT_PAGE;

	if (cap <= hh->text_cap)
		return 0;
	pthread_mutex_lock(&h->mu);
	size_t p = pages_find(h, n);
	if (p != SIZE_MAX)
		pages_mark(h, p, n, true);
	pthread_mutex_unlock(&h->mu);
	if (p == SIZE_MAX)
		return -ENOMEM;
	uint64_t at = (uint64_t)p * HELD_TEXT_PAGE;
	uint8_t *text = h->base + h->hdr->text_off;
	if (hh->text_len)
		memcpy(text + at, text + hh->text_at, hh->text_len);
	uint64_t old_at = hh->text_at, old_cap = hh->text_cap;
	/* The new place is whole before the record points at it. */
	hh->text_at = at;
	hh->text_cap = n * HELD_TEXT_PAGE;
	pthread_mutex_lock(&h->mu);
	pages_free(h, old_at, old_cap);
	pthread_mutex_unlock(&h->mu);
	return 0;
}

uint8_t *held_text(struct held *h, const struct held_handle *hh)
{
	return hh->text_cap ? h->base + h->hdr->text_off + hh->text_at : NULL;
}

void held_handle_free(struct held *h, uint64_t fh)
{
	struct held_handle *r = held_handle_get(h, fh);

	if (!r)
		return;
	uint64_t at = r->text_at, cap = r->text_cap;
	r->text_cap = r->text_len = 0;
	atomic_store(&r->kind, 0);
	pthread_mutex_lock(&h->mu);
	pages_free(h, at, cap);
	push(&h->free_handles, &h->nfree_handles, &h->cap_handles, held_handle_slot(fh));
	pthread_mutex_unlock(&h->mu);
}

/* ---- the key filter ------------------------------------------------------------------ */

/* The filter's k bits for key: keys are SHA-256 digests, so 27-bit slices
 * of them are as good as k independent hashes. */
static uint64_t key_bit(const uint8_t key[32], int i)
{
	uint32_t w;

	memcpy(&w, key + 4 * i, sizeof(w));
	return w & (HELD_KEYS_BITS - 1);
}

static _Atomic uint64_t *key_words(const struct held *h)
{
	return (_Atomic uint64_t *)(h->base + h->hdr->keys_off);
}

void held_keys_add(struct held *h, const uint8_t key[32])
{
	_Static_assert(HELD_KEYS_K * 4 <= 32 && HELD_KEYS_BITS <= (1ull << 32), "slices of a key");
	_Atomic uint64_t *words = key_words(h);

	for (int i = 0; i < HELD_KEYS_K; i++) {
		uint64_t b = key_bit(key, i);
		if (!(atomic_load_explicit(&words[b / 64], memory_order_relaxed) >> (b % 64) & 1))
			atomic_fetch_or(&words[b / 64], 1ull << (b % 64));
	}
}

bool held_keys_may_hold(const struct held *h, const uint8_t key[32])
{
	_Atomic uint64_t *words = key_words(h);

	for (int i = 0; i < HELD_KEYS_K; i++) {
		uint64_t b = key_bit(key, i);
		if (!(atomic_load(&words[b / 64]) >> (b % 64) & 1))
			return false;
	}
	return true;
}

/* ---- taking over ------------------------------------------------------------------ */

void held_scan_nodes(struct held *h)
{
	const uint32_t chunk = 4096;

	for (uint32_t from = 0; from < h->scan_end; from += chunk) {
		uint32_t to = h->scan_end - from < chunk ? h->scan_end : from + chunk;
		pthread_mutex_lock(&h->mu);
		for (uint32_t s = from; s < to; s++)
			if (!atomic_load(&node_at(h, s)->type))
				push(&h->free_nodes, &h->nfree_nodes, &h->cap_nodes, s);
		h->scanned_nodes = to;
		pthread_mutex_unlock(&h->mu);
	}
}

/* The free handle slots, and the text pages of the live ones. */
static void scan_handles(struct held *h)
{
	uint32_t handles = atomic_load(&h->hdr->handles_high);

	pthread_mutex_lock(&h->mu);
	for (uint32_t s = 0; s < handles; s++) {
		struct held_handle *r = handle_at(h, s);
		if (!atomic_load(&r->kind))
			push(&h->free_handles, &h->nfree_handles, &h->cap_handles, s);
		else if (r->text_cap && r->text_cap <= HELD_TEXT_BYTES &&
			 r->text_at <= HELD_TEXT_BYTES - r->text_cap && r->text_at % HELD_TEXT_PAGE == 0 &&
			 r->text_cap % HELD_TEXT_PAGE == 0)
			pages_mark(h, r->text_at / HELD_TEXT_PAGE, r->text_cap / HELD_TEXT_PAGE, true);
		else
			r->text_cap = r->text_len = 0; /* not a text this layout can hold */
	}
	pthread_mutex_unlock(&h->mu);
}
