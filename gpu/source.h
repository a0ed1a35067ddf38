/* SPDX-License-Identifier: Apache-2.0 */
/* A checkpoint file whose bytes are in memory (tmpfs, a warm page cache),
 * read by the loader through a mapping instead of pread(2).
 *
 * Why: the first pread of a page since it was written (a trainer's fresh
 * checkpoint in /dev/shm) is slow when many threads read at once (most
 * likely it moves the page to the active LRU list, under one lock);
 * copying out of a mapping is not.
 * 8 GiB just written into /dev/shm, 16 threads on the 16-core H200 host:
 * pread 20-29 GB/s, a MADV_SEQUENTIAL mapping whose pages each reader
 * unmaps after its copy 59-61 GB/s, mmap and munmap included
 * (bench/shm_read_bench, bench/RESULTS of 2026-12-05).
 *
 * A file that shrinks while it is mapped faults (SIGBUS) where pread would
 * come up short: source_copy catches that fault and fails with -EIO, and
 * the daemon lives on. No CUDA here, so the unit tests run it. */
#ifndef ARTFS_GPU_SOURCE_H
#define ARTFS_GPU_SOURCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

struct source_map {
	char *base; /* NULL: not mapped, read it with pread */
	size_t size;
};

/* Whether the open file fd (st its fstat, path for the access check) is in
 * memory: every one of 64 pages spread over it is (mincore). Not asked
 * when the caller could not have written the file (then the kernel says
 * every page is, Linux >= 5.0): false. When it is, m is its mapping, except
 * with ARTFS_LOAD_PREAD=1 (for measuring) or where it cannot be mapped: then
 * m->base is NULL and the file is read with pread. */
bool source_open(int fd, const char *path, const struct stat *st, struct source_map *m);

/* Copies len bytes at off of the mapped file into dst, then unmaps the
 * whole pages it read (their bytes stay in memory). 0; -EINVAL when the
 * range lies outside the file as it was mapped; -EIO when the file is
 * shorter now (truncated while loading). Any thread, at once. */
int source_copy(const struct source_map *m, void *dst, uint64_t off, size_t len);

void source_unmap(struct source_map *m);

#endif
