/* SPDX-License-Identifier: Apache-2.0 */
/* <wv>/.materialize (DESIGN.md §3.4): one request's complete R3 array in one
 * read, validated as vLLM's connector validates it. Each open file is its
 * own transaction: write the request text, read the .npy from offset 0. */
#ifndef ARTFS_MATERIALIZE_H
#define ARTFS_MATERIALIZE_H

#include <stdbool.h>

#include "format/envelope.h"
#include "state/base.h"

#define MATERIALIZE_REQUEST_MAX (8u << 20)  /* bytes of request text */
#define MATERIALIZE_BLOCKS_MAX (1u << 20)   /* hashes in one request */

struct materialize_block {
	uint8_t len;
	uint8_t hash[ARTFS_HASH_BYTES_MAX];
};

struct materialize_request {
	bool has_token_end, has_block_size;
	uint64_t token_end, block_size;
	size_t count;
	struct materialize_block *blocks;
};

/* Parses the request text:
 *     token_end <N>        (optional: the rows of all objects)
 *     block_size <N>       (optional: the rows of the first object)
 *     <hash>               one line per object, in token order
 * Blank lines and surrounding spaces are ignored. Returns 0, or -EINVAL with
 * a reason in err. */
int materialize_parse(const char *text, size_t len, struct materialize_request *req,
		      char *err, size_t errlen);
void materialize_request_free(struct materialize_request *req);

/* The layout rules over the objects' envelopes, in request order:
 * source_token_start contiguous from 0, object i has min(block_size,
 * token_end - start) rows and kind block exactly when full, one dtype and
 * shape[1:], rows adding up to token_end. Returns 0 and the token_end, or
 * -EBADMSG with the reason in err. */
int materialize_check(const struct materialize_request *req, const struct envelope *envs,
		      uint64_t *token_end, char *err, size_t errlen);

int materialize_open(struct tree *t, struct version *v, struct handle **h,
		     struct open_reply *r);
#endif
