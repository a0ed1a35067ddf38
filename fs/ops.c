/* SPDX-License-Identifier: Apache-2.0 */
/* FUSE low-level operations: each handler calls the core (src/ns/tree.h) and
 * turns its result into a reply. Nothing else lives here. */
#include "autoconf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fs/loop.h"
#include "fs/ops.h"
#include "ns/tree.h"
#include "state/ids.h"

static struct tree *tree_of(fuse_req_t req)
{
	return fuse_req_userdata(req);
}

static struct node *node_of(fuse_req_t req, fuse_ino_t ino)
{
	return tree_node(tree_of(req), ino);
}

static struct handle *handle_of(fuse_req_t req, const struct fuse_file_info *fi)
{
	return tree_handle(tree_of(req), fi->fh);
}

static void set_open_flags(struct fuse_file_info *fi, struct handle *h,
			   const struct open_reply *r)
{
	fi->fh = h->fh;
	fi->keep_cache = r->keep_cache;
	fi->direct_io = r->direct_io;
	fi->noflush = r->noflush;
	fi->nonseekable = r->nonseekable;
}

static void fill_entry(fuse_req_t req, const struct tree_entry *e, struct fuse_entry_param *p)
{
	memset(p, 0, sizeof(*p));
	p->ino = e->id;
	p->attr = e->st;
	p->attr_timeout = e->attr_timeout;
	p->entry_timeout = e->entry_timeout;
}

/* A positive entry hands the kernel one lookup reference; a negative one
 * (ino 0) asks it to remember the absence for entry_timeout. */
static void reply_entry(fuse_req_t req, int rc, const struct tree_entry *e)
{
	struct fuse_entry_param p;

	if (rc == -ENOENT && e->entry_timeout > 0) {
		memset(&p, 0, sizeof(p));
		p.entry_timeout = e->entry_timeout;
		fuse_reply_entry(req, &p);
		return;
	}
	if (rc < 0) {
		fuse_reply_err(req, -rc);
		return;
	}
	fill_entry(req, e, &p);
	if (fuse_reply_entry(req, &p) != 0)
		tree_forget(tree_of(req), e->id, 1); /* the request was interrupted */
}

/* A request's arguments and what to run. A request that may take long
 * (the core's quick tests say no) hands the reading of requests to another
 * thread first, then runs here, on the buffer the request was read into. */
struct job {
	void (*run)(struct job *j);
	fuse_req_t req;
	struct handle *h;
	struct node *n;
	struct fuse_file_info fi;
	size_t size;
	off_t off;
	const char *data;          /* write: the bytes; lookup and others: a name */
};

static void run_job(bool quick, struct job *j)
{
	if (!quick)
		fs_hand_off();
	j->run(j);
}

static void run_lookup(struct job *j)
{
	struct tree_entry e;
	int rc = tree_lookup(tree_of(j->req), j->n, j->data, &e);

	reply_entry(j->req, rc, &e);
}

static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct job j = { .run = run_lookup, .req = req, .n = node_of(req, parent), .data = name };

	run_job(tree_name_quick(tree_of(req), j.n), &j);
}

static void op_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
	tree_forget(tree_of(req), ino, nlookup);
	fuse_reply_none(req);
}

static void op_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *forgets)
{
	for (size_t i = 0; i < count; i++)
		tree_forget(tree_of(req), forgets[i].ino, forgets[i].nlookup);
	fuse_reply_none(req);
}

static void op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct stat st;
	double timeout;
	int rc = tree_getattr(tree_of(req), node_of(req, ino), &st, &timeout);

	if (rc < 0)
		fuse_reply_err(req, -rc);
	else
		fuse_reply_attr(req, &st, timeout);
}

