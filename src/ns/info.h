/* SPDX-License-Identifier: Apache-2.0 */
/* The daemon information files under .artfs/ (DESIGN.md §2): metrics
 * (Prometheus text) and config (`key = value`), of which each open takes a
 * snapshot that its reads serve, and the write-only control file. */
#ifndef ARTFS_INFO_H
#define ARTFS_INFO_H

#include "state/base.h"

const char *info_file_name(enum info_file f);
int info_open(struct tree *t, enum info_file f, struct handle **h, struct open_reply *r);
#endif
