/* SPDX-License-Identifier: Apache-2.0 */
/* .keys/.get (DESIGN.md §3.7): a batch read by key. Write keys (64 hex, or
 * vllm-artifact/<64 hex>, one a line), then read from offset 0: the
 * envelopes of those objects back to back, in the order asked, each exactly
 * as published. Checked before the first byte: every key exists (ENOENT),
 * every checksum holds (EIO). The result counts against materialize_max=
 * (ENOMEM beyond it). Each open is one transaction. */
#ifndef ARTFS_GET_H
#define ARTFS_GET_H

#include "state/base.h"

#define GET_REQUEST_MAX (8u << 20)   /* bytes of request text */

int get_open(struct tree *t, struct handle **h, struct open_reply *r);

#endif