static void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
		       struct fuse_file_info *fi)
{
	static const struct { int fuse; unsigned tree; } bits[] = {
		{ FUSE_SET_ATTR_MODE, TREE_SET_MODE },   { FUSE_SET_ATTR_UID, TREE_SET_UID },
		{ FUSE_SET_ATTR_GID, TREE_SET_GID },     { FUSE_SET_ATTR_SIZE, TREE_SET_SIZE },
		{ FUSE_SET_ATTR_ATIME, TREE_SET_ATIME }, { FUSE_SET_ATTR_MTIME, TREE_SET_MTIME },
		{ FUSE_SET_ATTR_ATIME_NOW, TREE_SET_ATIME }, { FUSE_SET_ATTR_MTIME_NOW, TREE_SET_MTIME },
		{ FUSE_SET_ATTR_CTIME, TREE_SET_CTIME },
	};
	unsigned set = 0;
	struct stat out;
	double timeout;

	for (size_t i = 0; i < sizeof(bits) / sizeof(bits[0]); i++)
		if (to_set & bits[i].fuse)
			set |= bits[i].tree;
	int rc = tree_setattr(tree_of(req), node_of(req, ino), set, attr, &out, &timeout);
	if (rc < 0)
		fuse_reply_err(req, -rc);
	else
		fuse_reply_attr(req, &out, timeout);
}

/* A request the kernel sent again after a daemon died may have been
 * carried out by that daemon: what it asked for is so now. */
static int again(int rc, int done)
{
	return rc == done && ids_request_resent() ? 0 : rc;
}

static void op_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode)
{
	struct tree *t = tree_of(req);
	struct node *p = node_of(req, parent);
	struct tree_entry e;
	int rc = tree_mkdir(t, p, name, &e);

	if (again(rc, -EEXIST) == 0 && rc < 0)
		rc = tree_lookup(t, p, name, &e);
	reply_entry(req, rc, &e);
}

static void run_rmdir(struct job *j)
{
	fuse_reply_err(j->req, -again(tree_rmdir(tree_of(j->req), j->n, j->data), -ENOENT));
}

static void op_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	/* With remote=, a .cache/ directory's removal tells the cluster. */
	struct job j = { .run = run_rmdir, .req = req, .n = node_of(req, parent), .data = name };

	run_job(tree_name_quick(tree_of(req), j.n), &j);
}

/* Whether req comes from this daemon itself: a thread of it, or a child
 * process of it (its bind of .artfs/attach, made apart: weights/socket.h;
 * the kernel gives the caller's thread id). */
static bool by_self(fuse_req_t req)
{
	char path[64], status[1024];
	pid_t pid = fuse_req_ctx(req)->pid;

	if (pid <= 0)
		return false;
	snprintf(path, sizeof(path), "/proc/self/task/%ld", (long)pid);
	if (pid == getpid() || access(path, F_OK) == 0)
		return true;
	snprintf(path, sizeof(path), "/proc/%ld/status", (long)pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	ssize_t n = read(fd, status, sizeof(status) - 1);
	close(fd);
	if (n <= 0)
		return false;
	status[n] = '\0';
	const char *ppid = strstr(status, "\nPPid:");
	return ppid && strtol(ppid + 7, NULL, 10) == (long)getpid();
}

static void run_unlink(struct job *j)
{
	/* Only .artfs/ asks who removes (one /proc lookup): not every unlink. */
	bool self = j->n->type == NODE_INFO_DIR && by_self(j->req);

	fuse_reply_err(j->req, -again(tree_unlink(tree_of(j->req), j->n, j->data, self), -ENOENT));
}

static void op_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct job j = { .run = run_unlink, .req = req, .n = node_of(req, parent), .data = name };

	run_job(tree_name_quick(tree_of(req), j.n), &j);
}

/* Only in the .cache/ tree: a key includes its path, R3 names never move. */
static void op_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
		      const char *newname, unsigned int flags)
{
	struct tree *t = tree_of(req);
	int rc = tree_rename(t, node_of(req, parent), name, node_of(req, newparent), newname, flags);

	fuse_reply_err(req, -again(rc, -ENOENT));
}

