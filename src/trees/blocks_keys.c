/* SPDX-License-Identifier: Apache-2.0 */
/* Blocks by key (DESIGN.md §10): a key's segments are the path of its
 * file below .blocks/. Finding a key's block, and placing a block whose
 * bytes are in memory (a .put record, a block fetched from the cluster):
 * its directories made as needed, and the first bytes of a key stay. */
#include "autoconf.h"

#include <errno.h>
#include <string.h>

#include "lib/log.h"
#include "trees/blocks.h"
#include "trees/names.h"

/* The next segment of key after *at (a checked key): its bytes into seg. */
static bool next_segment(const char *key, size_t len, size_t *at, char seg[WTREE_NAME_MAX + 1])
{
	if (*at > len)
		return false;
	const char *slash = memchr(key + *at, '/', len - *at);
	size_t end = slash ? (size_t)(slash - key) : len;
	memcpy(seg, key + *at, end - *at);
	seg[end - *at] = '\0';
	*at = end + 1;
	return true;
}

struct wnode *wblocks_find(struct wtree *w, const char *key, size_t len, uint64_t *size)
{
	char seg[WTREE_NAME_MAX + 1];
	size_t at = 0;
	struct wnode *n = w->root;

	pthread_mutex_lock(&w->mu);
	while (n && n->dir && next_segment(key, len, &at, seg))
		n = n->state == WNODE_LIVE ? wnode_find_locked(w, n, seg) : NULL;
	if (n && (n->dir || n->state != WNODE_LIVE || at <= len))
		n = NULL; /* a directory, or the key goes on below a block */
	if (n) {
		node_ref(&n->node);
		*size = n->size;
	}
	pthread_mutex_unlock(&w->mu);
	return n;
}

/* The directory that holds key's block, made as needed, referenced; its
 * last segment into last. -EEXIST: a block holds a directory's name. */
static int parent_make(struct wtree *w, const char *key, size_t len, struct wnode **out,
		       char last[WTREE_NAME_MAX + 1])
{
	struct wnode *dir = w->root;
	size_t at = 0;
	int rc = 0;

	node_ref(&dir->node);
	while (rc == 0 && next_segment(key, len, &at, last) && at <= len) {
		struct wnode *sub = NULL;
		rc = wdir_make(w, dir, last, &sub);
		node_unref(&dir->node, 1);
		dir = sub;
		if (rc == 0 && !dir->dir)
			rc = -EEXIST;
	}
	if (rc < 0) {
		if (dir)
			node_unref(&dir->node, 1);
		return rc;
	}
	*out = dir;
	return 0;
}

/* n holds key already: the first stays; other bytes are counted, logged. */
static void first_stays(struct wtree *w, const struct wnode *n, const char *key, size_t len,
			const struct wvalue *v)
{
	if (n->size == v->size && memcmp(n->sha, v->val, 32) == 0)
		return;
	counter_inc(w->c.collisions);
	log_info("blocks: %s/%.*s was put first with other bytes; those stay", w->p->mount_name,
		 (int)len, key);
}

/* With remote=, the block goes to the cluster before it is committed
 * here (DESIGN.md §7): another node's other bytes first are what this
 * node keeps (*theirs). 0, 1 (theirs), -errno (nothing committed). */
static int claim(struct tree *t, struct wtree *w, const char *key, size_t len,
		 const struct wvalue *v, struct wvalue *theirs)
{
	char path[WBLOCKS_KEY_MAX + 1];

	if (!t->remote)
		return 0;
	memcpy(path, key, len);
	path[len] = '\0';
	int rc = wcluster_claim_value(w, path, v, theirs);
	if (rc == 1) {
		counter_inc(w->c.collisions);
		log_info("blocks: %s/%s was put first by another node with other bytes; those stay",
			 w->p->mount_name, path);
	}
	return rc;
}

int wblocks_place(struct tree *t, struct wtree *w, const char *key, size_t len,
		  const struct wvalue *v, bool fetched, struct wnode **out)
{
	char last[WTREE_NAME_MAX + 1];
	struct wvalue theirs = { 0 };
	struct wnode *dir = NULL, *n = NULL;
	uint64_t size;

	if ((len == 4 && (memcmp(key, ".put", 4) == 0 || memcmp(key, ".get", 4) == 0)))
		return -EEXIST; /* the batch files' names, no key's */
	if ((n = wblocks_find(w, key, len, &size))) { /* held here: no cluster round */
		first_stays(w, n, key, len, v);
		goto done;
	}
	int rc = fetched ? 0 : claim(t, w, key, len, v, &theirs);
	if (rc < 0)
		return rc;
	const struct wvalue *kept = rc == 1 ? &theirs : v;
	/* Its directory may be collected (ttl=) between its making and the
	 * link: made again, a few times. */
	for (int tries = 0; tries < 3 && (tries == 0 || rc == -ENOENT); tries++) {
		rc = parent_make(w, key, len, &dir, last);
		if (rc == 0) {
			rc = wfile_adopt(t, dir, last, kept, fetched, &n);
			node_unref(&dir->node, 1);
		}
	}
	if (rc == 0 && n->dir) {
		node_unref(&n->node, 1);
		rc = -EEXIST; /* a directory holds the key's name */
	}
	if (rc == 0)
		first_stays(w, n, key, len, kept);
	wvalue_free(&theirs);
	if (rc < 0)
		return rc;
done:
	if (out)
		*out = n;
	else
		node_unref(&n->node, 1);
	return 0;
}
