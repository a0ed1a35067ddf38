/* SPDX-License-Identifier: Apache-2.0 */
/* artfs: parses the options, then is either the holder of a mount
 * (fs/holder.c: what `artfs <mountpoint>` runs) or the daemon that a
 * holder started (the environment says so: fs/takeover.h), which opens
 * the store and serves. */
#include "autoconf.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fs/holder/holder.h"
#include "fs/holder/lifeline.h"
#include "fs/holder/takeover.h"
#include "fs/loop.h"
#include "fs/ops.h"
#include "lib/log.h"
#include "ns/tree.h"
#include "r3/scan.h"
#include "restart/keeper.h"
#include "state/config.h"
#include "state/expiry.h"
#include "weights/socket.h"
#include "weights/weights.h"

struct cmdline {
	struct artfs_config *cfg;
	char why[256];      /* the first option refused */
	char *positional[3];
	int npositional;
	int failed;
	bool after_remote;  /* the last option was remote= */
};

static void usage(const char *prog)
{
	printf("usage: %s [source] <mountpoint> [-f] [-d] [-s] [-o opt[,opt...]]\n"
	       "\n"
	       "artfs options (-o):\n", prog);
	config_usage(stdout);
	printf("\n");
	fuse_cmdline_help();
	fuse_lowlevel_help();
}

static int opt_proc(void *data, const char *arg, int key, struct fuse_args *outargs)
{
	struct cmdline *c = data;
	char err[256];

	if (key == FUSE_OPT_KEY_NONOPT) {
		if (c->npositional == 2) {
			fprintf(stderr, "artfs: unexpected argument \"%s\"\n", arg);
			if (!c->failed)
				snprintf(c->why, sizeof(c->why), "unexpected argument \"%.200s\"", arg);
			c->failed = 1;
			return 0;
		}
		c->positional[c->npositional++] = strdup(arg);
		return 0;
	}
	if (key != FUSE_OPT_KEY_OPT)
		return 1;
	const char *eq = strchr(arg, '=');
	if (!eq && c->after_remote && strchr(arg, ':')) {
		/* -o remote=h1:p1,h2:p2: -o splits at commas, so the seeds
		 * after the first arrive as options of their own. */
		size_t n = strlen(c->cfg->remote) + strlen(arg) + 2;
		char *joined = malloc(n);
		if (!joined)
			return -1;
		snprintf(joined, n, "%s,%s", c->cfg->remote, arg);
		free(c->cfg->remote);
		c->cfg->remote = joined;
		return 0;
	}
	c->after_remote = eq && (size_t)(eq - arg) == 6 && strncmp(arg, "remote", 6) == 0;
	if (!eq)
		return 1;
	char name[64];
	size_t n = (size_t)(eq - arg);
	if (n >= sizeof(name))
		return 1;
	memcpy(name, arg, n);
	name[n] = '\0';
	int rc = config_set(c->cfg, name, eq + 1, false, err, sizeof(err));
	if (rc == -ENOENT)
		return 1; /* not ours: a FUSE or mount option */
	if (rc < 0) {
		fprintf(stderr, "artfs: %s\n", err);
		if (!c->failed)
			snprintf(c->why, sizeof(c->why), "%s", err);
		c->failed = 1;
	}
	return 0;
}

/* ---- the daemon a holder runs ------------------------------------------------------------ */

struct daemon {
	struct tree *t;
	struct takeover tk;
	pthread_t control;
	bool control_started;
	/* .artfs/attach: the listening socket (the holder keeps it too) and
	 * the thread that serves it; the thread that binds it first. */
	int attach_fd;
	struct attach_server *attach;
	pthread_t attach_bind;
	struct attach_binder *binder;
	bool binder_left;      /* its bind was never answered: see run_daemon */
};

/* What the binding thread shares with the daemon: its mknod is a request
 * of this mount, which may stay unanswered once the daemon stops serving
 * (it ends only when the FUSE file closes), so the daemon never waits for
 * it: it says it stops, and the thread, when its bind returns, touches
 * nothing of the daemon's any more. The last of the two frees it. */
struct attach_binder {
	pthread_mutex_t mu;
	struct daemon *d;
	bool stopping, done;
	int refs;
	char mountpoint[PATH_MAX];
};

static void binder_put(struct attach_binder *b)
{
	bool last = --b->refs == 0;

	pthread_mutex_unlock(&b->mu);
	if (last) {
		pthread_mutex_destroy(&b->mu);
		free(b);
	}
}

#define ATTACH_TAG "attach.sock"

static void attach_serve(struct daemon *d, int fd)
{
	d->attach_fd = fd;
	d->attach = attach_server_start(fd, weights_slabs_of_token, d->t);
	if (!d->attach)
		log_err("attach socket: cannot start its thread; engines cannot attach weights");
}

