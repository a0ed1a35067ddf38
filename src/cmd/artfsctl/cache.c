/* SPDX-License-Identifier: Apache-2.0 */
/* artfsctl cache: the write-once tree .cache/ (DESIGN.md §9). Without
 * arguments, the tree's files and bytes per top-level entry, counted by a
 * bounded walk, then the daemon's cache metrics; "cache env" prints the
 * environment lines that point the usual tools at the tree.
 *
 * The walk runs in a child that shows progress on a pipe: a mount whose
 * daemon does not serve makes a lookup wait in the kernel, where only a
 * fatal signal ends it, so the parent kills a child that stays silent
 * for --timeout seconds (status does the same for its two reads). */
#include "autoconf.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cmd/artfsctl/artfsctl_i.h"
#include "lib/cleanup.h"

#define CACHE_DIR ".cache"
#define WALK_DEPTH_MAX 32            /* DESIGN.md §9: no deeper directory can be made */
#define WALK_ENTRIES_MAX 1000000u    /* bounds the time and memory one table costs */
#define WALK_BEAT 256                /* entries between two signs of progress */
#define CACHE_WAIT_S 5               /* seconds without progress, as status waits */
#define NAME_SHOWN_MAX 48            /* bytes of a top-level name in the table */

/* The tools and the directory of .cache/ that each is pointed at.
 * contrib/python/artfs/cache.py has the same table, and
 * tests/mount/test_cache_tools.py checks that both print the same lines.
 * FlashInfer is not here: its workspace (FLASHINFER_WORKSPACE_BASE) is a
 * build directory that appends to a log, rewrites lock files and ninja's
 * files in place, and makes symlinks, all of which a write-once tree
 * refuses (its import fails on the log). */
static const struct cache_tool {
	const char *var;
	const char *dir;
} cache_tools[] = {
	{ "TORCHINDUCTOR_CACHE_DIR", "inductor" },
	{ "TRITON_CACHE_DIR", "triton" },
	{ "VLLM_CACHE_ROOT", "vllm" },
	{ "DG_JIT_CACHE_DIR", "deep_gemm" },
	{ "CUDA_CACHE_PATH", "cuda" },
};

/* The cache metrics of .artfs/metrics, in the order they are printed. */
static const struct cache_metric {
	const char *label;
	const char *name;
	bool bytes;
} cache_metrics[] = {
	{ "hits", "artfs_cache_hits", false },
	{ "misses", "artfs_cache_misses", false },
	{ "remote hits", "artfs_cache_remote_hits", false },
	{ "commits", "artfs_cache_commits", false },
	{ "collisions", "artfs_cache_collisions", false },
	{ "evictions", "artfs_cache_evictions", false },
	{ "damaged", "artfs_cache_damaged", false },
	{ "bytes", "artfs_cache_bytes", true },
	{ "files", "artfs_cache_files", false },
	{ "capacity", "artfs_cache_capacity_bytes", true },
};
#define CACHE_METRIC_COUNT (sizeof(cache_metrics) / sizeof(cache_metrics[0]))

/* ---- cache env ------------------------------------------------------------ */

/* The mount point as the tools need it: absolute (made so against the
 * working directory, not resolved: nothing on the mount is touched) and
 * without trailing slashes, "" for "/". NULL with errno set. */
static char *mount_absolute(const char *mnt)
{
	char *cwd = NULL, *path;

	if (mnt[0] != '/' && !(cwd = getcwd(NULL, 0)))
		return NULL;
	size_t n = (cwd ? strlen(cwd) + 1 : 0) + strlen(mnt) + 1;
	if ((path = malloc(n)))
		snprintf(path, n, "%s%s%s", cwd ? cwd : "", cwd ? "/" : "", mnt);
	free(cwd);
	for (size_t len = path ? strlen(path) : 0; len > 0 && path[len - 1] == '/'; len--)
		path[len - 1] = '\0';
	return path;
}

/* s in single quotes for sh: a quote inside becomes '\''. */
static void print_sh_quoted(FILE *f, const char *s)
{
	fputc('\'', f);
	for (; *s; s++) {
		if (*s == '\'')
			fputs("'\\''", f);
		else
			fputc(*s, f);
	}
	fputc('\'', f);
}

