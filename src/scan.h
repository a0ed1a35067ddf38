/* Start-up re-index (DESIGN.md §3.5): every name in the store is an object
 * whose publish committed, since names only appear by linking a complete,
 * verified file; leftover temporary files are dropped. */
#ifndef ARTFS_SCAN_H
#define ARTFS_SCAN_H

#include "tree.h"

int scan_store(struct tree *t, char *err, size_t errlen);

#endif
