/* SPDX-License-Identifier: Apache-2.0 */
/* The nodes under <wv>/weights: lookup, attributes, open (each file's
 * handle comes from the file that owns it) and listing. */
#include "autoconf.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "state/ids.h"
#include "state/text.h"
#include "weights/weights.h"
#include "weights/weights_i.h"

static const char *const file_names[WEIGHTS_FILE_COUNT] = {
	[WEIGHTS_MANIFEST] = "manifest.json",
	[WEIGHTS_STATUS] = "status",
	[WEIGHTS_PUBLISH] = ARTFS_PUBLISH_NAME,
};

static struct weights *weights_of(struct node *n)
{
	return (struct weights *)n->owner;
}

struct node *weights_dir_node(struct weights *w)
{
	return &w->dir;
}

/* ---- the namespace ------------------------------------------------------------- */

static bool rank_name(const char *name, int nranks, int *rank)
{
	if (strncmp(name, "rank", 4) != 0 || !isdigit((unsigned char)name[4]) ||
	    (name[4] == '0' && name[5]))
		return false;
	char *end;
	long r = strtol(name + 4, &end, 10);
	if (*end || r < 0 || r >= nranks)
		return false;
	*rank = (int)r;
	return true;
}

int weights_lookup(struct tree *t, struct node *dir, const char *name, struct node **out)
{
	struct weights *w = weights_of(dir);
	int rank;

	pthread_mutex_lock(&w->mu);
	bool gone = w->unloaded, ready = w->state == READY;
	pthread_mutex_unlock(&w->mu);
	if (gone)
		return -ENOENT;
	if (strcmp(name, file_names[WEIGHTS_STATUS]) == 0)
		*out = &w->files[WEIGHTS_STATUS];
	else if (strcmp(name, file_names[WEIGHTS_PUBLISH]) == 0)
		*out = &w->files[WEIGHTS_PUBLISH];
	else if (strcmp(name, file_names[WEIGHTS_MANIFEST]) == 0 && ready)
		*out = &w->files[WEIGHTS_MANIFEST];
	else if (rank_name(name, w->nranks, &rank))
		*out = &w->ranks[rank].node;
	else
		return -ENOENT;
	node_ref(*out);
	return 0;
}

int weights_getattr(struct tree *t, struct node *n, struct stat *st, double *timeout)
{
	struct weights *w = weights_of(n);

	memset(st, 0, sizeof(*st));
	st->st_ino = node_id(t, n);
	st->st_uid = t->cfg->uid;
	st->st_gid = t->cfg->gid;
	st->st_nlink = 1;
	st->st_blksize = 128 * 1024;
	st->st_atim.tv_sec = st->st_mtim.tv_sec = st->st_ctim.tv_sec = w->ver->created;
	*timeout = 0;
	pthread_mutex_lock(&w->mu);
	bool gone = w->unloaded;
	size_t manifest_len = w->manifest_len;
	pthread_mutex_unlock(&w->mu);
	if (gone)
		return -ENOENT;
	switch (n->type) {
	case NODE_WEIGHTS_DIR:
		st->st_mode = S_IFDIR | (0555 & ~t->cfg->umask);
		st->st_nlink = 2;
		break;
	case NODE_WEIGHTS_FILE:
		st->st_mode = S_IFREG | (0444 & ~t->cfg->umask);
		if (n->sub == WEIGHTS_MANIFEST) {
			st->st_size = (off_t)manifest_len; /* fixed once ready */
			*timeout = 1.0;
		}
		if (n->sub == WEIGHTS_PUBLISH)
			st->st_mode = S_IFREG | (0666 & ~t->cfg->umask);
		break;
	default: /* rank<k>: read-only, its content is the ioctl */
		st->st_mode = S_IFREG | (0444 & ~t->cfg->umask);
		break;
	}
	return 0;
}

int weights_open(struct tree *t, struct node *n, int flags, struct handle **h,
		 struct open_reply *r)
{
	struct weights *w = weights_of(n);

	if (n->type == NODE_WEIGHTS_FILE && n->sub == WEIGHTS_PUBLISH)
		return direct_open(t, w, flags, h, r);
	if ((flags & O_ACCMODE) != O_RDONLY)
		return -EACCES;
	if (n->type == NODE_WEIGHTS_FILE) {
		char *text;
		if (n->sub == WEIGHTS_STATUS) {
			text = weights_status_text(w);
			r->direct_io = true;
		} else {
			pthread_mutex_lock(&w->mu);
			text = w->manifest ? strdup(w->manifest) : NULL;
			pthread_mutex_unlock(&w->mu);
			r->keep_cache = true;
		}
		return text ? text_open(text, h, r) : -ENOMEM;
	}
	if (n->type != NODE_WEIGHTS_RANK)
		return -EISDIR;
	struct rank_handle *rh = calloc(1, sizeof(*rh));
	if (!rh)
		return -ENOMEM;
	pthread_mutex_lock(&w->mu);
	if (w->unloaded) {
		pthread_mutex_unlock(&w->mu);
		free(rh);
		return -ENOENT;
	}
	w->attached++;
	w->ranks[n->sub].attached++;
	pthread_mutex_unlock(&w->mu);
	handle_init(&rh->h, &rank_ops);
	rh->w = w;
	rh->rank = n->sub;
	node_ref(&w->node);
	r->direct_io = true;
	r->noflush = true;
	*h = &rh->h;
	return 0;
}

void weights_list(struct tree *t, struct node *dir,
		  void (*add)(void *ctx, const char *name, uint64_t ino, unsigned char type), void *ctx)
{
	struct weights *w = weights_of(dir);
	char name[16];

	pthread_mutex_lock(&w->mu);
	bool ready = w->state == READY, gone = w->unloaded;
	pthread_mutex_unlock(&w->mu);
	if (gone)
		return;
	if (ready)
		add(ctx, file_names[WEIGHTS_MANIFEST], node_id(t, &w->files[WEIGHTS_MANIFEST]), DT_REG);
	add(ctx, file_names[WEIGHTS_STATUS], node_id(t, &w->files[WEIGHTS_STATUS]), DT_REG);
	add(ctx, file_names[WEIGHTS_PUBLISH], node_id(t, &w->files[WEIGHTS_PUBLISH]), DT_REG);
	for (int r = 0; r < w->nranks; r++) {
		snprintf(name, sizeof(name), "rank%d", r);
		add(ctx, name, node_id(t, &w->ranks[r].node), DT_REG);
	}
}
