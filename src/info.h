/* The daemon information files under .artfs/ (DESIGN.md §2): metrics
 * (Prometheus text) and config (`key = value`), of which each open takes a
 * snapshot that its reads serve, and the write-only control file. */
#ifndef ARTFS_INFO_H
#define ARTFS_INFO_H

#include "tree.h"

const char *info_file_name(enum info_file f);
int info_open(struct tree *t, enum info_file f, struct handle **h, struct tree_open_reply *r);
/* A handle serving text (malloc'd, taken over) from its first byte. */
int text_handle_open(char *text, struct handle **h, struct tree_open_reply *r);
int info_read(struct handle *h, uint64_t off, size_t size, const void **data, size_t *len);
void info_release(struct handle *h);

#endif
