/* The read-only daemon information files under .artfs/ (DESIGN.md §2):
 * metrics (Prometheus text) and config (`key = value`). Each open takes a
 * snapshot that its reads then serve. */
#ifndef ARTFS_INFO_H
#define ARTFS_INFO_H

#include "tree.h"

const char *info_file_name(enum info_file f);
int info_open(struct tree *t, enum info_file f, struct handle **h, struct tree_open_reply *r);
int info_read(struct handle *h, uint64_t off, size_t size, const void **data, size_t *len);
void info_release(struct handle *h);

#endif
