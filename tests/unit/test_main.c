/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <stdio.h>
#include <stdlib.h>

#include "lib/log.h"
#include "suites.h"

uint8_t *read_vector(const char *name, size_t *len)
{
	char path[4096];
	snprintf(path, sizeof(path), "%s/%s", VECTORS_DIR, name);
	FILE *f = fopen(path, "rb");
	ck_assert_msg(f != NULL, "cannot open %s", path);
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	uint8_t *buf = malloc((size_t)n + 1);
	ck_assert(buf);
	ck_assert_uint_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
	fclose(f);
	*len = (size_t)n;
	return buf;
}

int main(void)
{
	SRunner *sr = srunner_create(envelope_suite());
	srunner_add_suite(sr, key_suite());
	srunner_add_suite(sr, npy_suite());
	srunner_add_suite(sr, config_suite());
	srunner_add_suite(sr, tree_suite());
	srunner_add_suite(sr, materialize_suite());
	srunner_add_suite(sr, safetensors_suite());
	srunner_add_suite(sr, checkpoint_suite());
	srunner_add_suite(sr, parallel_suite());
	srunner_add_suite(sr, source_suite());
	srunner_add_suite(sr, tmp_pool_suite());
	srunner_add_suite(sr, held_suite());
	srunner_add_suite(sr, attach_suite());
	srunner_add_suite(sr, lifeline_suite());
	srunner_add_suite(sr, layout_suite());
	srunner_add_suite(sr, flip_range_suite());
	log_init(0, 0);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
