/* SPDX-License-Identifier: Apache-2.0 */
/* Helpers shared by the fuzz targets in tests/fuzz: a reader that takes
 * structured values from the fuzzer's bytes, a private scratch directory,
 * and a check that crashes (so that libFuzzer keeps the input). */
#ifndef ARTFS_FUZZ_H
#define ARTFS_FUZZ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* A broken property is a crash: libFuzzer saves the input that broke it. */
#define FZ_CHECK(cond)                                                                    \
	do {                                                                              \
		if (!(cond)) {                                                            \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
			abort();                                                          \
		}                                                                         \
	} while (0)

/* The input, consumed from the front; reads past the end give zeros. */
struct fuzz_in {
	const uint8_t *p;
	size_t n;
};

uint8_t fz_u8(struct fuzz_in *in);
uint16_t fz_u16(struct fuzz_in *in);
uint32_t fz_u32(struct fuzz_in *in);
uint64_t fz_u64(struct fuzz_in *in);
/* A count, a size or an offset: mostly small, sometimes 0, at or near
 * the limits of 32 and 64 bits, or any 64-bit value. */
uint64_t fz_num(struct fuzz_in *in);
/* A length byte (at most max), then that many bytes; *out points into the
 * input. Returns the length taken. */
size_t fz_bytes(struct fuzz_in *in, size_t max, const uint8_t **out);
/* Like fz_bytes into buf (max + 1 bytes), NUL-terminated, any NUL byte in
 * the input replaced by c. */
size_t fz_str(struct fuzz_in *in, char *buf, size_t max, char nul);

/* A directory of this process, in $ARTFS_FUZZ_TMP, /dev/shm or /tmp;
 * created at the first call, removed at exit. */
const char *fz_scratch(void);
/* Removes everything inside dir (not dir itself). */
void fz_empty_dir(const char *dir);
/* Removes path and everything below it. */
void fz_rmtree(const char *path);
int fz_write_file(const char *path, const void *buf, size_t len);

#endif
