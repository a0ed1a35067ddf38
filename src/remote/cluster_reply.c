/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "remote/cluster_reply.h"

static bool reply_is(const redisReply *r, int type)
{
	return r && r->type == type;
}

static bool starts_with(const char *s, const char *prefix)
{
	return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* One entry of CLUSTER SLOTS: 1 a range of a known master in *sh, 0 one
 * whose master's address is unknown, -EPROTO. */
static int slots_entry(const redisReply *e, const struct cluster_addr *asked,
		       struct cluster_shard *sh)
{
	if (!reply_is(e, REDIS_REPLY_ARRAY) || e->elements < 3 ||
	    !reply_is(e->element[0], REDIS_REPLY_INTEGER) ||
	    !reply_is(e->element[1], REDIS_REPLY_INTEGER))
		return -EPROTO;
	long long start = e->element[0]->integer, end = e->element[1]->integer;
	const redisReply *m = e->element[2];
	if (start < 0 || end < start || end >= CLUSTER_SLOTS || !reply_is(m, REDIS_REPLY_ARRAY) ||
	    m->elements < 2 || !reply_is(m->element[0], REDIS_REPLY_STRING) ||
	    !reply_is(m->element[1], REDIS_REPLY_INTEGER))
		return -EPROTO;
	const char *host = m->element[0]->str;
	if (strcmp(host, "?") == 0)
		return 0;
	if (strlen(host) > CLUSTER_HOST_MAX || m->element[1]->integer < 1 ||
	    m->element[1]->integer > 65535)
		return -EPROTO;
	memset(sh, 0, sizeof(*sh));
	snprintf(sh->master.host, sizeof(sh->master.host), "%s", *host ? host : asked->host);
	sh->master.port = (int)m->element[1]->integer;
	sh->start = (unsigned)start;
	sh->end = (unsigned)end;
	if (m->elements >= 3 && reply_is(m->element[2], REDIS_REPLY_STRING)) {
		sh->id = m->element[2]->str;
		sh->id_len = m->element[2]->len;
	}
	sh->replicas = (int)(e->elements - 3);
	return 1;
}

int cluster_slots_parse(const redisReply *reply, const struct cluster_addr *asked,
			struct cluster_shard **out, size_t *count)
{
	if (!reply_is(reply, REDIS_REPLY_ARRAY))
		return -EPROTO;
	struct cluster_shard *s = calloc(reply->elements ? reply->elements : 1, sizeof(*s));
	size_t n = 0;
	if (!s)
		return -ENOMEM;
	for (size_t i = 0; i < reply->elements; i++) {
		int rc = slots_entry(reply->element[i], asked, &s[n]);
		if (rc < 0) {
			free(s);
			return rc;
		}
		n += (size_t)rc;
	}
	*out = s;
	*count = n;
	return 0;
}

/* Whether the flags of a CLUSTER NODES line name a healthy replica. */
static bool healthy_replica(const char *flags, size_t len)
{
	char f[128];

	snprintf(f, sizeof(f), ",%.*s,", (int)(len < 120 ? len : 120), flags);
	return strstr(f, ",slave,") && !strstr(f, ",fail,") && !strstr(f, ",fail?,") &&
	       !strstr(f, ",handshake,") && !strstr(f, ",noaddr,");
}

void cluster_nodes_count_replicas(const redisReply *nodes, struct cluster_shard *s, size_t n)
{
	if (!reply_is(nodes, REDIS_REPLY_STRING) && !reply_is(nodes, REDIS_REPLY_STATUS))
		return;
	for (size_t i = 0; i < n; i++)
		if (s[i].id)
			s[i].replicas = 0;
	const char *line = nodes->str, *end = nodes->str + nodes->len;
	while (line < end) {
		const char *eol = memchr(line, '\n', (size_t)(end - line));
		if (!eol)
			eol = end;
		const char *field[4];
		size_t len[4], k = 0;
		const char *p = line;
		while (k < 4 && p < eol) {
			const char *sp = memchr(p, ' ', (size_t)(eol - p));
			const char *fe = sp ? sp : eol;
			field[k] = p;
			len[k++] = (size_t)(fe - p);
			p = fe + 1;
		}
		for (size_t i = 0; k == 4 && i < n; i++)
			if (s[i].id && s[i].id_len == len[3] && memcmp(s[i].id, field[3], len[3]) == 0 &&
			    healthy_replica(field[2], len[2]))
				s[i].replicas++;
		line = eol + 1;
	}
}

enum cluster_error cluster_error_kind(const char *e)
{
	if (starts_with(e, "MOVED "))
		return CLUSTER_ERROR_MOVED;
	if (starts_with(e, "ASK "))
		return CLUSTER_ERROR_ASK;
	if (starts_with(e, "OOM "))
		return CLUSTER_ERROR_OOM;
	if (starts_with(e, "TRYAGAIN") || starts_with(e, "LOADING") || starts_with(e, "BUSY"))
		return CLUSTER_ERROR_RETRY;
	if (starts_with(e, "CLUSTERDOWN") || starts_with(e, "MASTERDOWN") ||
	    starts_with(e, "READONLY"))
		return CLUSTER_ERROR_FAILOVER;
	return CLUSTER_ERROR_FATAL;
}

int cluster_redirect_parse(const char *e, unsigned *slot, struct cluster_addr *to)
{
	int pos = 0;

	if (sscanf(e, "%*s %u %n", slot, &pos) != 1 || pos == 0 || *slot >= CLUSTER_SLOTS ||
	    cluster_addr_parse(e + pos, strlen(e + pos), to) < 0)
		return -EINVAL;
	return 0;
}
