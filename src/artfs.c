/* artfs: the daemon. Parses options, opens the store, mounts, serves. */
#include "autoconf.h"

#include <errno.h>
#include <limits.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "config.h"
#include "expiry.h"
#include "fs/loop.h"
#include "fs/ops.h"
#include "log.h"
#include "scan.h"
#include "tree.h"
#include "weights.h"

struct cmdline {
	struct artfs_config *cfg;
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
		c->failed = 1;
	}
	return 0;
}

static int serve(struct tree *t, struct fuse_args *args, struct fuse_cmdline_opts *opts)
{
	int rc = 1;
	struct fuse_session *se = fuse_session_new(args, &artfs_ll_ops, sizeof(artfs_ll_ops), t);

	if (!se)
		return 1;
	if (fuse_set_signal_handlers(se) != 0)
		goto out_destroy;
	if (fuse_session_mount(se, opts->mountpoint) != 0)
		goto out_signals;
	if (fuse_daemonize(opts->foreground) != 0)
		goto out_unmount;
	log_init(!opts->foreground, opts->debug);
	store_note_pid(&t->store);
	t->forget_entry = fs_forget_entry;
	t->forget_ctx = se;
	scan_size_start(t);
	if (expiry_start(t) < 0)
		log_err("cannot start the collection thread; ttl= is not enforced");
	weights_preload(t);
	log_info("mounted %s (store %s, %llu objects, capacity %llu bytes)", opts->mountpoint,
		 t->cfg->store, (unsigned long long)t->objects, (unsigned long long)t->cfg->capacity);
	if (opts->singlethread)
		rc = fuse_session_loop(se);
	else
		rc = fs_loop(se, opts->max_threads != UINT_MAX ? opts->max_threads : 64);
	/* The loop reports the signal that ended it; those are a clean exit. */
	if (rc == SIGTERM || rc == SIGINT || rc == SIGHUP)
		rc = 0;
	log_info("unmounting %s", opts->mountpoint);
	/* Unmount first: a kernel notification the janitor may be waiting in
	 * ends with the connection. */
	t->forget_entry = NULL;
	fuse_session_unmount(se);
	expiry_stop(t);
	goto out_signals;
out_unmount:
	fuse_session_unmount(se);
out_signals:
	fuse_remove_signal_handlers(se);
out_destroy:
	fuse_session_destroy(se);
	return rc ? 1 : 0;
}

int main(int argc, char *argv[])
{
	struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
	struct fuse_cmdline_opts opts;
	struct artfs_config cfg;
	struct cmdline c = { .cfg = &cfg };
	struct tree t;
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
	if (fuse_opt_parse(&args, &c, NULL, opt_proc) != 0 || c.failed)
		goto out;
	/* mount.fuse3 calls us as `artfs <source> <mountpoint> -o ...`. */
	if (c.npositional > 0)
		fuse_opt_add_arg(&args, c.positional[c.npositional - 1]);
	if (fuse_parse_cmdline(&args, &opts) != 0)
		goto out;
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
		fprintf(stderr, "artfs: %s\n", err);
		goto out_opts;
	}
	config_finish(&cfg);
	cfg.mountpoint = strdup(opts.mountpoint);
	fuse_opt_add_arg(&args, "-odefault_permissions,fsname=artfs,subtype=artfs");

	log_init(0, opts.debug);
	if (tree_open(&t, &cfg, err, sizeof(err)) < 0) {
		fprintf(stderr, "artfs: %s\n", err);
		goto out_opts;
	}
	rc = serve(&t, &args, &opts);
	tree_close(&t);
out_opts:
	free(opts.mountpoint);
out:
	for (int i = 0; i < c.npositional; i++)
		free(c.positional[i]);
	fuse_opt_free_args(&args);
	config_free(&cfg);
	return rc;
}