/* The attach socket the holder keeps, if a daemon before bound it. */
static void attach_take(struct daemon *d)
{
	int fd;

	d->attach_fd = -1;
	if (keeper_link_fetch(&d->t->keeper, ATTACH_TAG, &fd) < 0)
		return;
	atomic_store(&d->t->attach_bound, true);
	attach_serve(d, fd);
}

/* The mount's first daemon binds .artfs/attach in the mount (its mknod is
 * a request this daemon answers: a thread of its own, once serving) and
 * hands it to the holder, which keeps it for every next daemon. It binds
 * through a detached clone of the mount (open_tree): a bound socket holds
 * the mount it was bound through, and the mount users see must stay free
 * to unmount (the holder then lets the socket go, and the clone with it). */
static void *attach_bind_main(void *arg)
{
	struct attach_binder *b = arg;
	char path[PATH_MAX + 64], err[PATH_MAX + 160];
	int tree = open_tree(AT_FDCWD, b->mountpoint, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);

	if (tree >= 0)
		snprintf(path, sizeof(path), "/proc/self/fd/%d/" ARTFS_INFO_DIR "/" ARTFS_ATTACH_SOCKET, tree);
	else {
		log_warn("attach socket: no clone of the mount to bind it through (%s): it holds the "
			 "mount, which only a lazy unmount (umount -l) or stopping artfs ends",
			 strerror(errno));
		snprintf(path, sizeof(path), "%s/" ARTFS_INFO_DIR "/" ARTFS_ATTACH_SOCKET, b->mountpoint);
	}
	int fd = attach_socket_make_apart(path, err, sizeof(err));
	if (tree >= 0)
		close(tree);
	snprintf(path, sizeof(path), "%s/" ARTFS_INFO_DIR "/" ARTFS_ATTACH_SOCKET, b->mountpoint);
	pthread_mutex_lock(&b->mu);
	b->done = true;
	if (b->stopping) {
		if (fd >= 0)
			close(fd);
	} else if (fd < 0) {
		log_err("attach socket: %s; engines cannot attach weights", err);
	} else {
		int rc = keeper_link_keep(&b->d->t->keeper, ATTACH_TAG, fd);
		if (rc < 0)
			log_warn("attach socket: the holder does not keep it (%s): the next daemon "
				 "binds another", strerror(-rc));
		attach_serve(b->d, fd);
		log_info("attach socket: %s", path);
	}
	binder_put(b);
	return NULL;
}

static void attach_bind_start(struct daemon *d, const char *mountpoint)
{
	struct attach_binder *b = calloc(1, sizeof(*b));

	if (!b || strlen(mountpoint) >= sizeof(b->mountpoint)) {
		free(b);
		log_err("attach socket: cannot bind it (%s); engines cannot attach weights",
			b ? "mount point too long" : "out of memory");
		return;
	}
	pthread_mutex_init(&b->mu, NULL);
	b->d = d;
	b->refs = 2;
	strcpy(b->mountpoint, mountpoint);
	if (pthread_create(&d->attach_bind, NULL, attach_bind_main, b) != 0) {
		log_err("attach socket: cannot start the thread that binds it; engines cannot "
			"attach weights");
		pthread_mutex_destroy(&b->mu);
		free(b);
		return;
	}
	d->binder = b;
}

static void attach_stop(struct daemon *d)
{
	struct attach_binder *b = d->binder;

	if (b) {
		pthread_mutex_lock(&b->mu);
		b->stopping = true;
		if (b->done) {
			pthread_join(d->attach_bind, NULL); /* it has nothing left to do */
		} else {
			pthread_detach(d->attach_bind);
			d->binder_left = true;
		}
		binder_put(b);
		d->binder = NULL;
	}
	attach_server_stop(d->attach);
	d->attach = NULL;
	if (d->attach_fd >= 0)
		close(d->attach_fd); /* the holder's stays */
	d->attach_fd = -1;
}

/* The holder's DRAIN: no request is read any more; the loop returns once
 * those read are answered. */
static void *control_main(void *arg)
{
	struct daemon *d = arg;
	struct keeper_msg m;

	while (keeper_recv(d->tk.ctl, &m, NULL, -1) == 0)
		if (m.type == KEEPER_DRAIN) {
			log_info("draining for an upgrade");
			/* Collections end while requests are still served: one
			 * may wait for a request its notice to the kernel needs. */
			expiry_stop(d->t, -1);
			fs_loop_drain();
		}
	return NULL;
}

static int ask_upgrade(void *ctx)
{
	struct daemon *d = ctx;
	struct keeper_msg m = keeper_msg_make(KEEPER_UPGRADE, NULL, 0);

	return keeper_send(d->tk.ctl, &m, -1);
}

