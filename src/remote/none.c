/* SPDX-License-Identifier: Apache-2.0 */
/* The Redis Cluster client of a build without hiredis: remote_open says so
 * and fails, so that callers never need #ifdef HAVE_HIREDIS. */
#include "autoconf.h"

#include <errno.h>

#include "lib/log.h"
#include "remote/remote.h"

int remote_open(const struct remote_config *cfg, struct remote **out)
{
	log_err("remote=%s: this artfs was built without hiredis, so without the Redis Cluster "
		"tier; install libhiredis-dev and build again", cfg->seeds ? cfg->seeds : "");
	*out = NULL;
	return -ENOTSUP;
}

void remote_close(struct remote *r)
{
}

int remote_put(struct remote *r, const char key_hex[REMOTE_KEY_HEX], const void *val, size_t len)
{
	return -ENOTSUP;
}

int remote_get(struct remote *r, const char key_hex[REMOTE_KEY_HEX], uint8_t **val, size_t *len)
{
	return -ENOTSUP;
}

int remote_put_many(struct remote *r, size_t n, const char *const *keys_hex,
		    const void *const *vals, const size_t *lens, int *results)
{
	for (size_t i = 0; i < n; i++)
		results[i] = -ENOTSUP;
	return n ? -ENOTSUP : 0;
}

int remote_get_many(struct remote *r, size_t n, const char *const *keys_hex, uint8_t **vals,
		    size_t *lens, int *results)
{
	for (size_t i = 0; i < n; i++) {
		vals[i] = NULL;
		lens[i] = 0;
		results[i] = -ENOTSUP;
	}
	return n ? -ENOTSUP : 0;
}

void remote_stats(struct remote *r, struct remote_stats *out)
{
	*out = (struct remote_stats){ 0 };
}

void remote_metrics_render(struct remote *r, FILE *f)
{
}

int remote_put_named(struct remote *r, const char *name, const void *val, size_t len)
{
	return -ENOTSUP;
}

int remote_get_named(struct remote *r, const char *name, uint8_t **val, size_t *len)
{
	return -ENOTSUP;
}

int remote_get_named_many(struct remote *r, size_t n, const char *const *names, uint8_t **vals,
			  size_t *lens, int *results)
{
	(void)r;
	(void)names;
	for (size_t i = 0; i < n; i++) {
		vals[i] = NULL;
		lens[i] = 0;
		results[i] = -ENOTSUP;
	}
	return n ? -ENOTSUP : 0;
}

int remote_sadd_named(struct remote *r, size_t n, const char *const *names,
		      const char *const *members, int *results)
{
	for (size_t i = 0; i < n; i++)
		results[i] = -ENOTSUP;
	return n ? -ENOTSUP : 0;
}

int remote_srem_named(struct remote *r, size_t n, const char *const *names,
		       const char *const *members, int *results)
{
	for (size_t i = 0; i < n; i++)
		results[i] = -ENOTSUP;
	return n ? -ENOTSUP : 0;
}

int remote_srem_del_named(struct remote *r, const char *set, const char *member, const char *key)
{
	(void)r;
	(void)set;
	(void)member;
	(void)key;
	return -ENOTSUP;
}

int remote_members_named(struct remote *r, const char *name, size_t max, size_t max_len,
			 char ***members, size_t *count)
{
	*members = NULL;
	*count = 0;
	return -ENOTSUP;
}

void remote_members_free(char **members, size_t count)
{
}
