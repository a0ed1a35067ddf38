/* SPDX-License-Identifier: Apache-2.0 */
/* Weights that outlive their daemon (DESIGN.md §8): the holder keeps
 * their slabs' descriptors and a record of them; the next daemon takes
 * them over without reading the checkpoint again, and finds the nodes a
 * daemon before gave ids. */
#include "autoconf.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/key.h"
#include "format/weights_record.h"
#include "lib/log.h"
#include "lib/sha256.h"
#include "restart/keeper.h"
#include "store/store.h"
#include "weights/weights.h"
#include "weights/weights_i.h"

/* ---- kept by the holder (DESIGN.md §8) ---------------------------------------------- */

#define KEPT_ROOT "w/"

/* The tags of wv's weights begin with "w/<sha256(wv), 32 hex digits>/":
 * a version's name may be longer than a tag. */
static void kept_prefix(const char *wv, char out[48])
{
	uint8_t sum[32];
	char hex[65];

	sha256_once(wv, strlen(wv), sum);
	key_hex(sum, 16, hex);
	snprintf(out, 48, KEPT_ROOT "%.32s/", hex);
}

/* text without its "attached = " line (it changes; status says it anew). */
static void drop_attached_line(char *text)
{
	char *line = strstr(text, "attached = ");
	if (line && (line == text || line[-1] == '\n')) {
		char *end = strchr(line, '\n');
		memmove(line, end ? end + 1 : line + strlen(line), strlen(end ? end + 1 : "") + 1);
	}
}

/* The record of ready weights w (with w->mu held); NULL without memory. */
static char *record_of(struct weights *w, char *status, size_t *len)
{
	struct wrecord *rec = calloc(1, sizeof(*rec));
	char *out = NULL;

	if (!rec)
		return NULL;
	snprintf(rec->version, sizeof(rec->version), "%s", w->ver->name);
	snprintf(rec->quant_method, sizeof(rec->quant_method), "%s", w->ckpt.quant_method);
	rec->quant_block_fp8 = w->ckpt.quant_block_fp8;
	rec->status = status;
	rec->manifest = w->manifest;
	rec->manifest_len = w->manifest_len;
	rec->nranks = w->nranks;
	for (int r = 0; r < w->nranks; r++) {
		rec->ranks[r].device = w->ranks[r].device;
		memcpy(rec->ranks[r].uuid, w->ranks[r].dev.uuid, 16);
		rec->ranks[r].slab_size = w->granks[r].slab_size;
		rec->ranks[r].bytes = w->ranks[r].total_bytes;
		rec->ranks[r].fp = w->ranks[r].fp;
	}
	out = wrecord_encode(rec, len);
	free(rec);
	return out;
}

/* A memfd holding len bytes of text, or -errno. */
static int memfd_with(const char *name, const char *text, size_t len)
{
	int fd = memfd_create(name, MFD_CLOEXEC);
	if (fd < 0)
		return -errno;
	int rc = store_pwrite_all(fd, text, len, 0);
	if (rc < 0) {
		close(fd);
		return rc;
	}
	return fd;
}

/* Hands the holder w's slab descriptors, then its record (last: a record
 * names slabs that are all kept). w is ready; not called with w->mu held. */
void weights_keep(struct weights *w)
{
	struct tree *t = w->t;
	char *status = weights_status_text(w), prefix[48], tag[KEEPER_TAG_MAX];
	size_t len = 0;
	int rc = 0, memfd = -1;

	if (!status)
		return;
	drop_attached_line(status);
	kept_prefix(w->ver->name, prefix);
	pthread_mutex_lock(&w->mu);
	if (w->unloaded || w->state != READY || w->kept)
		goto out;
	char *bytes = record_of(w, status, &len);
	rc = bytes ? memfd_with("artfs-weights", bytes, len) : -ENOMEM;
	free(bytes);
	memfd = rc;
	for (int r = 0; r < w->nranks && rc >= 0; r++) {
		snprintf(tag, sizeof(tag), "%ss%d", prefix, r);
		rc = keeper_link_keep(&t->keeper, tag, w->granks[r].fd);
	}
	if (rc >= 0) {
		snprintf(tag, sizeof(tag), "%smeta", prefix);
		rc = keeper_link_keep(&t->keeper, tag, memfd);
	}
	if (rc < 0) {
		if (rc != -ENOTCONN) {
			keeper_link_drop(&t->keeper, prefix, true);
			log_warn("weights %s: the holder does not keep them (%s): they will not outlive "
				 "this daemon", w->ver->name, strerror(-rc));
		}
		goto out;
	}
	w->kept = true;
	snprintf(w->kept_tag, sizeof(w->kept_tag), "%s", prefix);
	log_info("weights %s: the holder keeps their %d slab%s", w->ver->name, w->nranks,
		 w->nranks > 1 ? "s" : "");
out:
	pthread_mutex_unlock(&w->mu);
	if (memfd >= 0)
		close(memfd);
	free(status);
}