static void op_refuse(fuse_req_t req)
{
	fuse_reply_err(req, EPERM);
}

static void op_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, dev_t rdev)
{
	struct tree_entry e;
	int rc = tree_mknod(tree_of(req), node_of(req, parent), name, mode, by_self(req), &e);

	reply_entry(req, rc, &e);
}

static void op_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name)
{
	op_refuse(req);
}

static void op_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char *newname)
{
	op_refuse(req);
}

static void run_create(struct job *j)
{
	struct tree *t = tree_of(j->req);
	struct tree_entry e;
	struct open_reply r = { 0 };
	struct handle *h = NULL;
	struct fuse_entry_param p;
	int rc = tree_create(t, j->n, j->data, j->fi.flags, &e, &h, &r);

	if (rc < 0) { /* tree_create released what it made */
		fuse_reply_err(j->req, -rc);
		return;
	}
	set_open_flags(&j->fi, h, &r);
	fill_entry(j->req, &e, &p);
	if (fuse_reply_create(j->req, &p, &j->fi) != 0) {
		tree_release(t, h);
		tree_forget(t, e.id, 1);
	}
}

static void op_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
		      struct fuse_file_info *fi)
{
	struct job j = { .run = run_create, .req = req, .n = node_of(req, parent), .fi = *fi,
			 .data = name };

	run_job(tree_name_quick(tree_of(req), j.n), &j);
}

static void op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct tree *t = tree_of(req);
	struct open_reply r = { 0 };
	struct handle *h;
	int rc = tree_open_file(t, node_of(req, ino), fi->flags, &h, &r);

	if (rc < 0) {
		fuse_reply_err(req, -rc);
		return;
	}
	set_open_flags(fi, h, &r);
	if (fuse_reply_open(req, fi) != 0)
		tree_release(t, h);
}

static void run_read(struct job *j)
{
	struct tree *t = tree_of(j->req);
	const void *data;
	size_t len;
	int rc = tree_read(t, j->h, (uint64_t)j->off, j->size, &data, &len);

	if (rc < 0) {
		fuse_reply_err(j->req, -rc);
		return;
	}
	/* The kernel may deliver RELEASE before this reply's writev returns. */
	fuse_reply_buf(j->req, data, len);
	tree_read_done(t, j->h);
}

static void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		    struct fuse_file_info *fi)
{
	struct job j = { .run = run_read, .req = req, .h = handle_of(req, fi), .size = size, .off = off };

	run_job(tree_read_quick(tree_of(req), j.h), &j);
}

static void run_write(struct job *j)
{
	struct tree *t = tree_of(j->req);
	int rc = tree_write_begin(t, j->h, (uint64_t)j->off, j->data, j->size, j->fi.lock_owner);

	if (rc < 0)
		fuse_reply_err(j->req, -rc);
	else
		fuse_reply_write(j->req, (size_t)rc);
	tree_write_end(t, j->h); /* j->data lives until this callback returns */
}

static void op_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
		     struct fuse_file_info *fi)
{
	struct job j = { .run = run_write, .req = req, .h = handle_of(req, fi), .fi = *fi,
			 .size = size, .off = off, .data = buf };

	run_job(tree_write_quick(tree_of(req), j.h, size), &j);
}

/* Whether the process that sent req is being killed by a signal: its
 * descriptors close on its way out (/proc: PF_EXITING, and the exit code
 * of a signal). */
