/* SPDX-License-Identifier: Apache-2.0 */
/* Calls on open files and directories, passed to the ops of their handle
 * (what each kind does lives with the module that made the handle), and
 * whether a call is quick enough to answer on the FUSE thread. */
#include "autoconf.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>

#include "ns/listing.h"
#include "ns/ns_i.h"
#include "ns/tree.h"

int tree_read(struct tree *t, struct handle *h, uint64_t off, size_t size,
	      const void **data, size_t *len)
{
	if (!h->ops->read)
		return -EBADF;
	int rc = h->ops->read(t, h, off, size, data, len);
	if (rc == 0)
		handle_get(h); /* until the reply is sent: tree_read_done */
	return rc;
}

void tree_read_done(struct tree *t, struct handle *h)
{
	handle_put(t, h);
}

int tree_write(struct tree *t, struct handle *h, uint64_t off, const void *buf, size_t len,
	       uint64_t owner)
{
	return h->ops->write ? h->ops->write(t, h, off, buf, len, owner) : -EBADF;
}

int tree_write_begin(struct tree *t, struct handle *h, uint64_t off, const void *buf, size_t len,
		     uint64_t owner)
{
	handle_get(h); /* until tree_write_end: a release after the reply waits for it */
	if (!h->ops->write_begin)
		return tree_write(t, h, off, buf, len, owner);
	return h->ops->write_begin(t, h, off, buf, len, owner);
}

void tree_write_end(struct tree *t, struct handle *h)
{
	if (h->ops->write_begin)
		h->ops->write_end(t, h);
	handle_put(t, h);
}

int tree_flush(struct tree *t, struct handle *h, uint64_t owner)
{
	return h->ops->flush ? h->ops->flush(t, h, owner) : 0;
}

int tree_fsync(struct tree *t, struct handle *h)
{
	return h->ops->fsync ? h->ops->fsync(t, h) : 0;
}

void tree_release(struct tree *t, struct handle *h)
{
	handle_put(t, h);
}

bool tree_read_quick(struct tree *t, struct handle *h)
{
	return !h->ops->read_quick || h->ops->read_quick(t, h);
}

bool tree_write_quick(struct tree *t, struct handle *h, size_t len)
{
	return !h->ops->write_quick || h->ops->write_quick(t, h, len);
}

bool tree_flush_quick(struct tree *t, struct handle *h)
{
	return !h->ops->flush_quick || h->ops->flush_quick(t, h);
}

bool tree_release_quick(struct tree *t, struct handle *h)
{
	return !h->ops->release_slow;
}

bool tree_name_quick(struct tree *t, struct node *parent)
{
	return !t->remote && !(parent == &t->keys_dir && t->sizing);
}

bool tree_opendir_quick(struct tree *t, struct node *n)
{
	if (n->type == NODE_CACHE_DIR) /* with remote=, its listing asks the cluster */
		return !t->remote;
	if (n->type == NODE_KEYS_DIR)
		return !t->sizing && t->idx.keys.count < 4096;
	return n->type != NODE_VERSION || ((struct version *)n)->objects.count < 4096;
}

unsigned tree_poll(struct tree *t, struct handle *h)
{
	return h->ops->poll ? h->ops->poll(t, h) : POLLIN | POLLOUT | POLLRDNORM | POLLWRNORM;
}

int tree_ioctl(struct tree *t, struct handle *h, unsigned int cmd, const void *in, size_t in_len,
	       void *out, size_t out_len)
{
	return h->ops->ioctl ? h->ops->ioctl(t, h, cmd, in, in_len, out, out_len) : -ENOTTY;
}

/* ---- directories -------------------------------------------------------- */

int tree_opendir(struct tree *t, struct node *n, struct handle **h)
{
	int rc = listing_open(t, n, h);

	return rc < 0 ? rc : files_handle_ready(t, *h, n, O_RDONLY);
}

int tree_readdir(struct tree *t, struct handle *h, size_t i, struct dir_entry *de)
{
	return h->ops->readdir ? h->ops->readdir(t, h, i, de) : -ENOTDIR;
}

void tree_releasedir(struct tree *t, struct handle *h)
{
	handle_put(t, h);
}
