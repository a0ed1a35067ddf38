/* Directory listings: a snapshot of the names under a directory taken at
 * opendir, so that readdir offsets stay stable while objects come and go. */
#ifndef ARTFS_LISTING_H
#define ARTFS_LISTING_H

#include "tree.h"

int listing_open(struct tree *t, struct node *dir, struct handle **h);
int listing_entry(struct handle *h, size_t i, struct tree_dirent *de);
void listing_release(struct handle *h);

#endif
