/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sanitizer/common_interface_defs.h>

#include "fuzz.h"

uint8_t fz_u8(struct fuzz_in *in)
{
	if (!in->n)
		return 0;
	in->n--;
	return *in->p++;
}

uint16_t fz_u16(struct fuzz_in *in)
{
	return (uint16_t)(fz_u8(in) | fz_u8(in) << 8);
}

uint32_t fz_u32(struct fuzz_in *in)
{
	uint32_t lo = fz_u16(in);
	return lo | (uint32_t)fz_u16(in) << 16;
}

uint64_t fz_u64(struct fuzz_in *in)
{
	uint64_t lo = fz_u32(in);
	return lo | (uint64_t)fz_u32(in) << 32;
}

uint64_t fz_num(struct fuzz_in *in)
{
	uint8_t sel = fz_u8(in);

	switch (sel & 15) {
	case 0: return 0;
	case 1: return UINT64_MAX - (sel >> 4);
	case 2: return (uint64_t)INT64_MAX - (sel >> 4);
	case 3: return (uint64_t)UINT32_MAX - (sel >> 4);
	case 4: return 1ull << (fz_u8(in) & 63);
	case 5: return fz_u64(in);
	case 6: case 7: return fz_u16(in);
	default: return fz_u8(in);
	}
}

size_t fz_bytes(struct fuzz_in *in, size_t max, const uint8_t **out)
{
	size_t len = max > 255 ? fz_u16(in) : fz_u8(in);

	if (len > max)
		len %= max + 1;
	if (len > in->n)
		len = in->n;
	*out = in->p;
	in->p += len;
	in->n -= len;
	return len;
}

size_t fz_str(struct fuzz_in *in, char *buf, size_t max, char nul)
{
	const uint8_t *p;
	size_t len = fz_bytes(in, max, &p);

	for (size_t i = 0; i < len; i++)
		buf[i] = p[i] ? (char)p[i] : nul;
	buf[len] = '\0';
	return len;
}

static char scratch[256];

static int rm_inside(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st; (void)flag;
	if (ftw->level > 0)
		remove(path);
	return 0;
}

static int rm_all(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st; (void)flag; (void)ftw;
	remove(path);
	return 0;
}

void fz_empty_dir(const char *dir)
{
	nftw(dir, rm_inside, 16, FTW_DEPTH | FTW_PHYS);
}

void fz_rmtree(const char *path)
{
	nftw(path, rm_all, 16, FTW_DEPTH | FTW_PHYS);
}

static void remove_scratch(void)
{
	if (scratch[0])
		fz_rmtree(scratch);
}

/* A crash ends a target without atexit: the next one removes what such
 * targets of this user left behind. */
static void sweep(const char *base)
{
	DIR *d = opendir(base);
	struct dirent *de;
	char path[512];
	struct stat st;

	if (!d)
		return;
	while ((de = readdir(d)) != NULL) {
		long pid;
		if (sscanf(de->d_name, "artfs-fuzz.%ld.", &pid) != 1 || pid <= 0)
			continue;
		if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
			continue;
		snprintf(path, sizeof(path), "%s/%s", base, de->d_name);
		if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == getuid())
			fz_rmtree(path);
	}
	closedir(d);
}

const char *fz_scratch(void)
{
	if (scratch[0])
		return scratch;
	const char *base = getenv("ARTFS_FUZZ_TMP");
	struct stat st;
	if (!base || !*base)
		base = stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) ? "/dev/shm" : "/tmp";
	sweep(base);
	snprintf(scratch, sizeof(scratch), "%s/artfs-fuzz.%ld.XXXXXX", base, (long)getpid());
	if (!mkdtemp(scratch)) {
		fprintf(stderr, "fuzz: cannot make a scratch directory in %s: %s\n", base, strerror(errno));
		abort();
	}
	atexit(remove_scratch);
	__sanitizer_set_death_callback(remove_scratch);
	return scratch;
}

int fz_write_file(const char *path, const void *buf, size_t len)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);

	if (fd < 0)
		return -errno;
	size_t done = 0;
	while (done < len) {
		ssize_t w = write(fd, (const char *)buf + done, len - done);
		if (w < 0) {
			int e = errno;
			close(fd);
			return -e;
		}
		done += (size_t)w;
	}
	close(fd);
	return 0;
}
