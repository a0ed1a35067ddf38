/* SPDX-License-Identifier: Apache-2.0 */
/* Directory listings: a snapshot of the names under a directory taken at
 * opendir, so that readdir offsets stay stable while objects come and go. */
#ifndef ARTFS_LISTING_H
#define ARTFS_LISTING_H

#include "state/base.h"

int listing_open(struct tree *t, struct node *dir, struct handle **h);
#endif