static int cache_env(const struct ctl *ctl, bool shell)
{
	_cleanup_free_ char *base = NULL;

	if (!*ctl->mnt)
		return ctl_bad_usage("the mount point is an empty string");
	if (!(base = mount_absolute(ctl->mnt)))
		return ctl_fail("cache env: %s", strerror(errno));
	for (const char *p = base; *p; p++)
		if ((unsigned char)*p < 0x20 || *p == 0x7f)
			return ctl_fail("cache env: the mount point holds a control character, which an "
					"environment line cannot carry");
	if (strlen(base) >= PATH_MAX) /* before any line: no half of the list */
		return ctl_fail("cache env: the mount point is longer than PATH_MAX");
	for (size_t i = 0; i < sizeof(cache_tools) / sizeof(cache_tools[0]); i++) {
		const struct cache_tool *t = &cache_tools[i];
		char value[PATH_MAX + 64]; /* the longest dir of cache_tools fits */
		snprintf(value, sizeof(value), "%s/" CACHE_DIR "/%s", base, t->dir);
		if (shell) {
			printf("export %s=", t->var);
			print_sh_quoted(stdout, value);
			putchar('\n');
		} else {
			printf("%s=%s\n", t->var, value);
		}
	}
	if (fflush(stdout) != 0 || ferror(stdout))
		return ctl_fail("writing to stdout: %s", strerror(errno));
	return 0;
}

/* ---- the walk ------------------------------------------------------------- */

struct top_entry {
	char *name;
	uint64_t files, bytes;
};

struct walk {
	struct top_entry *rows;
	size_t nrows, cap;
	uint64_t entries;        /* names seen, at every level */
	uint64_t unreadable;     /* names or directories that could not be read */
	int first_error;         /* errno of the first of them */
	bool cut_entries;        /* stopped at WALK_ENTRIES_MAX */
	bool cut_depth;          /* a directory deeper than WALK_DEPTH_MAX was skipped */
	int beat_fd;             /* the parent's pipe: a byte now and then */
};

static void walk_error(struct walk *w, int err)
{
	if (w->unreadable++ == 0)
		w->first_error = err;
}

/* One more name seen: false once the walk must stop. */
static bool walk_count(struct walk *w)
{
	if (w->entries >= WALK_ENTRIES_MAX) {
		w->cut_entries = true;
		return false;
	}
	if (++w->entries % WALK_BEAT == 0 && write(w->beat_fd, "", 1) < 0)
		return false; /* the parent is gone */
	return true;
}

static struct top_entry *walk_row(struct walk *w, const char *name)
{
	if (w->nrows == w->cap) {
		size_t cap = w->cap ? w->cap * 2 : 16;
		struct top_entry *grown = realloc(w->rows, cap * sizeof(*grown));
		if (!grown)
			return NULL;
		w->rows = grown;
		w->cap = cap;
	}
	struct top_entry *row = &w->rows[w->nrows];
	*row = (struct top_entry){ .name = strdup(name) };
	if (!row->name)
		return NULL;
	w->nrows++;
	return row;
}

/* Adds the files and bytes under the directory dfd (taken over: closed
 * here), depth levels below .cache/, to row; at depth 0 (.cache/ itself)
 * each entry gets a row of its own. Only names are looked up, no file is
 * opened: the walk moves nothing in the tree's eviction order. Returns 0
 * or -ENOMEM. */
static int walk_dir(struct walk *w, int dfd, struct top_entry *row, int depth)
{
	DIR *d = fdopendir(dfd);
	int rc = 0;

	if (!d) {
		walk_error(w, errno);
		close(dfd);
		return 0;
	}
	while (rc == 0) {
		errno = 0;
		struct dirent *de = readdir(d);
		if (!de) {
			if (errno)
				walk_error(w, errno);
			break;
		}
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		if (!walk_count(w))
			break;
		struct stat st;
		if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			if (errno != ENOENT) /* gone since the listing: evicted or renamed */
				walk_error(w, errno);
			continue;
		}
		if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode))
			continue; /* the tree holds nothing else */
		struct top_entry *r = depth == 0 ? walk_row(w, de->d_name) : row;
		if (!r) {
			rc = -ENOMEM;
		} else if (S_ISREG(st.st_mode)) {
			r->files++;
			r->bytes += (uint64_t)st.st_size;
		} else if (depth >= WALK_DEPTH_MAX) {
			w->cut_depth = true;
		} else {
			int sub = openat(dirfd(d), de->d_name,
					 O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			if (sub >= 0)
				rc = walk_dir(w, sub, r, depth + 1);
			else if (errno != ENOENT)
				walk_error(w, errno);
		}
		if (w->cut_entries)
			break;
	}
	closedir(d);
	return rc;
}

