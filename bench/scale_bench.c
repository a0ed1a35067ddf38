/* scale_bench: artfs over one large store, measured from the outside.
 *
 *   scale_bench [--regen] [--clean] [--starts=N] <artfs-daemon> <workdir>
 *               [objects] [versions] [big]
 *
 * The store (<workdir>/store) is written straight to disk in the daemon's
 * layout, <store>/v/<wv>/<hash> = the envelope bytes as published: version
 * "big" holds `big` objects, v001.. share the rest. Objects are small (shape
 * (1, 4, 2) |u1, kind tail) so that a million fit in /dev/shm. Names and
 * payloads come from a fixed seed, so a complete store is reused on the next
 * run (--regen forces a new one).
 *
 * Then, with artfs run as a child (`-f -o store=...,capacity=64G <mnt>`: the
 * mount's holder, which runs the daemon that serves):
 *   baseline   VmRSS of the daemon on an empty store
 *   start      fork -> the first stat of the mount answered (the holder
 *              mounts at once, its daemon answers once it has indexed),
 *              --starts times; the daemon's own "indexed ..." log line;
 *              the daemon's VmRSS; bytes per object
 *   listing    `ls <mnt>/big | wc -l` through the shell, and a readdir loop
 *   stat       10,000 distinct random objects, each stat() timed: cold (no
 *              name known to the kernel yet), then cached
 *   open+read  2,000 other random objects: open, read to EOF, close, each
 *              timed: cold (the daemon verifies the checksum) and warm;
 *              the bytes are checked against numpy.save's after timing
 *   stop       umount, the daemon's exit status
 * References, in the same run: the same work in-process on the store's tmpfs
 * (readdir + fstatat of every object; readdir of big; stat and open+read of
 * the same samples), no FUSE and no checks.
 * Every failure path unmounts (lazily) and kills the daemon. */
#include "autoconf.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "format/array.h"
#include "format/envelope.h"
#include "format/key.h"
#include "format/npy.h"
#include "lib/sha256.h"
#include "store/store.h"
#include "util.h"

#define HASH_BYTES 16
#define HASH_HEX (2 * HASH_BYTES)
#define PAYLOAD_LEN 8 /* shape (1, 4, 2) |u1 */
#define BIG_WV "big"
#define SEED 0x7363616c65000001ull
#define SAMPLE_SEED 0x73616d706c650001ull
#define STAT_SAMPLES 10000
#define READ_SAMPLES 2000
#define LIST_RUNS 3
#define MOUNT_WAIT_S 600
#define EXIT_WAIT_S 120

struct object {
	uint8_t hash[HASH_BYTES];
	uint8_t payload[PAYLOAD_LEN];
	uint32_t ver;
};

struct cfg {
	const char *daemon;
	char workdir[PATH_MAX];
	char store[PATH_MAX];
	char empty[PATH_MAX];
	char mnt[PATH_MAX];
	char marker[PATH_MAX];
	size_t objects, versions, big;
	unsigned starts;
	bool regen, clean;
	char (*wv)[16];   /* version names */
	size_t *count;    /* objects per version */
	size_t *first;    /* index of each version's first object */
	struct object *obj;
};

/* ---- the daemon, and leaving nothing behind ------------------------------------------ */

static volatile pid_t g_daemon = -1;
static char g_mnt[PATH_MAX];
static volatile sig_atomic_t g_mount_armed; /* a mount of ours may exist */
static pid_t g_main_pid;

/* Async-signal-safe: lazy unmount, kill, reap. */
static void emergency_stop(void)
{
	if (getpid() != g_main_pid)
		return;
	if (g_mount_armed)
		umount2(g_mnt, MNT_DETACH); /* umount -l */
	pid_t pid = g_daemon;
	if (pid > 0) {
		kill(pid, SIGTERM);
		for (int i = 0; i < 500; i++) { /* 5 s */
			if (waitpid(pid, NULL, WNOHANG) == pid) {
				pid = -1;
				break;
			}
			struct timespec ts = { 0, 10 * 1000 * 1000 };
			nanosleep(&ts, NULL);
		}
		if (pid > 0) {
			kill(pid, SIGKILL);
			waitpid(pid, NULL, 0);
		}
		g_daemon = -1;
	}
	if (g_mount_armed)
		umount2(g_mnt, MNT_DETACH);
	g_mount_armed = 0;
}

static void on_signal(int sig)
{
	static const char msg[] = "scale_bench: interrupted; unmounting and stopping the daemon\n";
	ssize_t w = write(2, msg, sizeof(msg) - 1);
	(void)w;
	emergency_stop();
	_exit(128 + sig);
}

/* bench_die's hook: a fatal error in the main process unmounts and stops
 * the daemon. */
static void die_cleanup(void)
{
	if (getpid() == g_main_pid && (g_daemon > 0 || g_mount_armed)) {
		fputs("scale_bench: unmounting (lazily) and stopping the daemon\n", stderr);
		emergency_stop();
	}
}

