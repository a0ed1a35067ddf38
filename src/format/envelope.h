/* SPDX-License-Identifier: Apache-2.0 */
/* The R3 artifact envelope, schema 3 (DESIGN.md §3.1): parse and encode.
 *
 *   u32 little-endian H (1..4096) | H bytes of JSON | payload
 *
 * The parser is pure (no I/O) and bounded: it never reads past the lengths
 * it is given, so it can be fuzzed on its own. */
#ifndef ARTFS_ENVELOPE_H
#define ARTFS_ENVELOPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "format/array.h"

/* Why an envelope was refused; each has a metric label. */
enum envelope_error {
	ENVELOPE_OK = 0,
	ENVELOPE_HEADER_LENGTH,   /* H outside 1..4096 */
	ENVELOPE_JSON,            /* not UTF-8 JSON, not an object, duplicate keys */
	ENVELOPE_FIELDS,          /* a required field missing, or an unknown one */
	ENVELOPE_SCHEMA,          /* schema_version is not 3 */
	ENVELOPE_KEY,             /* key malformed, or not the key of this path */
	ENVELOPE_KIND,            /* kind is not "block" or "tail" */
	ENVELOPE_FIELD,           /* field is not "routed_experts" */
	ENVELOPE_DTYPE,           /* dtype unsupported */
	ENVELOPE_SHAPE,           /* shape not 1..8 positive integers */
	ENVELOPE_TOKEN_START,     /* source_token_start not an integer >= 0 */
	ENVELOPE_CHECKSUM_FORMAT, /* payload_sha256 not 64 lowercase hex digits */
	ENVELOPE_TRUNCATED,       /* fewer bytes than header + payload */
	ENVELOPE_TRAILING,        /* more bytes than header + payload */
	ENVELOPE_CHECKSUM,        /* payload does not hash to payload_sha256 */
	ENVELOPE_OUT_OF_ORDER,    /* a write that was not sequential */
	ENVELOPE_ERROR_COUNT
};

enum envelope_kind { ENVELOPE_BLOCK = 1, ENVELOPE_TAIL = 2 };

struct envelope {
	uint32_t header_len;          /* H */
	uint8_t kind;                 /* enum envelope_kind */
	struct array_desc array;
	uint64_t source_token_start;
	uint8_t payload_sha256[32];
	char key[ARTFS_KEY_LEN + 1];
	uint64_t payload_len;         /* UINT64_MAX when prod(shape) overflows */
};

#define ENVELOPE_PREFIX_LEN 4
/* Bytes needed to hold the length prefix and the largest header. */
#define ENVELOPE_HEADER_BYTES_MAX (ENVELOPE_PREFIX_LEN + ARTFS_ENVELOPE_HEADER_MAX)

/* The same content: key, kind, dtype, shape, source_token_start and
 * payload_sha256 (the JSON's layout may differ). */
bool envelope_same(const struct envelope *a, const struct envelope *b);

/* Label for metrics and logs ("json", "checksum", ...). */
const char *envelope_error_name(enum envelope_error err);

/* Reads H from the first 4 bytes (into *header_len even when out of range)
 * and checks its range. */
enum envelope_error envelope_header_len(const uint8_t prefix[4], uint32_t *header_len);

/* Parses the JSON header (exactly len bytes). detail receives a short
 * human reason for the log. */
enum envelope_error envelope_parse_header(const uint8_t *json, size_t len, struct envelope *env,
					  char *detail, size_t detail_len);

/* The layout of a header parsed before, to recognize the headers that
 * differ from it only in the 64 hex digits of their key and of their
 * payload_sha256, and in the digits of source_token_start when it comes
 * after both (one encoder writes every header of a batch, and the blocks
 * of a request differ in where they start). Such a header says what the
 * learnt one says but for those values, so it needs no JSON parse.
 * Zeroed: nothing learnt. */
struct envelope_layout {
	uint8_t json[ARTFS_ENVELOPE_HEADER_MAX];
	size_t len;                   /* 0: nothing learnt */
	size_t key_at, sha_at;        /* where the two runs of hex digits begin */
	size_t start_at, start_len;   /* source_token_start's digits; start_len 0:
				       * not after both runs, never different */
	struct envelope env;
};

/* Where the 64 hex digits of payload_sha256 start in a header that parsed,
 * when it is written plainly (`"payload_sha256":"` then the digits, no
 * escape); 0 otherwise. */
size_t envelope_sha_hex_at(const uint8_t *json, size_t len);

/* envelope_parse_header, answered from l when the header matches its
 * layout; else parsed, and a header that parses and is written plainly
 * (no spaces or escapes around those two values) becomes l's layout. */
enum envelope_error envelope_parse_header_like(struct envelope_layout *l, const uint8_t *json,
					       size_t len, struct envelope *env, char *detail,
					       size_t detail_len);

/* Parses prefix and header of a whole buffer: the first step of reading a
 * stored object or a test vector. */
enum envelope_error envelope_parse(const uint8_t *buf, size_t len, struct envelope *env,
				   char *detail, size_t detail_len);

/* 4 + H + payload, or UINT64_MAX on overflow. */
uint64_t envelope_total_len(const struct envelope *env);

/* Encodes env (header_len and payload_len are ignored and recomputed) with
 * canonical JSON (sorted keys, no spaces), as vLLM's encoder does.
 * *out is malloc'd. Returns 0 or a negative errno. */
int envelope_encode(const struct envelope *env, const void *payload, uint64_t payload_len,
		    uint8_t **out, size_t *out_len);

const char *envelope_kind_name(uint8_t kind);

#endif
