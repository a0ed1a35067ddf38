/* .artfs/control: the write-only command file artfsctl uses. Each line is
 * one command, run when its newline arrives; the write returns its errno:
 *     load <wv> <checkpoint-dir> [gpus=0,1,...]
 *     unload <wv>
 */
#ifndef ARTFS_CONTROL_H
#define ARTFS_CONTROL_H

#include "base.h"

#define CONTROL_LINE_MAX 4096

int control_open(struct tree *t, struct handle **h, struct open_reply *r);
#endif
