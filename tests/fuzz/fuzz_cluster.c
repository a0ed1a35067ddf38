/* SPDX-License-Identifier: Apache-2.0 */
/* The cluster client's replies (DESIGN.md §7): bytes as a Redis node would
 * send them, fed in pieces (of the size the input's first two bytes give)
 * to hiredis's reply parser bounded as every connection's is
 * (redis_reader_bound), and each reply read as the client reads it: as a
 * slot map (CLUSTER SLOTS), as a node list counting the replicas of the
 * last map (CLUSTER NODES), as an error (MOVED, ASK and the rest). What
 * is accepted must hold what the client relies on: slots and ports in
 * range, host names bounded and terminated, no array longer than the
 * bound. */
#include "autoconf.h"

#include <string.h>

#include "fuzz.h"
#include "remote/cluster_reply.h"
#include "remote/redis.h"

static const struct cluster_addr asked = { .host = "10.0.0.1", .port = 7000 };

static void check_addr(const struct cluster_addr *a)
{
	FZ_CHECK(memchr(a->host, '\0', sizeof(a->host)) != NULL);
	FZ_CHECK(a->port >= 1 && a->port <= 65535);
}

static void check_shards(const struct cluster_shard *s, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		FZ_CHECK(s[i].start <= s[i].end && s[i].end < CLUSTER_SLOTS);
		FZ_CHECK(s[i].replicas >= 0);
		FZ_CHECK(!s[i].id_len || s[i].id);
		check_addr(&s[i].master);
	}
}

static void check_bounded(const redisReply *r)
{
	if (r->type != REDIS_REPLY_ARRAY)
		return;
	FZ_CHECK(r->elements <= REDIS_REPLY_ELEMENTS_MAX);
	for (size_t i = 0; i < r->elements; i++)
		check_bounded(r->element[i]);
}

/* One reply, as each part of the client would read it; *map and *held
 * are the last slot map and the reply its node ids point into. */
static void read_reply(redisReply *r, struct cluster_shard **map, size_t *n, redisReply **held)
{
	struct cluster_shard *s;
	size_t count;

	check_bounded(r);
	if (cluster_slots_parse(r, &asked, &s, &count) == 0) {
		check_shards(s, count);
		free(*map);
		if (*held)
			freeReplyObject(*held);
		*map = s;
		*n = count;
		*held = r;
		return;
	}
	cluster_nodes_count_replicas(r, *map, *n);
	check_shards(*map, *n);
	if (r->type == REDIS_REPLY_ERROR || r->type == REDIS_REPLY_STATUS ||
	    r->type == REDIS_REPLY_STRING) {
		unsigned slot;
		struct cluster_addr to;
		enum cluster_error kind = cluster_error_kind(r->str);
		FZ_CHECK(kind >= CLUSTER_ERROR_MOVED && kind <= CLUSTER_ERROR_FATAL);
		if (cluster_redirect_parse(r->str, &slot, &to) == 0) {
			FZ_CHECK(slot < CLUSTER_SLOTS);
			check_addr(&to);
		}
	}
	freeReplyObject(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fuzz_in in = { data, size };
	size_t piece = fz_u16(&in) % 4096 + 1;
	redisReader *reader = redisReaderCreate();
	struct cluster_shard *map = NULL;
	size_t n = 0;
	redisReply *held = NULL;

	FZ_CHECK(reader);
	redis_reader_bound(reader);
	while (in.n) {
		size_t take = in.n < piece ? in.n : piece;
		if (redisReaderFeed(reader, (const char *)in.p, take) != REDIS_OK)
			break;
		in.p += take;
		in.n -= take;
		void *reply;
		int rc;
		while ((rc = redisReaderGetReply(reader, &reply)) == REDIS_OK && reply)
			read_reply(reply, &map, &n, &held);
		if (rc != REDIS_OK)
			break;
	}
	free(map);
	if (held)
		freeReplyObject(held);
	redisReaderFree(reader);
	return 0;
}