static void walk_free(struct walk *w)
{
	for (size_t i = 0; i < w->nrows; i++)
		free(w->rows[i].name);
	free(w->rows);
}

/* ---- the report ----------------------------------------------------------- */

static int row_cmp(const void *a, const void *b)
{
	return strcmp(((const struct top_entry *)a)->name, ((const struct top_entry *)b)->name);
}

static void print_table(FILE *f, struct walk *w)
{
	char size[32], safe[NAME_SHOWN_MAX + 8];
	uint64_t files = 0, bytes = 0;
	int width = 9;

	if (w->nrows)
		qsort(w->rows, w->nrows, sizeof(*w->rows), row_cmp);
	for (size_t i = 0; i < w->nrows; i++) {
		int len = (int)strlen(ctl_printable(w->rows[i].name, safe, sizeof(safe), NAME_SHOWN_MAX));
		width = len > width ? len : width;
	}
	fprintf(f, "%-*s  %10s  %10s\n", width, "DIRECTORY", "FILES", "BYTES");
	for (size_t i = 0; i < w->nrows; i++) {
		const struct top_entry *r = &w->rows[i];
		fprintf(f, "%-*s  %10" PRIu64 "  %10s\n", width,
			ctl_printable(r->name, safe, sizeof(safe), NAME_SHOWN_MAX), r->files,
			ctl_human_bytes(r->bytes, size, sizeof(size)));
		files += r->files;
		bytes += r->bytes;
	}
	fprintf(f, "%-*s  %10" PRIu64 "  %10s\n", width, "total", files,
		ctl_human_bytes(bytes, size, sizeof(size)));
	if (w->cut_entries)
		fprintf(f, "stopped after %u entries: the counts are a lower bound\n",
			WALK_ENTRIES_MAX);
	if (w->cut_depth)
		fprintf(f, "directories deeper than %d levels were not counted\n", WALK_DEPTH_MAX);
	if (w->unreadable)
		fprintf(f, "%" PRIu64 " entries could not be read (the first: %s)\n", w->unreadable,
			strerror(w->first_error));
}

struct metric_values {
	struct opt_u64 v[CACHE_METRIC_COUNT];
};

/* for_each_line's fn for .artfs/metrics: the cache metrics. A counter
 * named with Prometheus's "_total" suffix, as artfs's others are, counts
 * as the same metric. */
static void cache_metric_line(char *line, void *arg)
{
	struct metric_values *m = arg;
	const char *name, *version;
	uint64_t value;

	if (!info_sample_parse(line, &name, &version, &value) || version)
		return;
	for (size_t k = 0; k < CACHE_METRIC_COUNT; k++) {
		size_t n = strlen(cache_metrics[k].name);
		if (strncmp(name, cache_metrics[k].name, n) == 0 &&
		    (name[n] == '\0' || strcmp(name + n, "_total") == 0))
			m->v[k] = (struct opt_u64){ true, value };
	}
}

static void print_metrics(FILE *f, const struct metric_values *m)
{
	char buf[32];

	for (size_t k = 0; k < CACHE_METRIC_COUNT; k++) {
		const char *text = "-";
		if (m->v[k].have && cache_metrics[k].bytes) {
			text = ctl_human_bytes(m->v[k].v, buf, sizeof(buf));
		} else if (m->v[k].have) {
			snprintf(buf, sizeof(buf), "%" PRIu64, m->v[k].v);
			text = buf;
		}
		fprintf(f, "%-12s %s\n", cache_metrics[k].label, text);
	}
}

/* In the child (cache_watch): the mount's check, the walk and the
 * metrics, printed only once all is known (a child killed for silence
 * leaves no half table). Returns the exit status. */
static int cache_table(const struct ctl *ctl, int beat_fd)
{
	int rc = ctl_mount_check(ctl);
	if (rc)
		return rc;
	_cleanup_free_ char *path = ctl_path_in(ctl->mnt, CACHE_DIR);
	if (!path)
		return ctl_fail("out of memory");
	int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0 && errno == ENOENT)
		return ctl_fail("%s has no " CACHE_DIR "/ tree: its daemon predates it", ctl->mnt);
	if (fd < 0)
		return ctl_fail("%s: %s", path, strerror(errno));

	/* the metrics first: what the daemon counted, not the walk's lookups */
	struct metric_values m = { 0 };
	_cleanup_free_ char *text = NULL;
	size_t len = 0;
	int err = info_read(ctl, ".artfs/metrics", &text, &len);
	if (err == 0)
		ctl_for_each_line(text, len, cache_metric_line, &m);
	struct walk w = { .beat_fd = beat_fd };
	if (walk_dir(&w, fd, NULL, 0) < 0) {
		walk_free(&w);
		return ctl_fail("out of memory");
	}
	print_table(stdout, &w);
	putchar('\n');
	print_metrics(stdout, &m);
	walk_free(&w);
	if (fflush(stdout) != 0 || ferror(stdout))
		return ctl_fail("writing to stdout: %s", strerror(errno));
	if (err < 0)
		return ctl_fail("reading %s/.artfs/metrics: %s", ctl->mnt, strerror(-err));
	return 0;
}

