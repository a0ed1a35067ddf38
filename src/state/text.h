/* SPDX-License-Identifier: Apache-2.0 */
/* A read-only file that serves a text snapshot taken at open: .artfs/metrics,
 * .artfs/config, weights/status, weights/manifest.json. */
#ifndef ARTFS_TEXT_H
#define ARTFS_TEXT_H

#include "state/base.h"

/* A handle serving text (malloc'd, taken over, freed on failure too) from
 * its first byte. */
int text_open(char *text, struct handle **h, struct open_reply *r);

#endif
