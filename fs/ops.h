/* SPDX-License-Identifier: Apache-2.0 */
/* The FUSE low-level operation table of artfs; userdata is a struct tree. */
#ifndef ARTFS_FS_OPS_H
#define ARTFS_FS_OPS_H

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

extern const struct fuse_lowlevel_ops artfs_ll_ops;

/* struct tree's forget_entry for a session: the kernel drops parent/name. */
void fs_forget_entry(void *session, uint64_t parent, const char *name);

#endif
