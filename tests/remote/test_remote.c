/* SPDX-License-Identifier: Apache-2.0 */
/* Tests of the Redis Cluster client (src/remote/): the suites and main.
 *
 * Without ARTFS_REMOTE_PORT: the tests that need no cluster (slots, seed
 * lists, metrics text, argument checks, an unreachable seed). With it (set
 * by tests/remote/run.sh, which starts a cluster of 6 redis-server on
 * 127.0.0.1, ports ARTFS_REMOTE_PORT..+5): the client against that cluster,
 * ending with the tests that break it (failover, everything stopped).
 * The tests are in test_remote_offline.c, test_remote_data.c and
 * test_remote_topology.c; the cluster's helpers in remote_fixture.c. */
#include "autoconf.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>

#include "lib/log.h"
#include "remote_fixture.h"

static Suite *offline_suite(void)
{
	Suite *s = suite_create("remote offline");
	TCase *tc = tcase_create("pure");
	offline_tests(tc);
	tcase_set_timeout(tc, 30);
	suite_add_tcase(s, tc);
	return s;
}

#ifdef HAVE_HIREDIS
static Suite *cluster_suite(void)
{
	Suite *s = suite_create("remote cluster");
	TCase *tc = tcase_create("cluster");
	data_tests(tc);
	topology_tests(tc);   /* they break the cluster: last */
	tcase_set_timeout(tc, 60);
	suite_add_tcase(s, tc);
	return s;
}
#endif

int main(void)
{
	const char *port = getenv("ARTFS_REMOTE_PORT");
	SRunner *sr;

	log_init(0, 0);
	if (port && *port) {
#ifdef HAVE_HIREDIS
		fixture_base_port = atoi(port);
		fixture_cluster_dir = getenv("ARTFS_REMOTE_DIR");
		if (fixture_base_port <= 0 || !fixture_cluster_dir) {
			fprintf(stderr, "ARTFS_REMOTE_PORT and ARTFS_REMOTE_DIR must be set together\n");
			return 99;
		}
		sr = srunner_create(cluster_suite());
#else
		return 77;
#endif
	} else {
		sr = srunner_create(offline_suite());
	}
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	if (failed)
		return EXIT_FAILURE;
#ifndef HAVE_HIREDIS
	return 77;   /* built without hiredis: the cluster tests cannot run */
#else
	return EXIT_SUCCESS;
#endif
}
