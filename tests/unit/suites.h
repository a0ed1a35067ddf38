/* SPDX-License-Identifier: Apache-2.0 */
/* Check suites of the core's unit tests. */
#ifndef ARTFS_TEST_SUITES_H
#define ARTFS_TEST_SUITES_H

#include <check.h>
#include <stddef.h>
#include <stdint.h>

Suite *envelope_suite(void);
Suite *key_suite(void);
Suite *npy_suite(void);
Suite *config_suite(void);
Suite *tree_suite(void);
Suite *materialize_suite(void);
Suite *safetensors_suite(void);
Suite *checkpoint_suite(void);
Suite *parallel_suite(void);
Suite *source_suite(void);
Suite *tmp_pool_suite(void);
Suite *held_suite(void);
Suite *attach_suite(void);
Suite *lifeline_suite(void);
Suite *layout_suite(void);
Suite *flip_range_suite(void);

/* Reads VECTORS_DIR/<name> into a malloc'd buffer. */
uint8_t *read_vector(const char *name, size_t *len);

#endif
