/* SPDX-License-Identifier: Apache-2.0 */
/* What the files of the Redis Cluster client tests share (tests/remote/):
 * the cluster the test runs against (started by tests/remote/run.sh),
 * random keys and bytes, Prometheus samples, admin commands to the nodes,
 * and the list of tests each file adds to its suite, in their order.
 * Include "autoconf.h" first: HAVE_HIREDIS decides what is here. */
#ifndef ARTFS_TEST_REMOTE_FIXTURE_H
#define ARTFS_TEST_REMOTE_FIXTURE_H

#include <check.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef HAVE_HIREDIS
#include <hiredis.h>
#endif

#include "remote/remote.h"

#define NODES 6

/* The cluster's first port, and the directory of its pid files; 0 and NULL
 * when the tests run without a cluster. Set by main. */
extern int fixture_base_port;
extern const char *fixture_cluster_dir;

/* CLOCK_MONOTONIC in seconds. */
double fixture_now_s(void);

void fixture_random_bytes(void *buf, size_t len);

/* 64 lowercase hex digits, as the client's keys are. */
void fixture_random_key(char out[65]);

/* Value of one sample line "name value" in Prometheus text. */
double fixture_sample(const char *text, const char *name);

#ifdef HAVE_HIREDIS
/* One command to one node, on a connection of its own (authenticated while
 * fixture_set_password has set a password); fails the test without a reply. */
__attribute__((format(printf, 2, 3)))
redisReply *fixture_admin(int port, const char *fmt, ...);

/* Fails the test if reply is an error; frees it. */
void fixture_admin_ok(int port, const char *what, redisReply *reply);

/* requirepass and masterauth on every node; "" removes the password. */
void fixture_set_password(const char *pw);

/* The seed list of the cluster: its first two nodes. */
char *fixture_seeds(void);

/* A client of the cluster with a TTL of 600 s; prefix NULL: the default. */
struct remote *fixture_client(const char *prefix, uint64_t timeout_ms);

/* A prefix of its own for each test: "t<random>", optionally with a hash tag
 * that puts every key in one slot. */
void fixture_prefix(char *out, size_t len, bool one_slot);

/* The port of the master of slot, as CLUSTER SLOTS of a live node says. */
int fixture_master_of_slot(unsigned slot);

/* The slot of the client's key "<prefix>:<key>". */
unsigned fixture_slot_of(const char *prefix, const char *key);

/* The pid of the redis-server on port. */
pid_t fixture_pid_of(int port);

/* The ports of the three masters. */
void fixture_masters(int out[3]);
#endif

/* The tests of each file, added to tc in the order they must run. */
void offline_tests(TCase *tc);      /* test_remote_offline.c: no cluster needed */
#ifdef HAVE_HIREDIS
void data_tests(TCase *tc);         /* test_remote_data.c: values in and out */
void topology_tests(TCase *tc);     /* test_remote_topology.c: the cluster changes; last */
#endif

#endif
