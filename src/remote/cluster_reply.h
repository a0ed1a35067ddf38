/* SPDX-License-Identifier: Apache-2.0 */
/* What the replies of a Redis Cluster say, read from hiredis's parsed
 * replies: the slot map (CLUSTER SLOTS), the healthy replicas of each
 * shard (CLUSTER NODES), redirections (MOVED, ASK) and what an error
 * reply asks of the client. Pure: no I/O, so that bytes from the network
 * can be fuzzed through hiredis's parser into these (tests/fuzz). */
#ifndef ARTFS_CLUSTER_REPLY_H
#define ARTFS_CLUSTER_REPLY_H

#include <hiredis.h>
#include <stdbool.h>
#include <stddef.h>

#include "remote/cluster.h"

/* One range of slots of CLUSTER SLOTS and its master. */
struct cluster_shard {
	unsigned start, end;        /* start <= end < CLUSTER_SLOTS */
	struct cluster_addr master;
	const char *id;             /* the master's node id (in the reply), NULL if not given */
	size_t id_len;
	int replicas;
};

/* CLUSTER SLOTS: [[start, end, [host, port, id, ...], [replica...]...], ...]
 * into a malloc'd array of the ranges whose master's address is known
 * ("?" is not); an empty host is the node asked. 0, -EPROTO (malformed),
 * -ENOMEM. */
int cluster_slots_parse(const redisReply *reply, const struct cluster_addr *asked,
			struct cluster_shard **out, size_t *count);

/* CLUSTER SLOTS leaves out a replica whose replication offset is still 0,
 * so the replicas that WAIT can count on are counted from CLUSTER NODES
 * ("<id> <addr> <flags> <master id> ..." lines): slaves without fail,
 * fail?, handshake or noaddr, for the shards whose master id is known. A
 * reply that is not text changes nothing. */
void cluster_nodes_count_replicas(const redisReply *nodes, struct cluster_shard *s, size_t n);

/* What an error reply asks of the client. */
enum cluster_error {
	CLUSTER_ERROR_MOVED,     /* the slot lives elsewhere now: "MOVED <slot> <host:port>" */
	CLUSTER_ERROR_ASK,       /* ask once elsewhere: "ASK <slot> <host:port>" */
	CLUSTER_ERROR_OOM,       /* the node is out of memory (noeviction): ENOSPC */
	CLUSTER_ERROR_RETRY,     /* TRYAGAIN, LOADING, BUSY: the same again, a little later */
	CLUSTER_ERROR_FAILOVER,  /* CLUSTERDOWN, MASTERDOWN, READONLY: learn the map, retry */
	CLUSTER_ERROR_FATAL,     /* anything else (NOAUTH, WRONGTYPE, ...): retrying won't help */
};

enum cluster_error cluster_error_kind(const char *error);

/* The slot and address of a MOVED or ASK error. 0, or -EINVAL when it is
 * not "<word> <slot below 16384> <host:port>". */
int cluster_redirect_parse(const char *error, unsigned *slot, struct cluster_addr *to);

#endif
