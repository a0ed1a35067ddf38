/* SPDX-License-Identifier: Apache-2.0 */
/* The fixture of the Redis Cluster client tests: the cluster run.sh started
 * (its ports and pid files), random keys, Prometheus samples, and admin
 * commands that ask the nodes what the client cannot (slots, roles, TTLs)
 * or change them (passwords). */
#include "autoconf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "remote/cluster.h"
#include "remote_fixture.h"

int fixture_base_port;          /* 0: no cluster */
const char *fixture_cluster_dir;

double fixture_now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void fixture_random_bytes(void *buf, size_t len)
{
	ck_assert_int_eq(getrandom(buf, len, 0), (ssize_t)len);
}

void fixture_random_key(char out[65])
{
	uint8_t b[32];
	fixture_random_bytes(b, sizeof(b));
	for (int i = 0; i < 32; i++)
		sprintf(out + 2 * i, "%02x", b[i]);
}

double fixture_sample(const char *text, const char *name)
{
	size_t len = strlen(name);
	for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
		if (strncmp(p, name, len) == 0 && p[len] == ' ')
			return strtod(p + len + 1, NULL);
	ck_abort_msg("no sample %s in:\n%s", name, text);
	return 0;
}

/* ---- the cluster ------------------------------------------------------------------- */

#ifdef HAVE_HIREDIS
static const char *admin_password;

redisReply *fixture_admin(int port, const char *fmt, ...)
{
	struct timeval tv = { 5, 0 };
	redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
	ck_assert_msg(c && !c->err, "admin connect to %d: %s", port, c ? c->errstr : "?");
	redisSetTimeout(c, tv);
	if (admin_password) {
		redisReply *a = redisCommand(c, "AUTH %s", admin_password);
		ck_assert_msg(a && a->type == REDIS_REPLY_STATUS, "admin AUTH on %d", port);
		freeReplyObject(a);
	}
	va_list ap;
	va_start(ap, fmt);
	redisReply *reply = redisvCommand(c, fmt, ap);
	va_end(ap);
	ck_assert_msg(reply != NULL, "admin command on %d: %s", port, c->errstr);
	redisFree(c);
	return reply;
}

void fixture_admin_ok(int port, const char *what, redisReply *reply)
{
	ck_assert_msg(reply->type != REDIS_REPLY_ERROR, "%s on %d: %s", what, port, reply->str);
	freeReplyObject(reply);
}

char *fixture_seeds(void)
{
	static char text[64];
	snprintf(text, sizeof(text), "127.0.0.1:%d,127.0.0.1:%d", fixture_base_port,
		 fixture_base_port + 1);
	return text;
}

struct remote *fixture_client(const char *prefix, uint64_t timeout_ms)
{
	struct remote *r;
	struct remote_config cfg = {
		.seeds = fixture_seeds(), .prefix = (char *)prefix, .ttl_s = 600,
		.timeout_ms = timeout_ms,
	};
	ck_assert_int_eq(remote_open(&cfg, &r), 0);
	return r;
}

void fixture_prefix(char *out, size_t len, bool one_slot)
{
	uint32_t n;
	fixture_random_bytes(&n, sizeof(n));
	snprintf(out, len, one_slot ? "t{%08x}" : "t%08x", n);
}

int fixture_master_of_slot(unsigned slot)
{
	for (int p = fixture_base_port; p < fixture_base_port + NODES; p++) {
		struct timeval tv = { 2, 0 };
		redisContext *c = redisConnectWithTimeout("127.0.0.1", p, tv);
		if (!c || c->err) {
			redisFree(c);
			continue;
		}
		redisFree(c);
		redisReply *s = fixture_admin(p, "CLUSTER SLOTS");
		int port = 0;
		for (size_t i = 0; s->type == REDIS_REPLY_ARRAY && i < s->elements; i++) {
			redisReply *e = s->element[i];
			if ((unsigned)e->element[0]->integer <= slot &&
			    slot <= (unsigned)e->element[1]->integer)
				port = (int)e->element[2]->element[1]->integer;
		}
		freeReplyObject(s);
		return port;
	}
	ck_abort_msg("no node answers");
	return 0;
}

unsigned fixture_slot_of(const char *prefix, const char *key)
{
	char full[256];
	int n = snprintf(full, sizeof(full), "%s:%s", prefix, key);
	return cluster_key_slot(full, (size_t)n);
}

pid_t fixture_pid_of(int port)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/redis-%d.pid", fixture_cluster_dir, port);
	FILE *f = fopen(path, "r");
	ck_assert_msg(f != NULL, "%s", path);
	int pid = 0;
	ck_assert_int_eq(fscanf(f, "%d", &pid), 1);
	fclose(f);
	return pid;
}

void fixture_masters(int out[3])
{
	int n = 0;
	for (int p = fixture_base_port; p < fixture_base_port + NODES && n < 3; p++) {
		redisReply *r = fixture_admin(p, "ROLE");
		if (r->type == REDIS_REPLY_ARRAY && strcmp(r->element[0]->str, "master") == 0)
			out[n++] = p;
		freeReplyObject(r);
	}
	ck_assert_int_eq(n, 3);
}

void fixture_set_password(const char *pw)
{
	for (int p = fixture_base_port; p < fixture_base_port + NODES; p++) {
		fixture_admin_ok(p, "masterauth", fixture_admin(p, "CONFIG SET masterauth %s", pw));
		fixture_admin_ok(p, "requirepass",
				 fixture_admin(p, "CONFIG SET requirepass %s", pw));
	}
	admin_password = *pw ? pw : NULL;
}
#endif
