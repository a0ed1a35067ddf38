#include "autoconf.h"

#include <errno.h>
#include <stdlib.h>

#include <openssl/evp.h>

#include "sha256.h"

int sha256_begin(struct sha256 *s)
{
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();

	if (!ctx || !EVP_DigestInit_ex(ctx, EVP_sha256(), NULL)) {
		EVP_MD_CTX_free(ctx);
		s->ctx = NULL;
		return -ENOMEM;
	}
	s->ctx = ctx;
	return 0;
}

void sha256_update(struct sha256 *s, const void *data, size_t len)
{
	if (!EVP_DigestUpdate(s->ctx, data, len))
		abort(); /* cannot fail for an initialised SHA-256 context */
}

void sha256_end(struct sha256 *s, uint8_t out[32])
{
	if (!EVP_DigestFinal_ex(s->ctx, out, NULL))
		abort();
	sha256_abandon(s);
}

void sha256_abandon(struct sha256 *s)
{
	EVP_MD_CTX_free(s->ctx);
	s->ctx = NULL;
}

void sha256_once(const void *data, size_t len, uint8_t out[32])
{
	if (!EVP_Digest(data, len, out, NULL, EVP_sha256(), NULL))
		abort();
}
