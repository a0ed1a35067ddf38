/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <errno.h>
#include <string.h>
#include <sys/random.h>

#include "state/grant.h"

void grants_init(struct grants *g)
{
	memset(g->v, 0, sizeof(g->v));
	pthread_mutex_init(&g->mu, NULL);
}

void grants_destroy(struct grants *g)
{
	memset(g->v, 0, sizeof(g->v));
	pthread_mutex_destroy(&g->mu);
}

static bool token_equal(const uint8_t *a, const uint8_t *b)
{
	uint8_t diff = 0;

	for (size_t i = 0; i < ARTFS_ATTACH_TOKEN_SIZE; i++)
		diff |= a[i] ^ b[i];
	return diff == 0;
}

int grants_issue(struct grants *g, void *owner, int64_t now_ns,
		 uint8_t token[ARTFS_ATTACH_TOKEN_SIZE])
{
	size_t got = 0;

	while (got < ARTFS_ATTACH_TOKEN_SIZE) {
		ssize_t n = getrandom(token + got, ARTFS_ATTACH_TOKEN_SIZE - got, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -EIO;
		got += (size_t)n;
	}
	pthread_mutex_lock(&g->mu);
	struct grant *free_slot = NULL, *oldest = NULL;
	unsigned own = 0;
	for (size_t i = 0; i < GRANTS_MAX; i++) {
		struct grant *s = &g->v[i];
		if (!s->expires_ns || s->expires_ns <= now_ns) {
			if (!free_slot)
				free_slot = s;
			continue;
		}
		if (s->owner != owner)
			continue;
		own++;
		if (!oldest || s->expires_ns < oldest->expires_ns)
			oldest = s;
	}
	struct grant *s = own >= GRANTS_PER_OWNER ? oldest : free_slot;
	if (s) {
		memcpy(s->token, token, ARTFS_ATTACH_TOKEN_SIZE);
		s->owner = owner;
		s->expires_ns = now_ns + GRANT_TTL_NS;
	}
	pthread_mutex_unlock(&g->mu);
	return s ? 0 : -EBUSY;
}

int grants_take(struct grants *g, const uint8_t token[ARTFS_ATTACH_TOKEN_SIZE], int64_t now_ns,
		int (*use)(void *owner, void *ctx), void *ctx)
{
	int rc = -ENOENT;

	pthread_mutex_lock(&g->mu);
	for (size_t i = 0; i < GRANTS_MAX; i++) {
		struct grant *s = &g->v[i];
		/* Every slot is compared: the time taken says nothing of where
		 * (or whether) the token is. */
		bool match = s->expires_ns != 0 && token_equal(s->token, token);
		if (!match)
			continue;
		bool live = s->expires_ns > now_ns;
		void *owner = s->owner;
		memset(s, 0, sizeof(*s));
		if (live && rc == -ENOENT)
			rc = use(owner, ctx);
	}
	pthread_mutex_unlock(&g->mu);
	return rc;
}

void grants_drop_owner(struct grants *g, const void *owner)
{
	pthread_mutex_lock(&g->mu);
	for (size_t i = 0; i < GRANTS_MAX; i++)
		if (g->v[i].expires_ns && g->v[i].owner == owner)
			memset(&g->v[i], 0, sizeof(g->v[i]));
	pthread_mutex_unlock(&g->mu);
}

unsigned grants_live(struct grants *g, int64_t now_ns)
{
	unsigned n = 0;

	pthread_mutex_lock(&g->mu);
	for (size_t i = 0; i < GRANTS_MAX; i++)
		n += g->v[i].expires_ns > now_ns;
	pthread_mutex_unlock(&g->mu);
	return n;
}
