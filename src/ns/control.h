/* SPDX-License-Identifier: Apache-2.0 */
/* .artfs/control: the write-only command file artfsctl uses. Each line is
 * one command, run when its newline arrives; the write returns its errno:
 *     load <wv> <checkpoint-dir> [gpus=0,1,...]
 *     unload <wv>
 */
#ifndef ARTFS_CONTROL_H
#define ARTFS_CONTROL_H

#include "state/base.h"

#define CONTROL_LINE_MAX 4096

enum control_op { CONTROL_NONE = 0, CONTROL_LOAD, CONTROL_UNLOAD, CONTROL_UPGRADE };

/* One parsed command line; the strings point into the parsed line. */
struct control_cmd {
	enum control_op op;   /* CONTROL_NONE: a blank line, nothing to run */
	const char *wv;
	const char *dir;      /* load */
	const char *gpus;     /* load: the list after gpus=, "" when not given */
};

/* Splits line in place on spaces, tabs and CRs and recognizes a command;
 * runs nothing (fuzzed on its own). Returns 0, or -EINVAL with the reason
 * in err. */
int control_parse(char *line, struct control_cmd *cmd, char *err, size_t errlen);


int control_open(struct tree *t, struct handle **h, struct open_reply *r);
#endif
