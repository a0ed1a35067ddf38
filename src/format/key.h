/* SPDX-License-Identifier: Apache-2.0 */
/* Names and keys: the one place that validates namespace names and
 * derives an object's key from its path (DESIGN.md §2, §3.1). */
#ifndef ARTFS_KEY_H
#define ARTFS_KEY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "artfs/artfs.h"

/* [A-Za-z0-9][A-Za-z0-9._-]{0,127} */
bool key_version_name_valid(const char *name);

/* Block hash file name (2..128 lowercase hex digits, even length) to bytes.
 * out must hold ARTFS_HASH_BYTES_MAX bytes. Returns 0 or -EINVAL. */
int key_hash_decode(const char *name, uint8_t *out, size_t *len);

/* Lowercase hex of len bytes into out (2 * len + 1 bytes). */
void key_hex(const uint8_t *bytes, size_t len, char *out);

/* 64 lowercase hex digits to 32 bytes. Returns 0 or -EINVAL. */
int key_sha256_decode(const char *hex, uint8_t out[32]);

/* Whether the n bytes at p are all lowercase hex digits. */
bool key_is_hex(const void *p, size_t n);

/* "vllm-artifact/" + hex(sha256(be64(len(wv)) ‖ wv ‖ be64(len(h)) ‖ h)) */
void key_derive(const char *wv, const uint8_t *hash, size_t hash_len,
		char out[ARTFS_KEY_LEN + 1]);

#endif