/* Drops what the holder keeps of w (with w->mu held): unloaded. */
void weights_unkeep_locked(struct weights *w)
{
	if (!w->kept)
		return;
	int rc = keeper_link_drop(&w->t->keeper, w->kept_tag, true);
	if (rc < 0)
		log_warn("weights %s: the holder may still keep their GPU memory: %s", w->ver->name,
			 strerror(-rc));
	w->kept = false;
}

/* What the holder keeps under KEPT_ROOT, as found at a takeover. */
struct kept_fd {
	char tag[KEEPER_TAG_MAX];
	int fd;
};

/* The descriptor kept under tag among k[0..n) (taken: -1 left there), or -1. */
static int kept_take(struct kept_fd *k, size_t n, const char *tag)
{
	for (size_t i = 0; i < n; i++)
		if (k[i].fd >= 0 && strcmp(k[i].tag, tag) == 0) {
			int fd = k[i].fd;
			k[i].fd = -1;
			return fd;
		}
	return -1;
}

/* The record in memfd fd, decoded. */
static int kept_record(int fd, struct wrecord *rec, char *err, size_t errlen)
{
	struct stat st;

	if (fstat(fd, &st) < 0 || st.st_size <= 0 || (uint64_t)st.st_size > WRECORD_BYTES_MAX) {
		snprintf(err, errlen, "its record is not a file of a size it may have");
		return -EINVAL;
	}
	void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	if (p == MAP_FAILED) {
		snprintf(err, errlen, "its record: %s", strerror(errno));
		return -EINVAL;
	}
	int rc = wrecord_decode(p, (size_t)st.st_size, rec, err, errlen);
	munmap(p, (size_t)st.st_size);
	return rc;
}

/* Ready weights from a record and their slabs' descriptors (taken). */
static struct weights *weights_from_record(struct tree *t, struct version *v, struct wrecord *rec,
					   const int *fds)
{
	struct weights *w = calloc(1, sizeof(*w) + (size_t)rec->nranks * sizeof(struct weights_rank));
	struct gpu_rank *g = calloc((size_t)rec->nranks, sizeof(*g));

	if (!w || !g) {
		free(w);
		free(g);
		return NULL;
	}
	w->t = t;
	w->ver = v;
	w->nranks = rec->nranks;
	weights_init_nodes(w, rec->nranks);
	w->state = READY;
	w->thread_done = true;
	w->granks = g;
	w->load.ranks = g;
	w->load.nranks = rec->nranks;
	for (int r = 0; r < rec->nranks; r++) {
		struct weights_rank *wr = &w->ranks[r];
		wr->device = rec->ranks[r].device;
		wr->dev.index = rec->ranks[r].device;
		memcpy(wr->dev.uuid, rec->ranks[r].uuid, 16);
		wr->fp = rec->ranks[r].fp;
		wr->total_bytes = rec->ranks[r].bytes;
		g[r] = (struct gpu_rank){ .device = wr->device, .slab_size = rec->ranks[r].slab_size,
					  .fd = fds[r] };
		w->bytes_total += rec->ranks[r].bytes;
	}
	snprintf(w->ckpt.quant_method, sizeof(w->ckpt.quant_method), "%s", rec->quant_method);
	w->ckpt.quant_block_fp8 = rec->quant_block_fp8;
	w->manifest = rec->manifest;
	w->manifest_len = rec->manifest_len;
	weights_layouts_from_manifest(w);
	w->status_kept = rec->status;
	rec->manifest = rec->status = NULL;
	w->started_ns = w->finished_ns = weights_now_ns();
	return w;
}

/* Serves the weights that prefix's tags keep: 0, or -errno (why in err;
 * the caller drops the tags). */