/* snprintf into a fixed buffer; a path that does not fit is fatal. */
static void fmt_path(char *buf, size_t len, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void fmt_path(char *buf, size_t len, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	int n = vsnprintf(buf, len, fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= len)
		bench_die("path too long: %s...", buf);
}

static void sleep_ms(unsigned ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

/* Unbiased enough for sampling: n is far below 2^64. */
static size_t rng_below(uint64_t *s, size_t n)
{
	return (size_t)(bench_rng_next(s) % n);
}

/* /proc/self/mounts escapes space, tab, newline and backslash as \ooo. */
static void unescape_mount(char *s)
{
	char *o = s;

	while (*s) {
		if (s[0] == '\\' && s[1] >= '0' && s[1] <= '3' && s[2] >= '0' && s[2] <= '7' &&
		    s[3] >= '0' && s[3] <= '7') {
			*o++ = (char)((s[1] - '0') * 64 + (s[2] - '0') * 8 + (s[3] - '0'));
			s += 4;
		} else
			*o++ = *s++;
	}
	*o = '\0';
}

/* Whether a fuse mount sits at path (an absolute, resolved path). */
static bool is_mounted(const char *path)
{
	FILE *f = fopen("/proc/self/mounts", "re");
	char line[4096];
	bool found = false;

	if (!f)
		bench_die("open /proc/self/mounts: %s", strerror(errno));
	while (!found && fgets(line, sizeof(line), f)) {
		char *save, *dev = strtok_r(line, " ", &save);
		char *mp = dev ? strtok_r(NULL, " ", &save) : NULL;
		char *type = mp ? strtok_r(NULL, " ", &save) : NULL;
		if (!type)
			continue;
		unescape_mount(mp);
		if (strcmp(mp, path) == 0 && strncmp(type, "fuse", 4) == 0)
			found = true;
	}
	fclose(f);
	return found;
}

static void print_log_tail(const char *log)
{
	FILE *f = fopen(log, "re");
	char line[1024];
	char ring[8][1024];
	unsigned n = 0;

	if (!f)
		return;
	while (fgets(line, sizeof(line), f))
		snprintf(ring[n++ % 8], sizeof(ring[0]), "%s", line);
	fclose(f);
	fprintf(stderr, "scale_bench: last lines of %s:\n", log);
	for (unsigned i = n > 8 ? n - 8 : 0; i < n; i++)
		fprintf(stderr, "  %s", ring[i % 8]);
}

struct daemon_run {
	pid_t pid;
	char log[PATH_MAX];
	uint64_t start_ns;   /* fork -> mount listed */
	uint64_t ready_ns;   /* fork -> first stat of the mount root answered */
	long rss_kb, hwm_kb, anon_kb;
	bool have_index;
	unsigned long long idx_objects, idx_bytes, idx_versions;
	double idx_ms;
};

static void read_status(pid_t pid, long *rss, long *hwm, long *anon)
{
	char path[64], line[256];

	snprintf(path, sizeof(path), "/proc/%ld/status", (long)pid);
	FILE *f = fopen(path, "re");
	if (!f)
		bench_die("open %s: %s", path, strerror(errno));
	*rss = *hwm = *anon = -1;
	while (fgets(line, sizeof(line), f)) {
		if (strncmp(line, "VmRSS:", 6) == 0)
			*rss = strtol(line + 6, NULL, 10);
		else if (strncmp(line, "VmHWM:", 6) == 0)
			*hwm = strtol(line + 6, NULL, 10);
		else if (strncmp(line, "RssAnon:", 8) == 0)
			*anon = strtol(line + 8, NULL, 10);
	}
	fclose(f);
	if (*rss < 0)
		bench_die("no VmRSS in %s", path);
}

/* The daemon that serves: the mount's holder (the process started) runs
 * it as its child. */
static pid_t serving(pid_t holder)
{
	char path[96];
	long child = -1;

	snprintf(path, sizeof(path), "/proc/%ld/task/%ld/children", (long)holder, (long)holder);
	for (int tries = 0; tries < 5000 && child < 0; tries++) {
		FILE *f = fopen(path, "re");
		if (f) {
			if (fscanf(f, "%ld", &child) != 1)
				child = -1;
			fclose(f);
		}
		if (child < 0)
			sleep_ms(1);
	}
	if (child < 0)
		bench_die("holder %ld runs no daemon", (long)holder);
	return (pid_t)child;
}

static void parse_index_line(struct daemon_run *d)
{
	FILE *f = fopen(d->log, "re");
	char line[2048];

	d->have_index = false;
	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		const char *p = strstr(line, "indexed ");
		if (!p)
			continue;
		/* Names are indexed before the mount; bytes are counted after it,
		 * in the background ("sized N objects, B bytes, in X ms"). */
		if (sscanf(p, "indexed %llu objects in %llu versions in %lf ms", &d->idx_objects,
			   &d->idx_versions, &d->idx_ms) == 3)
			d->have_index = true;
	}
	fclose(f);
}

/* Waits up to 60 s for the daemon's background sizing line; its ms or -1. */
static double wait_sized_line(const char *log, unsigned long long *bytes)
{
	for (int i = 0; i < 6000; i++) {
		FILE *f = fopen(log, "re");
		char line[2048];
		double ms = -1;
		unsigned long long objects;
		while (f && fgets(line, sizeof(line), f)) {
			const char *p = strstr(line, "sized ");
			if (p && sscanf(p, "sized %llu objects, %llu bytes, in %lf ms", &objects, bytes,
					&ms) == 3)
				break;
			ms = -1;
		}
		if (f)
			fclose(f);
		if (ms >= 0)
			return ms;
		usleep(10000);
	}
	return -1;
}

/* Forks the daemon on store, waits for its mount; fills start_ns, RSS and the
 * index line. */
static void daemon_start(const struct cfg *c, const char *store, const char *log,
			 struct daemon_run *d)
{
	char opts[PATH_MAX + 64];

	memset(d, 0, sizeof(*d));
	snprintf(d->log, sizeof(d->log), "%s", log);
	if ((size_t)snprintf(opts, sizeof(opts), "store=%s,capacity=64G", store) >= sizeof(opts))
		bench_die("store path too long");
	if (is_mounted(c->mnt))
		bench_die("%s is already mounted (umount it first)", c->mnt);
	int logfd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (logfd < 0)
		bench_die("open %s: %s", log, strerror(errno));
	fflush(stdout);
	fflush(stderr);

	uint64_t t0 = bench_now_ns();
	pid_t pid = fork();
	if (pid < 0)
		bench_die("fork: %s", strerror(errno));
	if (pid == 0) {
		/* The daemon goes down with us, whatever kills us. */
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		if (getppid() != g_main_pid)
			_exit(127);
		int nullfd = open("/dev/null", O_RDONLY);
		if (nullfd >= 0)
			dup2(nullfd, 0);
		dup2(logfd, 1);
		dup2(logfd, 2);
		char *argv[] = { (char *)c->daemon, "-f", "-o", opts, (char *)c->mnt, NULL };
		execv(c->daemon, argv);
		dprintf(2, "scale_bench: exec %s: %s\n", c->daemon, strerror(errno));
		_exit(127);
	}
	g_daemon = pid;
	g_mount_armed = 1;
	d->pid = pid;
	close(logfd);

	for (;;) {
		if (is_mounted(c->mnt))
			break;
		int status;
		if (waitpid(pid, &status, WNOHANG) == pid) {
			g_daemon = -1;
			print_log_tail(log);
			bench_die("the daemon exited before mounting (status %d)",
				  WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
		}
		if (bench_now_ns() - t0 > (uint64_t)MOUNT_WAIT_S * 1000000000ull)
			bench_die("no mount at %s after %d s", c->mnt, MOUNT_WAIT_S);
		sleep_ms(1);
	}
	d->start_ns = bench_now_ns() - t0;
	struct stat st;
	if (stat(c->mnt, &st) < 0)
		bench_die("stat %s: %s", c->mnt, strerror(errno));
	d->ready_ns = bench_now_ns() - t0;
	read_status(serving(pid), &d->rss_kb, &d->hwm_kb, &d->anon_kb);
	parse_index_line(d);
}

/* umount (the command), then the daemon's exit; returns its exit status and
 * the time from umount to exit. */
static int daemon_stop(const struct cfg *c, struct daemon_run *d, uint64_t *exit_ns)
{
	int status;
	uint64_t t0 = bench_now_ns();
	pid_t u = fork();

	if (u < 0)
		bench_die("fork: %s", strerror(errno));
	if (u == 0) {
		char *argv[] = { "umount", (char *)c->mnt, NULL };
		execvp("umount", argv);
		_exit(127);
	}
	if (waitpid(u, &status, 0) != u || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
		bench_die("umount %s failed (status %d)", c->mnt, status);
	g_mount_armed = 0;
	for (;;) {
		pid_t w = waitpid(d->pid, &status, WNOHANG);
		if (w == d->pid)
			break;
		if (w < 0)
			bench_die("waitpid daemon: %s", strerror(errno));
		if (bench_now_ns() - t0 > (uint64_t)EXIT_WAIT_S * 1000000000ull)
			bench_die("the daemon did not exit %d s after umount", EXIT_WAIT_S);
		sleep_ms(1);
	}
	*exit_ns = bench_now_ns() - t0;
	g_daemon = -1;
	if (WIFEXITED(status))
		return WEXITSTATUS(status);
	return 128 + WTERMSIG(status);
}

/* ---- the store ------------------------------------------------------------------- */

/* Deletes path and everything under it (no links followed). */
static void remove_tree_at(int parent, const char *name)
{
	int fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

	if (fd < 0) {
		if (errno == ENOENT)
			return;
		if (errno == ENOTDIR || errno == ELOOP) {
			if (unlinkat(parent, name, 0) < 0 && errno != ENOENT)
				bench_die("unlink %s: %s", name, strerror(errno));
			return;
		}
		bench_die("open %s: %s", name, strerror(errno));
	}
	DIR *d = fdopendir(fd);
	if (!d)
		bench_die("fdopendir %s: %s", name, strerror(errno));
	struct dirent *e;
	while ((errno = 0, e = readdir(d)) != NULL) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		if (e->d_type == DT_DIR)
			remove_tree_at(dirfd(d), e->d_name);
		else if (unlinkat(dirfd(d), e->d_name, 0) < 0 && errno != ENOENT)
			bench_die("unlink %s/%s: %s", name, e->d_name, strerror(errno));
	}
	if (errno)
		bench_die("readdir %s: %s", name, strerror(errno));
	closedir(d);
	if (unlinkat(parent, name, AT_REMOVEDIR) < 0 && errno != ENOENT)
		bench_die("rmdir %s: %s", name, strerror(errno));
}

static void remove_tree(const char *path)
{
	remove_tree_at(AT_FDCWD, path);
}

/* Names, payloads and the layout: deterministic from the seed, so the same
 * for the store written now and for one written by an earlier run. Each
 * version has its own stream, so workers need not share one. */
static void plan(struct cfg *c)
{
	size_t rest = c->objects - c->big, others = c->versions - 1;

	c->wv = bench_xmalloc(c->versions * sizeof(*c->wv));
	c->count = bench_xmalloc(c->versions * sizeof(*c->count));
	c->first = bench_xmalloc(c->versions * sizeof(*c->first));
	c->obj = bench_xmalloc(c->objects * sizeof(*c->obj));
	snprintf(c->wv[0], sizeof(c->wv[0]), "%s", BIG_WV);
	c->count[0] = c->big;
	for (size_t v = 1; v < c->versions; v++) {
		snprintf(c->wv[v], sizeof(c->wv[v]), "v%03u", (unsigned)v);
		c->count[v] = rest / others + (v - 1 < rest % others ? 1 : 0);
	}
	size_t at = 0;
	for (size_t v = 0; v < c->versions; v++) {
		uint64_t rng = SEED ^ ((uint64_t)v * 0x100000001b3ull);
		c->first[v] = at;
		for (size_t i = 0; i < c->count[v]; i++, at++) {
			struct object *o = &c->obj[at];
			bench_rng_fill(&rng, o->hash, HASH_BYTES);
			bench_rng_fill(&rng, o->payload, PAYLOAD_LEN);
			o->ver = (uint32_t)v;
		}
	}
}

/* Writes the objects of every version v with v % nworkers == worker. */
static void generate_part(const struct cfg *c, int versions_fd, unsigned worker,
			  unsigned nworkers)
{
	struct envelope env;
	char hex[HASH_HEX + 1];

	memset(&env, 0, sizeof(env));
	bench_u1_array(&env.array, 1, 4, 2);
	env.kind = ENVELOPE_TAIL;
	env.source_token_start = 0;
	for (size_t v = worker; v < c->versions; v += nworkers) {
		if (mkdirat(versions_fd, c->wv[v], 0700) < 0)
			bench_die("mkdir %s/v/%s: %s", c->store, c->wv[v], strerror(errno));
		int dfd = openat(versions_fd, c->wv[v], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (dfd < 0)
			bench_die("open %s/v/%s: %s", c->store, c->wv[v], strerror(errno));
		for (size_t i = 0; i < c->count[v]; i++) {
			const struct object *o = &c->obj[c->first[v] + i];
			uint8_t *buf;
			size_t len;
			key_derive(c->wv[v], o->hash, HASH_BYTES, env.key);
			sha256_once(o->payload, PAYLOAD_LEN, env.payload_sha256);
			int rc = envelope_encode(&env, o->payload, PAYLOAD_LEN, &buf, &len);
			if (rc < 0)
				bench_die("envelope_encode: %s", strerror(-rc));
			key_hex(o->hash, HASH_BYTES, hex);
			int fd = openat(dfd, hex, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0400);
			if (fd < 0)
				bench_die("create %s/v/%s/%s: %s", c->store, c->wv[v], hex,
					  strerror(errno));
			rc = bench_write_all(fd, buf, len);
			if (rc < 0)
				bench_die("write %s/v/%s/%s: %s", c->store, c->wv[v], hex,
					  strerror(-rc));
			/* As a commit leaves it: the .npy size in the file's mtime. */
			uint64_t npy;
			if (npy_file_size(&env.array, &npy) == 0)
				store_mark_npy_size(fd, npy);
			if (close(fd) < 0)
				bench_die("close %s/v/%s/%s: %s", c->store, c->wv[v], hex,
					  strerror(errno));
			free(buf);
		}
		close(dfd);
	}
}

static void marker_text(const struct cfg *c, char *buf, size_t len)
{
	snprintf(buf, len, "scale_bench store: objects=%zu versions=%zu big=%zu seed=%016" PRIx64
		 " shape=1,4,2\n", c->objects, c->versions, c->big, (uint64_t)SEED);
}

/* Entries of a directory that are not dot-names; -1 if it cannot be read. */
static long count_dir(const char *path)
{
	DIR *d = opendir(path);
	struct dirent *e;
	long n = 0;

	if (!d)
		return -1;
	while ((e = readdir(d)) != NULL)
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n;
}

/* A store from an earlier run with the same parameters, complete. */
static bool store_complete(const struct cfg *c)
{
	char want[256], have[256] = "";
	char path[PATH_MAX + 32];
	FILE *f = fopen(c->marker, "re");

	if (!f)
		return false;
	bool ok = fgets(have, sizeof(have), f) != NULL;
	fclose(f);
	marker_text(c, want, sizeof(want));
	if (!ok || strcmp(have, want) != 0)
		return false;
	snprintf(path, sizeof(path), "%s/v", c->store);
	if (count_dir(path) != (long)c->versions)
		return false;
	for (size_t v = 0; v < c->versions; v++) {
		snprintf(path, sizeof(path), "%s/v/%s", c->store, c->wv[v]);
		if (count_dir(path) != (long)c->count[v])
			return false;
	}
	/* Spot check: the first and last objects by name. */
	char hex[HASH_HEX + 1];
	struct stat st;
	size_t probe[2] = { 0, c->objects - 1 };
	for (int i = 0; i < 2; i++) {
		const struct object *o = &c->obj[probe[i]];
		key_hex(o->hash, HASH_BYTES, hex);
		fmt_path(path, sizeof(path), "%s/v/%s/%s", c->store, c->wv[o->ver], hex);
		if (stat(path, &st) < 0)
			return false;
	}
	return true;
}

static void prepare_store(struct cfg *c)
{
	if (!c->regen && store_complete(c)) {
		printf("store %s: reusing it (%zu objects in %zu versions, complete)\n", c->store,
		       c->objects, c->versions);
		return;
	}
	unlink(c->marker);
	uint64_t t0 = bench_now_ns();
	remove_tree(c->store);
	uint64_t t1 = bench_now_ns();
	if (mkdir(c->store, 0700) < 0)
		bench_die("mkdir %s: %s", c->store, strerror(errno));
	char vpath[PATH_MAX + 4];
	snprintf(vpath, sizeof(vpath), "%s/v", c->store);
	if (mkdir(vpath, 0700) < 0)
		bench_die("mkdir %s: %s", vpath, strerror(errno));
	int vfd = open(vpath, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (vfd < 0)
		bench_die("open %s: %s", vpath, strerror(errno));

	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	unsigned nworkers = cpus > 1 ? (unsigned)(cpus > 8 ? 8 : cpus) : 1;
	if (nworkers > c->versions)
		nworkers = (unsigned)c->versions;
	pid_t pids[8];
	fflush(stdout);
	for (unsigned w = 0; w < nworkers; w++) {
		pids[w] = fork();
		if (pids[w] < 0)
			bench_die("fork: %s", strerror(errno));
		if (pids[w] == 0) {
			generate_part(c, vfd, w, nworkers);
			_exit(0);
		}
	}
	bool failed = false;
	for (unsigned w = 0; w < nworkers; w++) {
		int status;
		if (waitpid(pids[w], &status, 0) != pids[w] || !WIFEXITED(status) ||
		    WEXITSTATUS(status) != 0)
			failed = true;
	}
	close(vfd);
	if (failed)
		bench_die("generating the store failed (see above)");
	uint64_t t2 = bench_now_ns();
	FILE *f = fopen(c->marker, "we");
	char text[256];
	marker_text(c, text, sizeof(text));
	if (!f || fputs(text, f) < 0 || fclose(f) != 0)
		bench_die("write %s: %s", c->marker, strerror(errno));
	printf("store %s: generated %zu objects in %zu versions in %.1f s with %u processes "
	       "(removing the old one: %.1f s; setup, not a result)\n",
	       c->store, c->objects, c->versions, (double)(t2 - t1) / 1e9, nworkers,
	       (double)(t1 - t0) / 1e9);
}

/* ---- measurements ----------------------------------------------------------------- */

static int cmp_u64(const void *x, const void *y)
{
	uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
	return (a > b) - (a < b);
}

/* Nearest-rank percentile of a sorted array. */
static double pct_us(const uint64_t *sorted, size_t n, double p)
{
	size_t rank = (size_t)(p / 100.0 * (double)n + 0.999999999);
	if (rank < 1)
		rank = 1;
	if (rank > n)
		rank = n;
	return (double)sorted[rank - 1] / 1e3;
}

struct lat {
	double p50, p90, p99, max, mean;
};

static struct lat summarize(uint64_t *ns, size_t n)
{
	struct lat l;
	double sum = 0;

	qsort(ns, n, sizeof(*ns), cmp_u64);
	for (size_t i = 0; i < n; i++)
		sum += (double)ns[i];
	l.p50 = pct_us(ns, n, 50);
	l.p90 = pct_us(ns, n, 90);
	l.p99 = pct_us(ns, n, 99);
	l.max = (double)ns[n - 1] / 1e3;
	l.mean = sum / (double)n / 1e3;
	return l;
}

static void object_path(const struct cfg *c, size_t idx, char *buf, size_t len)
{
	char hex[HASH_HEX + 1];
	const struct object *o = &c->obj[idx];

	key_hex(o->hash, HASH_BYTES, hex);
	snprintf(buf, len, "%s/%s/%s", c->mnt, c->wv[o->ver], hex);
}

struct results {
	double start_s[16], ready_s[16], exit_s[16];
	long rss_full_kb[16];
	unsigned starts;
	long rss_empty_kb, hwm_empty_kb, anon_empty_kb;
	long rss_end_kb, hwm_end_kb;
	double start_med_s, index_ms_med, bytes_per_obj;
	double ls_s[LIST_RUNS], raw_ls_s[LIST_RUNS];
	double readdir_s[LIST_RUNS], raw_readdir_s[LIST_RUNS];
	double raw_scan_s, raw_scan_stat_s; /* the store's tmpfs, in-process */
	struct lat stat_cold, stat_cached, read_cold, read_warm;
	struct lat raw_stat, raw_read;      /* the same objects on tmpfs directly */
	size_t stat_n, read_n;
	int exit_status;
};

/* The object's file in the store, for the tmpfs references. */
static void store_path(const struct cfg *c, size_t idx, char *buf, size_t len)
{
	char hex[HASH_HEX + 1];
	const struct object *o = &c->obj[idx];

	key_hex(o->hash, HASH_BYTES, hex);
	fmt_path(buf, len, "%s/v/%s/%s", c->store, c->wv[o->ver], hex);
}

/* Reference for the start: what indexing costs the kernel alone, in-process:
 * readdir of every version, then readdir plus fstatat of every object (the
 * daemon's scan does both, and more). */
static void raw_scan(const struct cfg *c, struct results *res)
{
	char path[PATH_MAX + 32];

	for (int withstat = 0; withstat < 2; withstat++) {
		size_t n = 0;
		uint64_t t0 = bench_now_ns();
		for (size_t v = 0; v < c->versions; v++) {
			fmt_path(path, sizeof(path), "%s/v/%s", c->store, c->wv[v]);
			DIR *d = opendir(path);
			struct dirent *e;
			struct stat st;
			if (!d)
				bench_die("opendir %s: %s", path, strerror(errno));
			while ((e = readdir(d)) != NULL) {
				if (e->d_name[0] == '.')
					continue;
				if (withstat && fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
					bench_die("fstatat %s/%s: %s", path, e->d_name,
						  strerror(errno));
				n++;
			}
			closedir(d);
		}
		double t = (double)(bench_now_ns() - t0) / 1e9;
		if (n != c->objects)
			bench_die("the store holds %zu objects, expected %zu", n, c->objects);
		if (withstat)
			res->raw_scan_stat_s = t;
		else
			res->raw_scan_s = t;
	}
	printf("\nreference, in-process on the store's tmpfs: readdir of all %zu objects %.3f s; "
	       "readdir + fstatat of each %.3f s\n", c->objects, res->raw_scan_s,
	       res->raw_scan_stat_s);
}

static double median_u64(uint64_t *v, size_t n)
{
	qsort(v, n, sizeof(*v), cmp_u64);
	return n % 2 ? (double)v[n / 2] : ((double)v[n / 2 - 1] + (double)v[n / 2]) / 2;
}

/* Single-quoted for sh. */
static char *shell_quote(const char *s)
{
	size_t n = 3;
	for (const char *p = s; *p; p++)
		n += *p == '\'' ? 4 : 1;
	char *q = bench_xmalloc(n), *o = q;
	*o++ = '\'';
	for (const char *p = s; *p; p++) {
		if (*p == '\'') {
			memcpy(o, "'\\''", 4);
			o += 4;
		} else
			*o++ = *p;
	}
	*o++ = '\'';
	*o = '\0';
	return q;
}


/* `ls <dir> | wc -l` through the shell, timed; the count must be want. */
static double time_ls(const char *dir, size_t want, int run)
{
	char *q = shell_quote(dir);
	size_t cmdlen = strlen(q) + 32;
	char *cmd = bench_xmalloc(cmdlen);
	char out[64] = "";

	snprintf(cmd, cmdlen, "ls %s | wc -l", q);
	fflush(stdout);
	uint64_t t0 = bench_now_ns();
	FILE *p = popen(cmd, "r");
	if (!p)
		bench_die("popen %s: %s", cmd, strerror(errno));
	bool got = fgets(out, sizeof(out), p) != NULL;
	int st = pclose(p);
	uint64_t t = bench_now_ns() - t0;
	if (!got || st != 0)
		bench_die("`%s` failed (status %d)", cmd, st);
	unsigned long long n = strtoull(out, NULL, 10);
	if (n != want)
		bench_die("`%s` counted %llu, expected %zu", cmd, n, want);
	printf("  run %d: `%s` = %llu in %.3f s\n", run, cmd, n, (double)t / 1e9);
	free(cmd);
	free(q);
	return (double)t / 1e9;
}

/* An opendir/readdir loop, timed; the count must be want. */
static double time_readdir(const char *dir, size_t want, int run, const char *what)
{
	uint64_t t0 = bench_now_ns();
	long n = count_dir(dir);
	uint64_t t = bench_now_ns() - t0;

	if (n != (long)want)
		bench_die("readdir %s: %ld entries, expected %zu", dir, n, want);
	printf("  run %d: %s %s = %ld in %.3f s\n", run, what, dir, n, (double)t / 1e9);
	return (double)t / 1e9;
}

static void run_listing(const struct cfg *c, struct results *res)
{
	char dir[PATH_MAX + 32], raw[PATH_MAX + 32];

	fmt_path(dir, sizeof(dir), "%s/%s", c->mnt, BIG_WV);
	fmt_path(raw, sizeof(raw), "%s/v/%s", c->store, BIG_WV);
	printf("\nlisting %s (%zu objects); reference: the same on the store's tmpfs\n", dir,
	       c->big);
	for (int r = 0; r < LIST_RUNS; r++)
		res->ls_s[r] = time_ls(dir, c->big, r + 1);
	for (int r = 0; r < LIST_RUNS; r++)
		res->raw_ls_s[r] = time_ls(raw, c->big, r + 1);
	for (int r = 0; r < LIST_RUNS; r++)
		res->readdir_s[r] = time_readdir(dir, c->big, r + 1, "opendir/readdir loop");
	for (int r = 0; r < LIST_RUNS; r++)
		res->raw_readdir_s[r] = time_readdir(raw, c->big, r + 1, "opendir/readdir loop");
}

static void print_lat(const char *what, const struct lat *l, size_t n)
{
	printf("  %-26s n=%-6zu p50 %8.1f  p90 %8.1f  p99 %8.1f  max %9.1f  mean %8.1f us\n",
	       what, n, l->p50, l->p90, l->p99, l->max, l->mean);
}

/* stat(path), timed; dies if it fails. */
static uint64_t timed_stat(const char *path, struct stat *st)
{
	uint64_t t0 = bench_now_ns();
	int rc = stat(path, st);
	uint64_t t = bench_now_ns() - t0;

	if (rc < 0)
		bench_die("stat %s: %s", path, strerror(errno));
	return t;
}

static void run_stats(const struct cfg *c, const size_t *sample, size_t n, struct results *res)
{
	char path[PATH_MAX + 64];
	struct stat st;
	uint64_t *ns = bench_xmalloc(n * sizeof(*ns));

	/* The version directories first, so that the cold pass looks up objects
	 * and not their parents. */
	for (size_t v = 0; v < c->versions; v++) {
		snprintf(path, sizeof(path), "%s/%s", c->mnt, c->wv[v]);
		if (stat(path, &st) < 0)
			bench_die("stat %s: %s", path, strerror(errno));
	}
	printf("\nstat() of %zu distinct random objects across all versions\n", n);
	for (int pass = 0; pass < 2; pass++) {
		for (size_t i = 0; i < n; i++) {
			object_path(c, sample[i], path, sizeof(path));
			ns[i] = timed_stat(path, &st);
			if (!S_ISREG(st.st_mode) || st.st_size <= PAYLOAD_LEN)
				bench_die("stat %s: not a regular file of the expected size", path);
		}
		struct lat l = summarize(ns, n);
		if (pass == 0)
			res->stat_cold = l;
		else
			res->stat_cached = l;
		print_lat(pass == 0 ? "cold (first lookup)" : "cached (second stat)", &l, n);
	}
	/* Reference: the same files on the store's tmpfs, no FUSE. */
	for (size_t i = 0; i < n; i++) {
		store_path(c, sample[i], path, sizeof(path));
		ns[i] = timed_stat(path, &st);
	}
	res->raw_stat = summarize(ns, n);
	print_lat("reference: tmpfs", &res->raw_stat, n);
	res->stat_n = n;
	free(ns);
}

/* open, read until EOF or cap bytes, close: the time that takes; the bytes
 * read in *len. */
static uint64_t timed_read(const char *path, uint8_t *buf, size_t cap, size_t *len)
{
	uint64_t t0 = bench_now_ns();
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		bench_die("open %s: %s", path, strerror(errno));
	int rc = bench_read_all(fd, buf, cap, false, len);
	if (rc < 0)
		bench_die("read %s: %s", path, strerror(-rc));
	close(fd);
	return bench_now_ns() - t0;
}

static void run_reads(const struct cfg *c, const size_t *sample, size_t n, struct results *res)
{
	char path[PATH_MAX + 64];
	uint8_t want[NPY_HEADER_MAX + PAYLOAD_LEN];
	struct array_desc a;
	const size_t slot = 512;
	uint8_t *slots = bench_xmalloc(n * slot);
	size_t *got = bench_xmalloc(n * sizeof(*got));
	uint64_t *ns = bench_xmalloc(n * sizeof(*ns));

	bench_u1_array(&a, 1, 4, 2);
	ssize_t hl = npy_header(&a, want, sizeof(want));
	if (hl < 0)
		bench_die("npy_header: %s", strerror((int)-hl));
	size_t want_len = (size_t)hl + PAYLOAD_LEN;
	memset(slots, 0, n * slot);

	printf("\nopen + read to EOF + close of %zu other distinct random objects\n", n);
	for (int pass = 0; pass < 2; pass++) {
		for (size_t i = 0; i < n; i++) {
			object_path(c, sample[i], path, sizeof(path));
			ns[i] = timed_read(path, slots + i * slot, slot, &got[i]);
		}
		/* After the clock: every file is numpy.save of its payload. */
		for (size_t i = 0; i < n; i++) {
			const struct object *o = &c->obj[sample[i]];
			const uint8_t *buf = slots + i * slot;
			memcpy(want + hl, o->payload, PAYLOAD_LEN);
			if (got[i] != want_len || memcmp(buf, want, want_len) != 0) {
				object_path(c, sample[i], path, sizeof(path));
				bench_die("%s: %zu bytes read, not the expected %zu-byte .npy",
					  path, got[i], want_len);
			}
		}
		memset(slots, 0, n * slot);
		struct lat l = summarize(ns, n);
		if (pass == 0)
			res->read_cold = l;
		else
			res->read_warm = l;
		print_lat(pass == 0 ? "cold (verifies sha256)" : "warm (page cache)", &l, n);
	}
	/* Reference: the envelope files on the store's tmpfs, no FUSE, no checks. */
	for (size_t i = 0; i < n; i++) {
		size_t off;
		store_path(c, sample[i], path, sizeof(path));
		ns[i] = timed_read(path, slots + i * slot, slot, &off);
		if (off <= PAYLOAD_LEN)
			bench_die("%s: %zu bytes", path, off);
	}
	res->raw_read = summarize(ns, n);
	print_lat("reference: tmpfs envelope", &res->raw_read, n);
	res->read_n = n;
	free(ns);
	free(got);
	free(slots);
}

static void summary(const struct cfg *c, const struct results *r)
{
	char m[64], ref[64];
	double ls_med[LIST_RUNS], rd_med[LIST_RUNS], raw_rd_med[LIST_RUNS], raw_ls_med[LIST_RUNS];

	memcpy(ls_med, r->ls_s, sizeof(ls_med));
	memcpy(rd_med, r->readdir_s, sizeof(rd_med));
	memcpy(raw_rd_med, r->raw_readdir_s, sizeof(raw_rd_med));
	memcpy(raw_ls_med, r->raw_ls_s, sizeof(raw_ls_med));
	printf("\nsummary: %zu objects in %zu versions (big: %zu), daemon %s, %u start%s\n",
	       c->objects, c->versions, c->big, c->daemon, r->starts, r->starts == 1 ? "" : "s");
	printf("(reference: the same work in-process on the store's tmpfs, no FUSE, no checks)\n");
	printf("%-40s %-20s %-26s %s\n", "measure", "measured", "reference", "goal");
#define ROW(name, goal, reftext, ...)                                                      \
	do {                                                                               \
		snprintf(m, sizeof(m), __VA_ARGS__);                                       \
		printf("%-40s %-20s %-26s %s\n", name, m, reftext, goal);                  \
	} while (0)
	snprintf(ref, sizeof(ref), "%.3f s readdir+fstatat", r->raw_scan_stat_s);
	ROW("start: fork -> first answer (median)", "<= 2 s", ref, "%.3f s", r->start_med_s);
	ROW("start: daemon's own index time (median)", "-", "", "%.0f ms", r->index_ms_med);
	ROW("daemon memory per object", "<= 256 B", "", "%.1f B", r->bytes_per_obj);
	ROW("  VmRSS empty / full store", "-", "", "%.1f / %.1f MiB",
	    (double)r->rss_empty_kb / 1024, (double)r->rss_full_kb[r->starts - 1] / 1024);
	snprintf(ref, sizeof(ref), "%.1f us", r->raw_stat.p99);
	ROW("stat p99, cold (first lookup)", "<= 50 us", ref, "%.1f us", r->stat_cold.p99);
	ROW("stat p99, cached", "<= 50 us", ref, "%.1f us", r->stat_cached.p99);
	snprintf(ref, sizeof(ref), "%.1f us", r->raw_stat.p50);
	ROW("stat p50, cold / cached", "-", ref, "%.1f / %.1f us", r->stat_cold.p50,
	    r->stat_cached.p50);
	snprintf(ref, sizeof(ref), "%.3f s", bench_median(raw_ls_med, LIST_RUNS));
	ROW("ls big | wc -l (median of 3)", "-", ref, "%.3f s", bench_median(ls_med, LIST_RUNS));
	snprintf(ref, sizeof(ref), "%.3f s", bench_median(raw_rd_med, LIST_RUNS));
	ROW("readdir loop over big (median of 3)", "-", ref, "%.3f s",
	    bench_median(rd_med, LIST_RUNS));
	if (r->read_n) {
		snprintf(ref, sizeof(ref), "%.1f / %.1f us", r->raw_read.p50, r->raw_read.p99);
		ROW("open+read+close p50 / p99, cold", "-", ref, "%.1f / %.1f us",
		    r->read_cold.p50, r->read_cold.p99);
		ROW("open+read+close p50 / p99, warm", "-", ref, "%.1f / %.1f us",
		    r->read_warm.p50, r->read_warm.p99);
	}
	ROW("daemon exit status after umount", "0", "", "%d", r->exit_status);
#undef ROW
}

/* ---- main ---------------------------------------------------------------------------- */

static void usage(void)
{
	fprintf(stderr,
		"usage: scale_bench [--regen] [--clean] [--starts=N] <artfs-daemon> <workdir> "
		"[objects] [versions] [big]\n"
		"  artfs-daemon  the daemon binary (e.g. ./artfs)\n"
		"  workdir       holds store/, empty-store/, mnt/ and the daemon logs; put it on\n"
		"                tmpfs, e.g. /dev/shm/scale (1M objects take ~4.5 GB there)\n"
		"  objects       objects in the store (default 1000000)\n"
		"  versions      weight versions (default 100): \"big\" and v001...\n"
		"  big           objects in version \"big\" (default 100000)\n"
		"  --regen       write a new store even if a complete one is there\n"
		"  --clean       remove workdir's store, logs and mountpoint at the end\n"
		"  --starts=N    daemon starts on the full store to time (default 3)\n");
	exit(2);
}

int main(int argc, char **argv)
{
	struct cfg c;
	struct results res;
	const char *pos[5];
	int npos = 0;
	unsigned long v;
	char path[PATH_MAX];

	bench_progname = "scale_bench";
	bench_die_hook = die_cleanup;
	g_main_pid = getpid();
	memset(&c, 0, sizeof(c));
	memset(&res, 0, sizeof(res));
	c.objects = 1000000;
	c.versions = 100;
	c.big = 100000;
	c.starts = 3;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--regen") == 0)
			c.regen = true;
		else if (strcmp(argv[i], "--clean") == 0)
			c.clean = true;
		else if (strncmp(argv[i], "--starts=", 9) == 0) {
			if (!bench_parse_count(argv[i] + 9, 16, &v))
				usage();
			c.starts = (unsigned)v;
		} else if (argv[i][0] == '-' && argv[i][1])
			usage();
		else if (npos < 5)
			pos[npos++] = argv[i];
		else
			usage();
	}
	if (npos < 2)
		usage();
	if (npos > 2) {
		if (!bench_parse_count(pos[2], 100000000, &v))
			usage();
		c.objects = v;
	}
	if (npos > 3) {
		if (!bench_parse_count(pos[3], 100000, &v))
			usage();
		c.versions = v;
	}
	if (npos > 4) {
		if (!bench_parse_count(pos[4], 100000000, &v))
			usage();
		c.big = v;
	}
	if (c.big > c.objects || (c.versions == 1 && c.big != c.objects) ||
	    (c.versions > 1 && c.objects - c.big < c.versions - 1))
		bench_die("%zu objects cannot be %zu in \"big\" and at least one in each of the "
			  "other %zu versions", c.objects, c.big, c.versions - 1);
	if (access(pos[0], X_OK) < 0)
		bench_die("%s: not an executable: %s", pos[0], strerror(errno));
	c.daemon = realpath(pos[0], NULL);
	if (!c.daemon)
		bench_die("realpath %s: %s", pos[0], strerror(errno));
	if (mkdir(pos[1], 0755) < 0 && errno != EEXIST)
		bench_die("mkdir %s: %s", pos[1], strerror(errno));
	if (!realpath(pos[1], c.workdir))
		bench_die("realpath %s: %s", pos[1], strerror(errno));
	if ((size_t)snprintf(c.store, sizeof(c.store), "%s/store", c.workdir) >= sizeof(c.store) ||
	    (size_t)snprintf(c.empty, sizeof(c.empty), "%s/empty-store", c.workdir) >=
		    sizeof(c.empty) ||
	    (size_t)snprintf(c.mnt, sizeof(c.mnt), "%s/mnt", c.workdir) >= sizeof(c.mnt) ||
	    (size_t)snprintf(c.marker, sizeof(c.marker), "%s/store.complete", c.workdir) >=
		    sizeof(c.marker))
		bench_die("workdir path too long");
	snprintf(g_mnt, sizeof(g_mnt), "%s", c.mnt);
	if (mkdir(c.mnt, 0755) < 0 && errno != EEXIST)
		bench_die("mkdir %s: %s", c.mnt, strerror(errno));
	if (is_mounted(c.mnt))
		bench_die("%s is already mounted (umount it first)", c.mnt);

	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);

	printf("scale_bench: %zu objects in %zu versions (\"big\": %zu), workdir %s\n", c.objects,
	       c.versions, c.big, c.workdir);
	plan(&c);
	prepare_store(&c);
	raw_scan(&c, &res);

	/* b) the baseline: an empty store. */
	struct daemon_run d;
	uint64_t exit_ns;
	remove_tree(c.empty);
	fmt_path(path, sizeof(path), "%s/daemon-empty.log", c.workdir);
	daemon_start(&c, c.empty, path, &d);
	res.rss_empty_kb = d.rss_kb;
	res.hwm_empty_kb = d.hwm_kb;
	res.anon_empty_kb = d.anon_kb;
	int st = daemon_stop(&c, &d, &exit_ns);
	printf("\nempty store: mounted in %.3f s; VmRSS %ld kB, VmHWM %ld kB, RssAnon %ld kB; "
	       "exit status %d\n", (double)d.start_ns / 1e9, d.rss_kb, d.hwm_kb, d.anon_kb, st);
	if (st != 0)
		bench_die("the daemon on the empty store exited with status %d (log: %s)", st,
			  path);

	/* c) starts on the full store; the last one stays up for the rest. */
	fmt_path(path, sizeof(path), "%s/daemon-full.log", c.workdir);
	printf("\nfull store: %u start%s (fork -> mount listed in /proc/self/mounts)\n", c.starts,
	       c.starts == 1 ? "" : "s");
	double idx_ms[16];
	uint64_t start_ns[16];
	for (unsigned s = 0; s < c.starts; s++) {
		daemon_start(&c, c.store, path, &d);
		if (!d.have_index) {
			print_log_tail(path);
			bench_die("no \"indexed N objects ...\" line in %s", path);
		}
		res.start_s[s] = (double)d.start_ns / 1e9;
		res.ready_s[s] = (double)d.ready_ns / 1e9;
		res.rss_full_kb[s] = d.rss_kb;
		start_ns[s] = d.ready_ns; /* the holder mounts at once; its daemon answers later */
		idx_ms[s] = d.idx_ms;
		double sized_ms = wait_sized_line(path, &d.idx_bytes);
		printf("  start %u: mount %.3f s, first stat answered %.3f s; daemon log: indexed "
		       "%llu objects in %llu versions in %.0f ms, then sized %llu bytes in the "
		       "background in %.0f ms (publishes wait for it); VmRSS %ld kB, VmHWM "
		       "%ld kB, RssAnon %ld kB\n", s + 1, res.start_s[s], res.ready_s[s],
		       d.idx_objects, d.idx_versions, d.idx_ms, d.idx_bytes, sized_ms, d.rss_kb,
		       d.hwm_kb, d.anon_kb);
		if (d.idx_objects != c.objects || d.idx_versions != c.versions)
			printf("  NOTE: the daemon indexed %llu objects in %llu versions; the store "
			       "has %zu in %zu\n", d.idx_objects, d.idx_versions, c.objects,
			       c.versions);
		if (s + 1 < c.starts) {
			st = daemon_stop(&c, &d, &exit_ns);
			printf("          umount -> daemon exit %.3f s, status %d\n",
			       (double)exit_ns / 1e9, st);
			if (st != 0)
				bench_die("the daemon exited with status %d (log: %s)", st, path);
		}
	}
	res.starts = c.starts;
	res.start_med_s = median_u64(start_ns, c.starts) / 1e9;
	res.index_ms_med = bench_median(idx_ms, c.starts);
	double rss_med = 0;
	{
		double r[16];
		for (unsigned s = 0; s < c.starts; s++)
			r[s] = (double)res.rss_full_kb[s];
		rss_med = bench_median(r, c.starts);
	}
	res.bytes_per_obj = (rss_med - (double)res.rss_empty_kb) * 1024.0 / (double)c.objects;
	printf("  median start %.3f s; median VmRSS %.0f kB; (VmRSS full - VmRSS empty) / objects "
	       "= %.1f bytes per object\n", res.start_med_s, rss_med, res.bytes_per_obj);

	/* d) listing the big version. */
	run_listing(&c, &res);

	/* e), f) distinct random objects: the stat sample, then the read sample. */
	res.stat_n = c.objects < STAT_SAMPLES ? c.objects : STAT_SAMPLES;
	res.read_n = c.objects - res.stat_n < READ_SAMPLES ? c.objects - res.stat_n : READ_SAMPLES;
	size_t want = res.stat_n + res.read_n;
	uint32_t *perm = bench_xmalloc(c.objects * sizeof(*perm));
	size_t *sample = bench_xmalloc(want * sizeof(*sample));
	uint64_t srng = SAMPLE_SEED;
	for (size_t i = 0; i < c.objects; i++)
		perm[i] = (uint32_t)i;
	for (size_t i = 0; i < want; i++) { /* partial Fisher-Yates */
		size_t j = i + rng_below(&srng, c.objects - i);
		uint32_t t = perm[i];
		perm[i] = perm[j];
		perm[j] = t;
		sample[i] = perm[i];
	}
	free(perm);
	run_stats(&c, sample, res.stat_n, &res);
	if (res.read_n)
		run_reads(&c, sample + res.stat_n, res.read_n, &res);
	else
		printf("\nopen+read: no objects left outside the stat sample; skipped\n");
	free(sample);

	long anon;
	read_status(serving(d.pid), &res.rss_end_kb, &res.hwm_end_kb, &anon);
	printf("\ndaemon after the measurements: VmRSS %ld kB, VmHWM %ld kB, RssAnon %ld kB\n",
	       res.rss_end_kb, res.hwm_end_kb, anon);

	/* g) stop. */
	res.exit_status = daemon_stop(&c, &d, &exit_ns);
	printf("umount -> daemon exit %.3f s, exit status %d\n", (double)exit_ns / 1e9,
	       res.exit_status);
	summary(&c, &res);

	if (c.clean) {
		remove_tree(c.store);
		remove_tree(c.empty);
		unlink(c.marker);
		fmt_path(path, sizeof(path), "%s/daemon-empty.log", c.workdir);
		unlink(path);
		fmt_path(path, sizeof(path), "%s/daemon-full.log", c.workdir);
		unlink(path);
		rmdir(c.mnt);
		rmdir(c.workdir);
	}
	free(c.wv);
	free(c.count);
	free(c.first);
	free(c.obj);
	free((char *)c.daemon);
	return res.exit_status == 0 ? 0 : 1;
}
