/* SPDX-License-Identifier: Apache-2.0 */
/* Start-up re-index (DESIGN.md §3.5): every name in the store is an object
 * whose publish committed, since names only appear by linking a complete,
 * verified file; leftover temporary files are dropped. The daemon serves as
 * soon as the names are indexed; sizes for the capacity accounting follow. */
#ifndef ARTFS_SCAN_H
#define ARTFS_SCAN_H

#include "state/base.h"

/* Indexes every version and (unless objects_later) every object by name
 * (readdir only: start stays fast); their sizes are unknown until
 * scan_size_start's threads have counted them. With objects_later (a
 * daemon that takes over, which serves at once) those threads index each
 * version's objects first; meanwhile lookups find them in the store
 * (version_probe). */
int scan_store(struct tree *t, bool objects_later, char *err, size_t errlen);
/* Sizes the objects found by scan_store in the background. */
int scan_size_start(struct tree *t);
/* Stops and joins the sizing threads (shutdown). */
void scan_size_stop(struct tree *t);

#endif