static bool sender_killed(fuse_req_t req)
{
	char path[64], stat[1024];
	pid_t pid = fuse_req_ctx(req)->pid;

	snprintf(path, sizeof(path), "/proc/%ld/stat", (long)pid);
	int fd = pid > 0 ? open(path, O_RDONLY | O_CLOEXEC) : -1;
	ssize_t n = fd >= 0 ? read(fd, stat, sizeof(stat) - 1) : -1;
	if (fd >= 0)
		close(fd);
	if (n <= 0)
		return false;
	stat[n] = '\0';
	const char *p = strrchr(stat, ')'); /* the name before it may hold anything */
	unsigned long flags = 0;
	long code = 0;
	for (int field = 3; p && field <= 52; field++) {
		p = strchr(p, ' ');
		if (p && field == 9)
			flags = strtoul(p + 1, NULL, 10);
		if (p && field == 52)
			code = strtol(p + 1, NULL, 10);
		p = p ? p + 1 : NULL;
	}
	return (flags & 0x4 /* PF_EXITING */) && (code & 0x7f);
}

static void run_flush(struct job *j)
{
	uint64_t owner = j->fi.lock_owner;

	/* A .cache/ file whose writer is killed is dropped, never committed
	 * with what it had written so far (DESIGN.md §9). */
	if (j->h->ops->held_kind == HANDLE_CACHE_WRITE && sender_killed(j->req))
		owner = TREE_OWNER_KILLED;
	fuse_reply_err(j->req, -tree_flush(tree_of(j->req), j->h, owner));
}

static void op_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct job j = { .run = run_flush, .req = req, .h = handle_of(req, fi), .fi = *fi };

	run_job(tree_flush_quick(tree_of(req), j.h), &j);
}

static void run_fsync(struct job *j)
{
	fuse_reply_err(j->req, -tree_fsync(tree_of(j->req), j->h));
}

/* fsync commits what close would (a publish, a batch, a GPU publish): as
 * slow as a flush, so deferred by the same test. */
static void op_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
	struct job j = { .run = run_fsync, .req = req, .h = handle_of(req, fi) };

	run_job(tree_flush_quick(tree_of(req), j.h), &j);
}

static void run_release(struct job *j)
{
	tree_release(tree_of(j->req), j->h);
	fuse_reply_err(j->req, 0);
}

static void op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct job j = { .run = run_release, .req = req, .h = tree_released(tree_of(req), fi->fh) };

	if (!j.h) { /* a daemon before opened it, and this one never did */
		fuse_reply_err(req, 0);
		return;
	}
	run_job(tree_release_quick(tree_of(req), j.h), &j);
}

static void run_opendir(struct job *j)
{
	struct tree *t = tree_of(j->req);
	struct handle *h;
	int rc = tree_opendir(t, j->n, &h);

	if (rc < 0) {
		fuse_reply_err(j->req, -rc);
		return;
	}
	j->fi.fh = h->fh;
	if (fuse_reply_open(j->req, &j->fi) != 0)
		tree_releasedir(t, h);
}

static void op_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct job j = { .run = run_opendir, .req = req, .n = node_of(req, ino), .fi = *fi };

	run_job(tree_opendir_quick(tree_of(req), j.n), &j);
}

static void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		       struct fuse_file_info *fi)
{
	struct tree *t = tree_of(req);
	struct dir_entry de;
	char *buf = malloc(size);
	size_t used = 0;

	if (!buf) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	struct handle *h = handle_of(req, fi);
	for (size_t i = (size_t)off; tree_readdir(t, h, i, &de) == 0; i++) {
		struct stat st = { .st_ino = de.ino, .st_mode = (mode_t)de.type << 12 };
		size_t n = fuse_add_direntry(req, buf + used, size - used, de.name, &st, (off_t)(i + 1));
		if (n > size - used)
			break;
		used += n;
	}
	fuse_reply_buf(req, buf, used);
	free(buf);
}

static void op_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct handle *h = tree_released(tree_of(req), fi->fh);

	if (h)
		tree_releasedir(tree_of(req), h);
	fuse_reply_err(req, 0);
}

static void op_statfs(fuse_req_t req, fuse_ino_t ino)
{
	struct statvfs sv;

	tree_statfs(tree_of(req), &sv);
	fuse_reply_statfs(req, &sv);
}

