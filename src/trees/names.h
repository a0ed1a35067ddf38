/* SPDX-License-Identifier: Apache-2.0 */
/* The names a write-once tree takes (DESIGN.md §9): components of 1-255
 * bytes without '/' or NUL, not "." or "..". Fuzzed alone
 * (tests/fuzz/fuzz_tree_names.c). */
#ifndef ARTFS_TREES_NAMES_H
#define ARTFS_TREES_NAMES_H

#include <stddef.h>

#define WTREE_NAME_MAX 255

/* 0, -ENAMETOOLONG, or -EINVAL (empty, ".", "..", a '/'). */
int wtree_name_check(const char *name);

/* The same for len bytes that may hold anything (a NUL among them is
 * -EINVAL): what a fuzzer feeds. */
int wtree_name_check_bytes(const char *name, size_t len);

#endif
