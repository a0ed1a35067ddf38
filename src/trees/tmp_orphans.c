/* SPDX-License-Identifier: Apache-2.0 */
/* What a daemon that died while making a file leaves in a tree's tmp
 * directory, dropped by the next one. The kernel sends a create that its
 * daemon did not answer again, and the next daemon makes another file,
 * so the first one's temporary file would stay until the next fresh mount
 * (which empties the directory: disk.c, wdisk_open):
 *   - made but not yet named in the holder's record of its handle: no
 *     record names it, so the daemon that takes over drops it before it
 *     serves (with a kept long name whose temporary file is gone);
 *   - named, but the answer never reached the kernel: its record keeps
 *     the create's unique (file.c: wfile_recorded), and the create sent
 *     again with that unique drops it and frees the record. */
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
 * of those that exist: each sorted once, then searched per entry. */
struct kept {
	char (*names)[TMP_NAME_MAX + 1];
	size_t nnames, cap_names;
	uint64_t *inos;
	size_t ninos, cap_inos;
	bool short_of_memory;
};

/* arr with room for one more of size bytes after n: arr, a larger copy
 * (cap updated), or NULL. */
static void *room_for_one(void *arr, size_t *cap, size_t n, size_t size)
{
	if (n < *cap)
		return arr;
	size_t cap2 = *cap ? *cap * 2 : 16;
	void *p = realloc(arr, cap2 * size);
	if (p)
		*cap = cap2;
	return p;
}

static void keep_name(const struct held_handle *r, uint64_t fh, void *ctx)
{
	struct kept *k = ctx;
	(void)fh;
	char(*names)[TMP_NAME_MAX + 1] = room_for_one(k->names, &k->cap_names, k->nnames,
						       sizeof(*k->names));

	if (!names) {
		k->short_of_memory = true;
		return;
	}
	k->names = names;
	memcpy(k->names[k->nnames], r->key, TMP_NAME_MAX);
	k->names[k->nnames++][TMP_NAME_MAX] = '\0';
}

/* A name file.c gives a temporary file (and nothing with a '/'). */
static bool is_tmp_name(const char *name)
{
	return strncmp(name, WFILE_TMP_PREFIX, strlen(WFILE_TMP_PREFIX)) == 0 && !strchr(name, '/');
}

static int name_cmp(const void *a, const void *b)
{
	return strcmp(a, b);
}

static int ino_cmp(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* Whether name (an entry of w's tmp directory) stays: a temporary file a
 * handle names (its inode noted), a long name of one of those (once the
 * inodes are sorted), or what this code does not know. */
static bool stays(struct wtree *w, struct kept *k, const char *name, bool long_names)
{
	uint64_t ino;
	struct stat st;

	if (long_names)
		return !wlong_name_file(name, &ino) ||
		       (k->ninos && bsearch(&ino, k->inos, k->ninos, sizeof(*k->inos), ino_cmp));
	if (!is_tmp_name(name))
		return true;
	if (strlen(name) > TMP_NAME_MAX || !k->nnames ||
	    !bsearch(name, k->names, k->nnames, sizeof(*k->names), name_cmp))
		return false;
	if (fstatat(w->tmp_fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
		uint64_t *inos = room_for_one(k->inos, &k->cap_inos, k->ninos, sizeof(*k->inos));
		if (inos) {
			k->inos = inos;
			k->inos[k->ninos++] = st.st_ino;
		} else {
			k->short_of_memory = true;
		}
	}
	return true;
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
	if (k.nnames)
		qsort(k.names, k.nnames, sizeof(*k.names), name_cmp);
	/* Temporary files first: the inodes of those kept say which long
	 * names stay. Short of memory, nothing more is dropped: a writer's
	 * file is worth more than a leftover. */
	for (int pass = 0; pass < 2 && !k.short_of_memory; pass++) {
		struct dirent *e;
		if (pass == 1 && k.ninos)
			qsort(k.inos, k.ninos, sizeof(*k.inos), ino_cmp);
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

/* ---- a create sent again ------------------------------------------------------------ */

struct unanswered {
	uint64_t unique;
	uint64_t fh[4];
	char names[4][TMP_NAME_MAX + 1];
	size_t n;
};

static void match_unique(const struct held_handle *r, uint64_t fh, void *ctx)
{
	struct unanswered *u = ctx;
	uint64_t unique;

	memcpy(&unique, r->sha, sizeof(unique));
	if (unique != u->unique || u->n == sizeof(u->fh) / sizeof(u->fh[0]))
		return;
	u->fh[u->n] = fh;
	memcpy(u->names[u->n], r->key, TMP_NAME_MAX);
	u->names[u->n++][TMP_NAME_MAX] = '\0';
}

void wtmp_unanswered_drop(struct tree *t, struct wtree *w, uint64_t unique)
{
	struct unanswered u = { .unique = unique };
	struct stat st;

	if (!unique)
		return;
	held_handles_each(&t->held, HANDLE_CACHE_WRITE, match_unique, &u);
	for (size_t i = 0; i < u.n; i++) {
		const char *name = u.names[i];
		bool ours = is_tmp_name(name);
		if (ours && fstatat(w->tmp_fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
			wlong_name_drop(w, st.st_ino);
			unlinkat(w->tmp_fd, name, 0);
		}
		held_handle_free(&t->held, u.fh[i]);
		log_info("%s: a create its daemon died answering, sent again: its temporary file "
			 "%s/%s dropped", w->p->label, w->p->tmp_dir, ours ? name : "(none)");
	}
}