static void op_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size)
{
	char *buf = size ? malloc(size) : NULL;
	size_t len;

	if (size && !buf) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	int rc = tree_getxattr(tree_of(req), node_of(req, ino), name, buf, size, &len);
	if (rc < 0)
		fuse_reply_err(req, -rc);
	else if (size == 0)
		fuse_reply_xattr(req, len);
	else
		fuse_reply_buf(req, buf, len);
	free(buf);
}

static void op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
	char *buf = size ? malloc(size) : NULL;
	size_t len;

	if (size && !buf) {
		fuse_reply_err(req, ENOMEM);
		return;
	}
	int rc = tree_listxattr(tree_of(req), node_of(req, ino), buf, size, &len);
	if (rc < 0)
		fuse_reply_err(req, -rc);
	else if (size == 0)
		fuse_reply_xattr(req, len);
	else
		fuse_reply_buf(req, buf, len);
	free(buf);
}

static void op_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value,
			size_t size, int flags)
{
	op_refuse(req); /* attributes describe immutable objects */
}

static void op_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name)
{
	op_refuse(req);
}

static void op_ioctl(fuse_req_t req, fuse_ino_t ino, unsigned int cmd, void *arg,
		     struct fuse_file_info *fi, unsigned flags, const void *in_buf, size_t in_bufsz,
		     size_t out_bufsz)
{
	struct artfs_attach out;

	if (flags & FUSE_IOCTL_COMPAT) {
		fuse_reply_err(req, ENOTTY);
		return;
	}
	int rc = tree_ioctl(tree_of(req), handle_of(req, fi), cmd, in_buf, in_bufsz, &out,
			    out_bufsz < sizeof(out) ? out_bufsz : sizeof(out));
	if (rc < 0)
		fuse_reply_err(req, -rc);
	else
		fuse_reply_ioctl(req, 0, &out, sizeof(out));
}

static void op_poll(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi,
		    struct fuse_pollhandle *ph)
{
	/* Nothing is ever signalled: a waiter wakes when the connection ends. */
	if (ph)
		fuse_pollhandle_destroy(ph);
	fuse_reply_poll(req, tree_poll(tree_of(req), handle_of(req, fi)));
}

static void op_init(void *userdata, struct fuse_conn_info *conn)
{
	/* open(O_TRUNC) of a committed object must not shrink what readers
	 * see: without atomic_o_trunc it arrives as a setattr the core
	 * accepts and ignores. */
	conn->want &= ~FUSE_CAP_ATOMIC_O_TRUNC;
	/* Without readdirplus, `ls` of a large version does not stat every object. */
	conn->want &= ~(FUSE_CAP_READDIRPLUS | FUSE_CAP_READDIRPLUS_AUTO);
}

void fs_forget_entry(void *session, uint64_t parent, const char *name)
{
	fuse_lowlevel_notify_inval_entry(session, parent, name, strlen(name));
}

const struct fuse_lowlevel_ops artfs_ll_ops = {
	.init = op_init,
	.lookup = op_lookup,
	.forget = op_forget,
	.forget_multi = op_forget_multi,
	.getattr = op_getattr,
	.setattr = op_setattr,
	.mknod = op_mknod,
	.mkdir = op_mkdir,
	.unlink = op_unlink,
	.rmdir = op_rmdir,
	.symlink = op_symlink,
	.rename = op_rename,
	.link = op_link,
	.open = op_open,
	.read = op_read,
	.write = op_write,
	.flush = op_flush,
	.release = op_release,
	.fsync = op_fsync,
	.opendir = op_opendir,
	.readdir = op_readdir,
	.releasedir = op_releasedir,
	.statfs = op_statfs,
	.setxattr = op_setxattr,
	.getxattr = op_getxattr,
	.listxattr = op_listxattr,
	.removexattr = op_removexattr,
	.create = op_create,
	.ioctl = op_ioctl,
	.poll = op_poll,
};
