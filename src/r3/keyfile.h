/* SPDX-License-Identifier: Apache-2.0 */
/* .keys/<64 hex> (DESIGN.md §3.6): an object by its key, whatever name it
 * has; reads return the envelope exactly as published, verified first. */
#ifndef ARTFS_KEYS_H
#define ARTFS_KEYS_H

#include "state/base.h"

/* Opens a committed object's key view for reading. */
int keys_open(struct tree *t, struct object *o, struct handle **h, struct open_reply *r);

#endif