static int take_over_one(struct tree *t, const char *prefix, int meta, struct kept_fd *k, size_t n,
			 char *err, size_t errlen)
{
	struct wrecord *rec = calloc(1, sizeof(*rec));
	int fds[WRECORD_RANKS_MAX], rc;
	char tag[KEEPER_TAG_MAX], want[48];

	if (!rec)
		return -ENOMEM;
	rc = kept_record(meta, rec, err, errlen);
	if (rc < 0) {
		free(rec);
		return rc;
	}
	kept_prefix(rec->version, want);
	if (strcmp(want, prefix) != 0 || !key_version_name_valid(rec->version)) {
		snprintf(err, errlen, "its record names version \"%s\", not that of its tags", rec->version);
		rc = -EINVAL;
	}
	for (int r = 0; r < rec->nranks; r++)
		fds[r] = -1;
	for (int r = 0; r < rec->nranks && rc == 0; r++) {
		snprintf(tag, sizeof(tag), "%ss%d", want, r);
		if ((fds[r] = kept_take(k, n, tag)) < 0) {
			snprintf(err, errlen, "the slab of rank %d is not kept", r);
			rc = -EINVAL;
		}
	}
	struct version *v = rc == 0 ? weights_version_for(t, rec->version, &rc) : NULL;
	struct weights *w = v ? weights_from_record(t, v, rec, fds) : NULL;
	if (v && !w) {
		node_unref(&v->node, 1);
		rc = -ENOMEM;
	}
	if (w) {
		pthread_mutex_lock(&t->lock);
		bool taken = v->removed || v->weights;
		if (!taken)
			v->weights = w;
		pthread_mutex_unlock(&t->lock);
		if (taken) {
			snprintf(err, errlen, "its version has other weights");
			weights_free(w); /* closes the descriptors it took */
			rc = -EEXIST;
		} else {
			w->kept = true;
			memcpy(w->kept_tag, want, sizeof(want));
			weights_all_add(t, w, false);
			log_info("weights %s: taken over from the daemon before (%d rank%s, %" PRIu64
				 " bytes), nothing read again", w->ver->name, w->nranks,
				 w->nranks > 1 ? "s" : "", w->bytes_total);
		}
	} else {
		for (int r = 0; r < rec->nranks; r++)
			if (fds[r] >= 0)
				close(fds[r]);
	}
	wrecord_free(rec);
	free(rec);
	return rc;
}

void weights_take_over(struct tree *t)
{
	struct kept_fd *k = NULL;
	size_t n = 0, cap = 0;
	char err[256];

	for (uint32_t i = 0;; i++) {
		struct kept_fd one;
		int rc = keeper_link_next(&t->keeper, KEPT_ROOT, i, one.tag, &one.fd);
		if (rc < 0) {
			if (rc != -ENOENT && rc != -ENOTCONN)
				log_err("takeover: cannot learn what the holder keeps: %s", strerror(-rc));
			break;
		}
		if (n == cap) {
			struct kept_fd *more = realloc(k, (cap = cap ? cap * 2 : 16) * sizeof(*k));
			if (!more) {
				close(one.fd);
				break;
			}
			k = more;
		}
		k[n++] = one;
	}
	for (size_t i = 0; i < n; i++) {
		size_t len = strlen(k[i].tag);
		if (k[i].fd < 0 || len < 5 || strcmp(k[i].tag + len - 5, "/meta") != 0)
			continue;
		char prefix[KEEPER_TAG_MAX];
		snprintf(prefix, sizeof(prefix), "%.*s", (int)(len - 4), k[i].tag);
		int meta = k[i].fd;
		k[i].fd = -1;
		if (take_over_one(t, prefix, meta, k, n, err, sizeof(err)) < 0) {
			log_err("takeover: the weights the holder keeps under %s are dropped: %s", prefix,
				err);
			keeper_link_drop(&t->keeper, prefix, true);
		}
		close(meta);
	}
	/* Slabs without a record: a daemon died while it handed them over. */
	for (size_t i = 0; i < n; i++)
		if (k[i].fd >= 0) {
			log_warn("takeover: %s is kept without a record of its weights: dropped", k[i].tag);
			keeper_link_drop(&t->keeper, k[i].tag, false);
			close(k[i].fd);
		}
	free(k);
}

/* ---- nodes a daemon before gave ids ------------------------------------------------- */

void weights_describe_node(const struct node *n, struct held_node *d)
{
	if (n->type != NODE_WEIGHTS_DIR && n->type != NODE_WEIGHTS_FILE && n->type != NODE_WEIGHTS_RANK)
		return;
	const struct weights *w = (const struct weights *)n->owner;
	size_t len = strlen(w->ver->name);
	d->name_len = (uint8_t)(len > HELD_NAME_MAX ? HELD_NAME_MAX : len);
	memcpy(d->name, w->ver->name, d->name_len);
	d->name[d->name_len] = '\0';
	d->sub = n->sub;
}

struct node *weights_revive_node(struct tree *t, const struct held_node *r)
{
	char name[HELD_NAME_MAX + 1];
	uint8_t type = atomic_load(&r->type);
	struct node *n = NULL;

	memcpy(name, r->name, r->name_len);
	name[r->name_len] = '\0';
	pthread_mutex_lock(&t->lock);
	struct version *v = index_version_find(&t->idx, name);
	struct weights *w = v ? v->weights : NULL;
	if (w && type == NODE_WEIGHTS_DIR)
		n = &w->dir;
	else if (w && type == NODE_WEIGHTS_FILE && r->sub < WEIGHTS_FILE_COUNT)
		n = &w->files[r->sub];
	else if (w && type == NODE_WEIGHTS_RANK && r->sub < w->nranks)
		n = &w->ranks[r->sub].node;
	if (n)
		node_ref(n);
	pthread_mutex_unlock(&t->lock);
	return n;
}
