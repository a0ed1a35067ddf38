/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include "r3/keyfile.h"
#include "r3/object.h"

/* One reader for an object's bytes, whichever view: object.c's, here
 * serving the envelope. */
int keys_open(struct tree *t, struct object *o, struct handle **h, struct open_reply *r)
{
	return object_open_envelope(t, o, h, r);
}