/* What runs beside the requests: sizing, expiry, the preloads. */
static void start_work(struct tree *t)
{
	scan_size_start(t);
	if (expiry_start(t) < 0)
		log_err("cannot start the collection thread; ttl= is not enforced");
	weights_preload(t);
}

/* Takes the session over and says so to the holder; for an upgrade waits
 * until the daemon before drained. 0, or -1: this daemon does not serve. */
static int take_over(struct daemon *d, struct fuse_session *se)
{
	struct tree *t = d->t;
	int rc = takeover_session(se, &d->tk, &t->held);

	if (rc < 0) {
		takeover_ready(&d->tk, rc, "cannot take the FUSE session over (see the log)");
		return -1;
	}
	t->forget_entry = fs_forget_entry;
	t->forget_ctx = se;
	t->upgrade = ask_upgrade;
	t->upgrade_ctx = d;
	if (d->tk.start != TAKEOVER_UPGRADE) {
		tree_take_over(t);
		attach_take(d);
		takeover_recover(&d->tk, &t->held, d->tk.start == TAKEOVER_CRASH);
		start_work(t);
	}
	int go = takeover_ready(&d->tk, 0, NULL);
	if (go < 0)
		return -1;
	if (d->tk.start == TAKEOVER_UPGRADE) { /* the daemon before is done with the store */
		if (tree_take_over(t) < 0)
			exit(1); /* the holder starts another, as after a crash */
		attach_take(d);
		takeover_recover(&d->tk, &t->held, go == 1);
		start_work(t);
	}
	d->control_started = pthread_create(&d->control, NULL, control_main, d) == 0;
	return 0;
}

/* Serves until the mount ends, a stop signal, or a drain (then what the
 * kernel holds is left for the next daemon). Never unmounts: the holder
 * does. */
static int serve(struct daemon *d, struct fuse_args *args, struct fuse_cmdline_opts *opts)
{
	struct tree *t = d->t;
	int rc = 1;
	struct fuse_session *se = fuse_session_new(args, &artfs_ll_ops, sizeof(artfs_ll_ops), t);

	if (!se) {
		takeover_ready(&d->tk, -EINVAL, "cannot make a FUSE session (see the log)");
		return 1;
	}
	if (fuse_set_signal_handlers(se) != 0)
		goto out_destroy;
	signal(SIGHUP, SIG_IGN); /* the holder's: an upgrade */
	if (take_over(d, se) < 0)
		goto out_signals;
	log_info("serving %s (daemon %ld, %s; store %s, %llu objects, capacity %llu bytes)",
		 opts->mountpoint, (long)getpid(),
		 d->tk.start == TAKEOVER_FIRST ? "first" : d->tk.start == TAKEOVER_CRASH
			 ? "after a crash" : "upgrade", t->cfg->store, (unsigned long long)t->objects,
		 (unsigned long long)t->cfg->capacity);
	unsigned threads = opts->singlethread ? 1
			 : opts->max_threads != UINT_MAX ? opts->max_threads : 64;
	if (!atomic_load(&t->attach_bound))
		attach_bind_start(d, opts->mountpoint);
	rc = fs_loop(se, threads, &t->held);
	attach_stop(d);
	/* The loop reports the signal that ended it; those are a clean exit. */
	if (rc == SIGTERM || rc == SIGINT || rc == SIGHUP || fs_loop_drained())
		rc = 0;
	t->forget_entry = NULL;
	if (!expiry_stop(t, 2000)) {
		log_warn("a collection waits for the kernel; the daemon ends without it");
		exit(rc ? 1 : 0);
	}
	if (fs_loop_drained())
		tree_hand_over(t);
out_signals:
	fuse_remove_signal_handlers(se);
out_destroy:
	fuse_session_destroy(se);
	return rc ? 1 : 0;
}

static int run_daemon(struct artfs_config *cfg, struct fuse_args *args,
		      struct fuse_cmdline_opts *opts)
{
	struct daemon d = { 0 };
	struct tree t;
	char err[512];

	if (!takeover_from_env(&d.tk))
		return 1;
	log_init(!opts->foreground, opts->debug);
	if (d.tk.life >= 0)
		lifeline_keep(d.tk.life);
	d.attach_fd = -1;
	struct tree_start start = { .held_fd = d.tk.held_fd, .lock_fd = d.tk.lock_fd,
				    .keeper_fd = d.tk.fds,
				    .takeover = d.tk.start != TAKEOVER_FIRST,
				    .defer_scan = d.tk.start == TAKEOVER_UPGRADE };
	if (tree_open_start(&t, cfg, &start, err, sizeof(err)) < 0) {
		log_err("%s", err);
		takeover_ready(&d.tk, -EIO, err);
		return 1;
	}
	atomic_fetch_add(&t.held.hdr->generation, 1);
	d.t = &t;
	int rc = serve(&d, args, opts);
	bool drained = fs_loop_drained();
	tree_close(&t);
	if (drained) {
		struct keeper_msg m = keeper_msg_make(KEEPER_DRAINED, NULL, 0);
		keeper_send(d.tk.ctl, &m, -1);
		log_info("drained: the next daemon serves");
	}
	if (d.control_started) {
		shutdown(d.tk.ctl, SHUT_RDWR);
		pthread_join(d.control, NULL);
	}
	if (d.binder_left) {
		/* A thread still waits in the kernel for the answer to its bind,
		 * which no daemon will give (the mount is over): it cannot even be
		 * stopped (a sanitizer's exit handler waits for that forever), so
		 * the process ends without its exit handlers; ending kills it. */
		log_info("the attach socket's bind was left unanswered; ending");
		fflush(NULL);
		_exit(rc);
	}
	return rc;
}

