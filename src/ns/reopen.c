/* SPDX-License-Identifier: Apache-2.0 */
/* The handles a daemon before gave out (DESIGN.md §8): the kernel's fh
 * resolves to this daemon's handle, or to its file opened again from the
 * holder's record, as its kind allows (revive.c makes those that cannot
 * be). */
#include "autoconf.h"

#include <errno.h>
#include <string.h>

#include "lib/log.h"
#include "ns/listing.h"
#include "ns/ns_i.h"
#include "ns/revive.h"
#include "ns/tree.h"
#include "r3/publish.h"
#include "r3/put.h"
#include "state/ids.h"
#include "trees/wtree.h"

/* An fh that is no open file: every call fails (a kernel never sends one). */
static const struct handle_ops no_handle_ops = { .kind = "none", .release_slow = false };
static struct handle no_handle = { .ops = &no_handle_ops, .users = 1u << 30 };

/* A publish whose daemon died: opened again when nothing was written yet
 * (its first write is sent again), else what was decided, or EIO. */
static int reopen_publish(struct tree *t, struct node *n, const struct held_handle *rec,
			  struct handle **h)
{
	uint8_t state = atomic_load(&rec->state);

	if (state == REVIVE_FINISHED || state == REVIVE_COMMITTING) {
		int result = state == REVIVE_FINISHED ? rec->result : revive_commit_outcome(t, rec);
		*h = revive_finished(t, result);
		return *h ? 0 : -ENOMEM;
	}
	bool goes_on = (state == REVIVE_FRESH || state == REVIVE_HANDED) &&
		       (n->type == NODE_OBJECT || n->type == NODE_KEY);
	struct object *o = n->type == NODE_KEY ? object_of_key(n) : (struct object *)n;
	if (!goes_on || o->state != OBJECT_PUBLISHING) {
		*h = revive_dead(t, HANDLE_PUBLISH);
		return *h ? 0 : -ENOMEM;
	}
	node_ref(&o->node);
	if (state == REVIVE_FRESH) {
		int rc = publish_begin(t, o, h);
		if (rc < 0)
			node_unref(&o->node, 1);
		return rc;
	}
	return publish_resume(t, o, held_text(&t->held, rec), rec->text_len, h);
}

/* Opens fh's file again from its record, as its kind allows. */
static int reopen(struct tree *t, const struct held_handle *rec, struct handle **h)
{
	struct open_reply r = { 0 };
	struct node *n = tree_node(t, rec->node);
	enum handle_kind kind = (enum handle_kind)atomic_load(&rec->kind);
	uint8_t state = atomic_load(&rec->state);

	switch (kind) {
	case HANDLE_LISTING:
		return listing_open(t, n, h);
	case HANDLE_PUBLISH:
		return reopen_publish(t, n, rec, h);
	case HANDLE_PUT:
		if (n->type != NODE_PUT)
			break; /* its version is gone */
		if (state == REVIVE_HANDED)
			return put_resume(t, n == &t->keys_put ? NULL : version_of_put(n),
					  held_text(&t->held, rec), rec->text_len, h);
		if (state != REVIVE_FRESH)
			break; /* its batch died with the daemon */
		return files_open_node(t, n, rec->flags, h, &r);
	case HANDLE_RANK: /* an attachment of weights the holder keeps */
		if (n->type != NODE_WEIGHTS_RANK)
			break;
		return files_open_node(t, n, rec->flags, h, &r);
	case HANDLE_WEIGHTS_PUBLISH:
		break; /* a publish that died with the daemon */
	case HANDLE_BLOCKS_PUT: /* records in flight died with the daemon: EIO once */
		if (state == REVIVE_HANDED) /* drained for an upgrade: it goes on */
			return wblocks_put_resume(t, held_text(&t->held, rec), rec->text_len, h);
		if (state != REVIVE_FRESH)
			break;
		return files_open_node(t, n, rec->flags, h, &r);
	case HANDLE_CACHE_WRITE: { /* a .cache/ file being written: its writer goes on */
		int rc = wtree_reopen_write(t, n, rec, h);
		if (rc != -EALREADY)
			return rc;
		*h = revive_finished(t, 0); /* committed already: its close answers 0 */
		return *h ? 0 : -ENOMEM;
	}
	default:
		return files_open_node(t, n, rec->flags, h, &r);
	}
	*h = revive_dead(t, kind);
	return *h ? 0 : -ENOMEM;
}

struct handle *tree_released(struct tree *t, uint64_t fh)
{
	struct handle *h = ids_handle(t, fh);
	struct held_handle *rec;

	if (h)
		return h;
	rec = ids_handle_record(t, fh);
	if (rec && atomic_load(&rec->kind) != HANDLE_PUT && atomic_load(&rec->kind) != HANDLE_PUBLISH)
		held_handle_free(&t->held, fh); /* nothing of it is open here */
	else if (rec)
		return tree_handle(t, fh); /* a batch or publish handed over: its release ends it */
	return NULL;
}

struct handle *tree_handle(struct tree *t, uint64_t fh)
{
	struct handle *h = ids_handle(t, fh);
	const struct held_handle *rec;

	if (h)
		return h;
	if (!(rec = ids_handle_record(t, fh)))
		return &no_handle;
	int rc = reopen(t, rec, &h);
	if (rc < 0 && !(h = revive_dead(t, (enum handle_kind)atomic_load(&rec->kind)))) {
		log_err("takeover: cannot open file handle %llu again: %s", (unsigned long long)fh,
			strerror(-rc));
		return &no_handle;
	}
	if (rc < 0)
		log_warn("takeover: file handle %llu (kind %u) cannot be opened again (%s); its "
			 "calls fail with EIO", (unsigned long long)fh,
			 (unsigned)atomic_load(&rec->kind), strerror(-rc));
	handle_register(h);
	struct handle *mapped = ids_handle_install(t, fh, h);
	if (mapped != h) { /* another thread opened it first */
		h->fh = 0;
		handle_put(t, h);
		return mapped ? mapped : &no_handle;
	}
	if (h->ops->resume) /* a remnant that stands for a dead one has none */
		h->ops->resume(t, h);
	return h;
}
