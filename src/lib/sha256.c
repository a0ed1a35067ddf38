/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

#include <openssl/evp.h>

#include "lib/sha256.h"

/* The implementation, fetched once: EVP_sha256() asks the provider for it
 * again at every digest (a few percent of the daemon's CPU in .put). */
static pthread_once_t md_once = PTHREAD_ONCE_INIT;
static EVP_MD *md_fetched;

static void fetch_md(void)
{
	md_fetched = EVP_MD_fetch(NULL, "SHA256", NULL);
}

static const EVP_MD *md(void)
{
	pthread_once(&md_once, fetch_md);
	return md_fetched ? md_fetched : EVP_sha256();
}

int sha256_begin(struct sha256 *s)
{
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();

	if (!ctx || !EVP_DigestInit_ex(ctx, md(), NULL)) {
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
	if (!EVP_Digest(data, len, out, NULL, md(), NULL))
		abort();
}