/* Runs cache_table in a child, which it kills when it shows no progress
 * for wait_s seconds. Returns the exit status. */
static int cache_watch(const struct ctl *ctl, unsigned wait_s)
{
	int p[2];

	if (pipe2(p, O_CLOEXEC) < 0)
		return ctl_fail("cache: %s", strerror(errno));
	fflush(NULL);
	pid_t pid = fork();
	if (pid == 0) {
		close(p[0]);
		/* the whole table at once: fully buffered, also on a terminal */
		setvbuf(stdout, NULL, _IOFBF, 1 << 20);
		_exit(cache_table(ctl, p[1]));
	}
	close(p[1]);
	if (pid < 0) {
		close(p[0]);
		return ctl_fail("cache: %s", strerror(errno));
	}
	for (;;) {
		char buf[64];
		struct pollfd pfd = { .fd = p[0], .events = POLLIN };
		int n = poll(&pfd, 1, (int)wait_s * 1000);
		if (n < 0 && errno == EINTR)
			continue;
		if (n == 0) {
			close(p[0]);
			kill(pid, SIGKILL);
			waitpid(pid, NULL, WNOHANG); /* a request already read by a dying daemon holds it */
			return ctl_fail("%s does not answer within %u s: its daemon does not serve (the "
					"artfs log, syslog in the background, says why)", ctl->mnt, wait_s);
		}
		ssize_t r = n < 0 ? -1 : read(p[0], buf, sizeof(buf));
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break; /* the child ended (or the pipe failed: its exit status says) */
	}
	close(p[0]);
	int status = 0;
	if (waitpid(pid, &status, 0) < 0)
		return ctl_fail("cache: %s", strerror(errno));
	if (WIFEXITED(status))
		return WEXITSTATUS(status);
	return ctl_fail("cache: the walk of %s ended by signal %d", ctl->mnt, WTERMSIG(status));
}

/* ---- the command ---------------------------------------------------------- */

int cmd_cache(struct ctl *ctl, int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "mount", required_argument, NULL, 'm' },
		{ "timeout", required_argument, NULL, 't' },
		{ "shell", no_argument, NULL, 's' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	char o[64];
	int opt;
	uint64_t wait_s = CACHE_WAIT_S;
	bool shell = false, have_timeout = false;

	optind = 0;
	while ((opt = getopt_long(argc, argv, ":m:t:h", longopts, NULL)) != -1) {
		switch (opt) {
		case 'm': ctl->mnt = optarg; break;
		case 't':
			if (!ctl_parse_positive(optarg, &wait_s) || wait_s > 86400)
				return ctl_bad_usage("cache: --timeout takes seconds, 1 to 86400");
			have_timeout = true;
			break;
		case 's': shell = true; break;
		case 'h': ctl_usage(stdout); return 0;
		case ':': return ctl_bad_usage("cache: %s needs a value", ctl_bad_option(argv, o, sizeof(o)));
		default: return ctl_bad_usage("cache: unknown option %s", ctl_bad_option(argv, o, sizeof(o)));
		}
	}
	char safe[64];
	if (optind < argc && strcmp(argv[optind], "env") == 0) {
		if (optind + 1 < argc)
			return ctl_bad_usage("cache env: unexpected argument \"%s\"",
					     ctl_printable(argv[optind + 1], safe, sizeof(safe), 40));
		if (have_timeout)
			return ctl_bad_usage("cache env: --timeout is for the table (env reads nothing)");
		return cache_env(ctl, shell);
	}
	if (optind < argc)
		return ctl_bad_usage("cache: unexpected argument \"%s\"",
				     ctl_printable(argv[optind], safe, sizeof(safe), 40));
	if (shell)
		return ctl_bad_usage("cache: --shell is for \"cache env\"");
	return cache_watch(ctl, (unsigned)wait_s);
}