/* Whether this process's standard error goes nowhere (a holder in the
 * background gives its daemons /dev/null): then the log is syslog. */
static bool stderr_is_null(void)
{
	struct stat err, null;

	return fstat(2, &err) < 0 ||
	       (stat("/dev/null", &null) == 0 && S_ISCHR(err.st_mode) && err.st_rdev == null.st_rdev);
}

/* A daemon that a holder started cannot take what it was given (its
 * config file changed since the mount, or the binary now on disk takes
 * its options otherwise): it says why in the log, where someone reads it
 * (syslog in the background), and in its READY message, which the holder
 * logs. Returns the exit status. */
static int daemon_refuse(bool debug, const char *why)
{
	struct takeover tk;

	log_init(stderr_is_null(), debug);
	log_err("cannot serve: %s", why);
	if (takeover_from_env(&tk))
		takeover_ready(&tk, -EINVAL, why);
	return 1;
}

int main(int argc, char *argv[])
{
	struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
	struct fuse_cmdline_opts opts;
	struct artfs_config cfg;
	struct cmdline c = { .cfg = &cfg };
	char err[512];
	int rc = 1;

	/* Keep freed buffers in the heap: objects and materialized requests come
	 * and go by the megabyte, and handing them back to the kernel costs a
	 * page fault per page on the next request. */
	mallopt(M_MMAP_THRESHOLD, 256 << 20);
	mallopt(M_TRIM_THRESHOLD, 1 << 30);
	/* One descriptor per open object and per version: use all we may. */
	struct rlimit nofile;
	if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
		nofile.rlim_cur = nofile.rlim_max;
		setrlimit(RLIMIT_NOFILE, &nofile);
	}
	config_init(&cfg);
	if (fuse_opt_parse(&args, &c, NULL, opt_proc) != 0 || c.failed) {
		if (holder_started_us())
			rc = daemon_refuse(false, c.why[0] ? c.why : "cannot parse its command line");
		goto out;
	}
	/* mount.fuse3 calls us as `artfs <source> <mountpoint> -o ...`. */
	if (c.npositional > 0)
		fuse_opt_add_arg(&args, c.positional[c.npositional - 1]);
	if (fuse_parse_cmdline(&args, &opts) != 0) {
		if (holder_started_us())
			rc = daemon_refuse(false, "cannot parse its command line (FUSE options)");
		goto out;
	}
	if (opts.show_help) {
		usage(argv[0]);
		rc = 0;
		goto out_opts;
	}
	if (opts.show_version) {
		printf("artfs %s\n", PACKAGE_VERSION);
		fuse_lowlevel_version();
		rc = 0;
		goto out_opts;
	}
	if (!opts.mountpoint) {
		fprintf(stderr, "artfs: no mountpoint (usage: %s [source] <mountpoint> [-o opts])\n",
			argv[0]);
		goto out_opts;
	}
	if (cfg.config_file && config_load_file(&cfg, cfg.config_file, err, sizeof(err)) < 0) {
		if (holder_started_us())
			rc = daemon_refuse(opts.debug, err);
		else
			fprintf(stderr, "artfs: %s\n", err);
		goto out_opts;
	}
	config_finish(&cfg);
	cfg.mountpoint = strdup(opts.mountpoint);
	fuse_opt_add_arg(&args, "-odefault_permissions,fsname=artfs,subtype=artfs");

	log_init(0, opts.debug);
	if (holder_started_us()) {
		rc = run_daemon(&cfg, &args, &opts);
	} else {
		struct holder_options ho = {
			.argv = argv, .mountpoint = opts.mountpoint, .store = cfg.store,
			.foreground = opts.foreground, .debug = opts.debug, .no_resend = !cfg.resend,
		};
		rc = holder_run(&args, &ho);
	}
out_opts:
	free(opts.mountpoint);
out:
	for (int i = 0; i < c.npositional; i++)
		free(c.positional[i]);
	fuse_opt_free_args(&args);
	config_free(&cfg);
	return rc;
}
