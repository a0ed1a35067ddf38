/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "gpu/source.h"

#define RESIDENT_SAMPLES 64

/* The SIGBUS of a copy out of a file that shrank (a fault in the range
 * being copied) returns to its source_copy; any other SIGBUS gets what it
 * would have got without this handler (the previous action, the default
 * one: the process dies). */
static _Thread_local sigjmp_buf *volatile guard;
static _Thread_local const char *volatile guard_lo, *volatile guard_hi;
static _Thread_local bool unblocked;
static struct sigaction previous;
static pthread_once_t installed = PTHREAD_ONCE_INIT;
static bool handling;

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
	(void)uc;
	if (guard && si->si_code > 0 && (const char *)si->si_addr >= guard_lo &&
	    (const char *)si->si_addr < guard_hi)
		siglongjmp(*guard, 1);
	sigaction(SIGBUS, &previous, NULL);
	if (si->si_code <= 0)
		raise(sig); /* sent, not a fault: send it again */
	/* A fault: returning runs the access again, which faults again. */
}

static void install(void)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_sigbus;
	sa.sa_flags = SA_SIGINFO;
	sigemptyset(&sa.sa_mask);
	handling = sigaction(SIGBUS, &sa, &previous) == 0;
}

static bool pages_resident(const char *base, size_t size)
{
	long page = sysconf(_SC_PAGESIZE);
	uint64_t pages = ((uint64_t)size + (uint64_t)page - 1) / (uint64_t)page;

	for (int i = 0; i < RESIDENT_SAMPLES; i++) {
		uint64_t at = pages * (uint64_t)i / RESIDENT_SAMPLES;
		unsigned char vec = 0;
		if (mincore((char *)base + at * (uint64_t)page, (size_t)page, &vec) != 0 || !(vec & 1))
			return false;
	}
	return true;
}

bool source_open(int fd, const char *path, const struct stat *st, struct source_map *m)
{
	const char *no_map = getenv("ARTFS_LOAD_PREAD");

	m->base = NULL;
	m->size = 0;
	if (st->st_size <= 0 || (uint64_t)st->st_size > (uint64_t)SIZE_MAX)
		return false;
	if (geteuid() != 0 && st->st_uid != geteuid() && faccessat(AT_FDCWD, path, W_OK, AT_EACCESS) != 0)
		return false;
	size_t size = (size_t)st->st_size;
	void *map = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0); /* mincore needs one */
	if (map == MAP_FAILED)
		return false;
	if (!pages_resident(map, size)) {
		munmap(map, size);
		return false;
	}
	pthread_once(&installed, install);
	/* Sequential: unmapping its pages does not mark them accessed, which
	 * would be pread's LRU work again. */
	if ((no_map && strcmp(no_map, "1") == 0) || !handling || madvise(map, size, MADV_SEQUENTIAL) != 0) {
		munmap(map, size);
		return true; /* in memory, read with pread */
	}
	m->base = map;
	m->size = size;
	return true;
}

int source_copy(const struct source_map *m, void *dst, uint64_t off, size_t len)
{
	sigjmp_buf here;
	long page = sysconf(_SC_PAGESIZE);

	if (!m->base || off > m->size || len > m->size - off)
		return -EINVAL;
	if (!unblocked) {
		/* The daemon's threads start with every signal blocked (fs/loop.c),
		 * and a fault whose signal is blocked kills the process. */
		sigset_t bus;
		sigemptyset(&bus);
		sigaddset(&bus, SIGBUS);
		pthread_sigmask(SIG_UNBLOCK, &bus, NULL);
		unblocked = true;
	}
	if (sigsetjmp(here, 1)) {
		guard = NULL;
		return -EIO;
	}
	guard_lo = m->base + off;
	guard_hi = m->base + off + len;
	guard = &here;
	memcpy(dst, m->base + off, len);
	guard = NULL;
	/* The whole pages read: each reader unmaps its own at once, in
	 * parallel, instead of one munmap of the file at the end (0.44 s for
	 * 8 GiB). A neighbour's page at either end stays for munmap. */
	uint64_t lo = (off + (uint64_t)page - 1) / (uint64_t)page * (uint64_t)page;
	uint64_t hi = (off + len) / (uint64_t)page * (uint64_t)page;
	if (hi > lo)
		madvise(m->base + lo, (size_t)(hi - lo), MADV_DONTNEED);
	return 0;
}

void source_unmap(struct source_map *m)
{
	if (m->base)
		munmap(m->base, m->size);
	m->base = NULL;
	m->size = 0;
}
