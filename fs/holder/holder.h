/* SPDX-License-Identifier: Apache-2.0 */
/* The holder (DESIGN.md §8): what `artfs <mountpoint>` runs. It makes the
 * mount and holds it: the /dev/fuse file, the kernel's INIT request, the
 * memory the daemons share (src/restart/held.h) and the descriptors they give it
 * to keep (src/restart/keeper.h). It starts the serving daemon (this binary, as
 * found on disk, with the same arguments) and starts another when that
 * one dies (crash) or is to be replaced (upgrade: SIGHUP, or a daemon's
 * request). It has no CUDA context and reads no client request; its own
 * death ends the mount (every daemon dies with it). */
#ifndef ARTFS_FS_HOLDER_H
#define ARTFS_FS_HOLDER_H

#include <stdbool.h>

#include "fs/ops.h"

struct holder_options {
	char **argv;             /* the daemon's arguments (argv[0] is replaced) */
	const char *mountpoint;
	const char *store;       /* locked for as long as the mount lives */
	bool foreground;
	bool debug;
	bool no_resend;          /* resend=0: lost requests are answered EIO */
};

/* Mounts (args: the FUSE mount options), serves through daemons until the
 * mount ends or a stop signal, unmounts. The exit status of `artfs`. */
int holder_run(struct fuse_args *args, const struct holder_options *o);

/* Whether this process is a daemon that a holder started (and then how). */
bool holder_started_us(void);

#endif
