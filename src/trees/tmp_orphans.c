/* SPDX-License-Identifier: Apache-2.0 */
/* What a daemon that takes over drops from a tree's tmp directory: a
 * temporary file that no open handle names, and a kept long name whose
 * temporary file is gone. A daemon killed between making a file's
 * temporary file and recording it in the holder's handle (file.c) leaves
 * one: the kernel sends the create again to the next daemon, which makes
 * another, and the first would stay until the next fresh mount. A fresh
 * start empties the directory instead (disk.c: wdisk_open). */
#include "autoconf.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lib/log.h"
#include "restart/held.h"
#include "trees/wtree_i.h"

#define TMP_NAME_MAX sizeof(((struct held_handle *)0)->key)

/* The temporary names that the live write handles name, then the inodes
 * of those that exist. */
struct kept {
	char (*names)[TMP_NAME_MAX + 1];
	size_t nnames, cap_names;
	uint64_t *inos;
	size_t ninos, cap_inos;
	bool short_of_memory;
};

static bool grow(void **arr, size_t *cap, size_t n, size_t size)
{
	if (n < *cap)
		return true;
	size_t cap2 = *cap ? *cap * 2 : 16;
	void *p = realloc(*arr, cap2 * size);
	if (!p)
		return false;
	*arr = p;
	*cap = cap2;
	return true;
}

static void keep_name(const struct held_handle *r, void *ctx)
{
	struct kept *k = ctx;

	if (!grow((void **)&k->names, &k->cap_names, k->nnames, sizeof(*k->names))) {
		k->short_of_memory = true;
		return;
	}
	memcpy(k->names[k->nnames], r->key, TMP_NAME_MAX);
	k->names[k->nnames++][TMP_NAME_MAX] = '\0';
}

static bool named(const struct kept *k, const char *name)
{
	for (size_t i = 0; i < k->nnames; i++)
		if (strcmp(k->names[i], name) == 0)
			return true;
	return false;
}

static bool ino_kept(const struct kept *k, uint64_t ino)
{
	for (size_t i = 0; i < k->ninos; i++)
		if (k->inos[i] == ino)
			return true;
	return false;
}

/* Whether name (an entry of w's tmp directory) stays: a temporary file a
 * handle names (its inode noted), a long name of one of those, or what
 * this code does not know. */
static bool stays(struct wtree *w, struct kept *k, const char *name, bool long_names)
{
	uint64_t ino;
	struct stat st;

	if (!long_names) {
		if (strncmp(name, WFILE_TMP_PREFIX, strlen(WFILE_TMP_PREFIX)) != 0)
			return true;
		if (!named(k, name))
			return false;
		if (fstatat(w->tmp_fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
			if (grow((void **)&k->inos, &k->cap_inos, k->ninos, sizeof(*k->inos)))
				k->inos[k->ninos++] = st.st_ino;
			else
				k->short_of_memory = true;
		}
		return true;
	}
	return !wlong_name_file(name, &ino) || ino_kept(k, ino);
}

void wtmp_orphans_drop(struct tree *t, struct wtree *w)
{
	struct kept k = {0};
	unsigned dropped = 0;
	int fd = dup(w->tmp_fd);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;

	if (!d) {
		log_err("%s: %s/: %s; temporary files a daemon left stay until a fresh mount",
			w->p->label, w->p->tmp_dir, strerror(errno));
		if (fd >= 0)
			close(fd);
		return;
	}
	held_handles_each(&t->held, HANDLE_CACHE_WRITE, keep_name, &k);
	/* Temporary files first: the inodes of those kept say which long
	 * names stay. Short of memory, nothing more is dropped: a writer's
	 * file is worth more than a leftover. */
	for (int pass = 0; pass < 2 && !k.short_of_memory; pass++) {
		struct dirent *e;
		rewinddir(d);
		while ((e = readdir(d)) && !k.short_of_memory) {
			if (stays(w, &k, e->d_name, pass == 1))
				continue;
			if (unlinkat(w->tmp_fd, e->d_name, 0) == 0)
				dropped++;
			else if (errno != ENOENT)
				log_err("%s: %s/%s: %s", w->p->label, w->p->tmp_dir, e->d_name,
					strerror(errno));
		}
	}
	closedir(d);
	if (k.short_of_memory)
		log_err("%s: out of memory looking for temporary files no writer holds",
			w->p->label);
	if (dropped)
		log_info("%s: dropped %u temporary files no writer holds (a daemon before "
			 "ended while making them)", w->p->label, dropped);
	free(k.names);
	free(k.inos);
}
