/* SPDX-License-Identifier: Apache-2.0 */
/* SHA-256 through OpenSSL's EVP interface: one-shot and streaming. */
#ifndef ARTFS_SHA256_H
#define ARTFS_SHA256_H

#include <stddef.h>
#include <stdint.h>

struct sha256 {
	void *ctx; /* EVP_MD_CTX */
};

/* Returns 0 or -ENOMEM. */
int sha256_begin(struct sha256 *s);
void sha256_update(struct sha256 *s, const void *data, size_t len);
/* Writes the digest and frees the context. */
void sha256_end(struct sha256 *s, uint8_t out[32]);
/* Frees an unfinished context (safe on one never begun or already ended). */
void sha256_abandon(struct sha256 *s);

void sha256_once(const void *data, size_t len, uint8_t out[32]);

#endif
