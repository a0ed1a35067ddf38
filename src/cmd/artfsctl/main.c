/* artfsctl: the command line of an artfs mount. It talks to the daemon only
 * through files of the mount (DESIGN.md §2): status reads .artfs/config and
 * .artfs/metrics, materialize runs one <wv>/.materialize transaction.
 * Whatever the daemon writes is parsed as outside input: bounded lines,
 * unknown lines ignored, control bytes never echoed to a terminal. */
#include "autoconf.h"

#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "format/key.h"
#include "state/config.h"
#include "state/metrics.h"

#define PROG "artfsctl"
#define EXIT_USAGE 2
#define INFO_FILE_MAX (64u << 20)  /* bytes of .artfs/config or .artfs/metrics */
#define INFO_LINE_MAX 4096         /* longer lines of those files are skipped */
#define COPY_CHUNK (1u << 20)

struct ctl {
	const char *mnt;
};

struct command {
	const char *name;
	const char *synopsis;  /* arguments after the name */
	const char *summary;
	int (*run)(struct ctl *ctl, int argc, char **argv);
};

static const struct command *commands_list(size_t *n);

/* ---- messages ------------------------------------------------------------ */

static void usage(FILE *f)
{
	size_t n;
	const struct command *cmds = commands_list(&n);

	fprintf(f, "usage: " PROG " [-m MOUNTPOINT] <command> [arguments]\n\ncommands:\n");
	for (size_t i = 0; i < n; i++)
		fprintf(f, "  %s%s%s\n      %s\n", cmds[i].name, *cmds[i].synopsis ? " " : "",
			cmds[i].synopsis, cmds[i].summary);
	fprintf(f, "\noptions:\n"
		   "  -m, --mount MOUNTPOINT  the artfs mount (default $ARTFS_MOUNT, else %s)\n"
		   "  -h, --help              show this help\n"
		   "\nexit status: 0 success, 1 the operation failed, 2 usage error\n",
		CONFIG_DEFAULT_MOUNTPOINT);
}

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int bad_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* An operation failed: one line on stderr, exit status 1. */
static int fail(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fputs(PROG ": ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	return 1;
}

/* The command line is wrong: the reason, then the usage, exit status 2. */
static int bad_usage(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fputs(PROG ": ", stderr);
	vfprintf(stderr, fmt, ap);
	fputs("\n\n", stderr);
	va_end(ap);
	usage(stderr);
	return EXIT_USAGE;
}

/* Text from the daemon or from stdin, made safe for a terminal: anything
 * but printable ASCII becomes '?' (no escape sequences, C1 controls
 * included), and at most max bytes are kept ("..." marks a cut). */
static const char *printable(const char *s, char *buf, size_t size, size_t max)
{
	size_t n = 0;

	for (; *s && n + 4 < size && n < max; s++)
		buf[n++] = (*s >= 0x20 && *s < 0x7f) ? *s : '?';
	if (*s && n + 4 <= size) {
		memcpy(buf + n, "...", 3);
		n += 3;
	}
	buf[n] = '\0';
	return buf;
}

/* The option getopt stopped at: "-x" for a short one, else the word. */
static const char *bad_option(char **argv, char *buf, size_t size)
{
	if (optopt > 0 && optopt < 0x7f && optopt >= 0x21) {
		snprintf(buf, size, "-%c", optopt);
		return buf;
	}
	return printable(argv[optind - 1], buf, size, 40);
}

/* ---- the mount ------------------------------------------------------------- */

static char *path_in(const char *mnt, const char *rel)
{
	size_t a = strlen(mnt), b = strlen(rel);
	bool slash = a > 0 && mnt[a - 1] == '/';
	char *p = malloc(a + b + 2);

	if (p)
		snprintf(p, a + b + 2, "%s%s%s", mnt, slash ? "" : "/", rel);
	return p;
}

/* An artfs mount is a directory whose .artfs/config can be read. */
static int mount_check(const struct ctl *ctl)
{
	if (!*ctl->mnt)
		return bad_usage("the mount point is an empty string");
	char *path = path_in(ctl->mnt, ".artfs/config");
	if (!path)
		return fail("out of memory");
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	int err = errno;
	free(path);
	if (fd < 0)
		return fail("%s is not an artfs mount (.artfs/config: %s)", ctl->mnt, strerror(err));
	close(fd);
	return 0;
}

/* Reads a whole .artfs file; stat says 0 for them (like /proc), so it reads
 * to EOF. Returns 0 and a NUL-terminated malloc'd text, or -errno. */
static int info_read(const struct ctl *ctl, const char *rel, char **text, size_t *len)
{
	char *path = path_in(ctl->mnt, rel);
	size_t cap = 1 << 16, n = 0;
	char *buf = malloc(cap);
	int rc = 0;

	if (!path || !buf) {
		free(path);
		free(buf);
		return -ENOMEM;
	}
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	free(path);
	if (fd < 0) {
		rc = -errno;
		free(buf);
		return rc;
	}
	for (;;) {
		if (cap - n < 2) {
			if (cap >= INFO_FILE_MAX) {
				rc = -EFBIG;
				break;
			}
			char *grown = realloc(buf, cap * 2);
			if (!grown) {
				rc = -ENOMEM;
				break;
			}
			buf = grown;
			cap *= 2;
		}
		ssize_t r = read(fd, buf + n, cap - n - 1);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			rc = -errno;
			break;
		}
		if (r == 0)
			break;
		n += (size_t)r;
	}
	close(fd);
	if (rc < 0) {
		free(buf);
		return rc;
	}
	buf[n] = '\0';
	*text = buf;
	*len = n;
	return 0;
}

/* Calls fn for each line of text (cut in place), skipping lines longer than
 * INFO_LINE_MAX. */
static void for_each_line(char *text, size_t len, void (*fn)(char *line, void *arg), void *arg)
{
	for (size_t pos = 0; pos < len;) {
		char *nl = memchr(text + pos, '\n', len - pos);
		size_t end = nl ? (size_t)(nl - text) : len;
		text[end] = '\0';
		if (end - pos <= INFO_LINE_MAX)
			fn(text + pos, arg);
		pos = end + 1;
	}
}


/* ---- numbers and units ------------------------------------------------------ */

/* A positive decimal integer, nothing else. */
static bool parse_positive(const char *s, uint64_t *out)
{
	uint64_t v = 0;

	if (!*s)
		return false;
	for (; *s; s++) {
		if (*s < '0' || *s > '9' || __builtin_mul_overflow(v, 10, &v) ||
		    __builtin_add_overflow(v, (uint64_t)(*s - '0'), &v))
			return false;
	}
	if (v == 0)
		return false;
	*out = v;
	return true;
}

/* A sample value of the exposition format: an integer, or a float that is
 * finite and not negative (clamped to uint64). */
static bool parse_value(const char *s, uint64_t *out)
{
	char *end;

	if (*s >= '0' && *s <= '9') {
		errno = 0;
		unsigned long long v = strtoull(s, &end, 10);
		if (!errno && *end == '\0') {
			*out = v;
			return true;
		}
	}
	errno = 0;
	double d = strtod(s, &end);
	if (errno || end == s || *end != '\0' || !isfinite(d) || d < 0)
		return false;
	*out = d >= 18446744073709551615.0 ? UINT64_MAX : (uint64_t)d;
	return true;
}

static const char *human_bytes(uint64_t v, char *buf, size_t size)
{
	static const char *const units[] = { "KiB", "MiB", "GiB", "TiB", "PiB", "EiB" };

	if (v < 1024) {
		snprintf(buf, size, "%" PRIu64 " B", v);
		return buf;
	}
	double d = (double)v / 1024;
	size_t u = 0;
	while (d >= 1023.95 && u + 1 < sizeof(units) / sizeof(units[0])) {
		d /= 1024;
		u++;
	}
	snprintf(buf, size, "%.1f %s", d, units[u]);
	return buf;
}

/* 12s, 5m03s, 2h10m, 3d04h */
static const char *human_duration(uint64_t s, char *buf, size_t size)
{
	if (s < 60)
		snprintf(buf, size, "%" PRIu64 "s", s);
	else if (s < 3600)
		snprintf(buf, size, "%" PRIu64 "m%02" PRIu64 "s", s / 60, s % 60);
	else if (s < 86400)
		snprintf(buf, size, "%" PRIu64 "h%02" PRIu64 "m", s / 3600, s / 60 % 60);
	else
		snprintf(buf, size, "%" PRIu64 "d%02" PRIu64 "h", s / 86400, s / 3600 % 24);
	return buf;
}

/* ---- status ------------------------------------------------------------------ */

struct opt_u64 {
	bool have;
	uint64_t v;
};

struct version_sample {
	const char *version;  /* points into the metrics text */
	int kind;
	uint64_t value;
};

struct metrics_view {
	struct opt_u64 global[METRIC_COUNT];
	struct version_sample *samples;
	size_t nsamples, cap;
	bool oom;
};

/* .artfs/config read back through the daemon's own option table. */
struct config_view {
	const char *mountpoint;  /* points into the config text */
	struct artfs_config cfg;
};

/* The option's value when the daemon listed it. */
static struct opt_u64 config_u64(const struct config_view *c, const char *name)
{
	unsigned bit;
	const struct config_option *o = config_option_find(name, &bit);

	if (!o || !(c->cfg.given & bit))
		return (struct opt_u64){ false, 0 };
	return (struct opt_u64){ true, *(const uint64_t *)((const char *)&c->cfg + o->offset) };
}

static void config_line(char *line, void *arg)
{
	struct config_view *c = arg;
	char *eq = strchr(line, '='), err[256];

	if (!eq)
		return;
	*eq = '\0';
	char *key = config_trim(line), *value = config_trim(eq + 1);
	if (strcmp(key, "mountpoint") == 0)
		c->mountpoint = value;
	else if (*value)
		config_set(&c->cfg, key, value, true, err, sizeof(err)); /* unknown keys: newer daemon */
}

static bool is_name_char(char c, bool first)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
	       (!first && c >= '0' && c <= '9');
}

/* Parses the {label="value",...} set at *p in place; sets *version to the
 * decoded value of a version label. Returns false if it is malformed. */
static bool parse_labels(char **p, const char **version)
{
	char *s = *p + 1;

	for (;;) {
		while (*s == ' ' || *s == '\t')
			s++;
		if (*s == '}')
			break;
		char *lname = s;
		if (!is_name_char(*s, true) || *s == ':')
			return false;
		while (is_name_char(*s, false) && *s != ':')
			s++;
		size_t lname_len = (size_t)(s - lname);
		while (*s == ' ' || *s == '\t')
			s++;
		if (*s++ != '=')
			return false;
		while (*s == ' ' || *s == '\t')
			s++;
		if (*s++ != '"')
			return false;
		char *value = s, *out = s;
		for (; *s != '"'; s++) {
			if (*s == '\0')
				return false;
			if (*s == '\\') {
				s++;
				if (*s == 'n')
					*out++ = '\n';
				else if (*s == '\\' || *s == '"')
					*out++ = *s;
				else
					return false;
			} else {
				*out++ = *s;
			}
		}
		s++;
		*out = '\0';
		if (lname_len == 7 && memcmp(lname, "version", 7) == 0)
			*version = value;
		while (*s == ' ' || *s == '\t')
			s++;
		if (*s == ',')
			s++;
		else if (*s != '}')
			return false;
	}
	*p = s + 1;
	return true;
}

static void metrics_line(char *line, void *arg)
{
	struct metrics_view *m = arg;
	char *p = line;
	const char *version = NULL;

	while (*p == ' ' || *p == '\t')
		p++;
	if (!is_name_char(*p, true))
		return; /* comments, blank and malformed lines */
	char *name = p;
	while (is_name_char(*p, false))
		p++;
	size_t name_len = (size_t)(p - name);
	if (*p == '{' && !parse_labels(&p, &version))
		return;
	if (*p != ' ' && *p != '\t')
		return;
	name[name_len] = '\0';
	p = config_trim(p + 1);
	char *ts = strpbrk(p, " \t");  /* an optional timestamp follows the value */
	if (ts)
		*ts = '\0';
	uint64_t value;
	if (!parse_value(p, &value))
		return;

	if (!version) {
		for (int k = 0; k < METRIC_COUNT; k++)
			if (strcmp(name, metric_defs[k].name) == 0)
				m->global[k] = (struct opt_u64){ true, value };
		return;
	}
	if (!key_version_name_valid(version))
		return;
	for (int k = 0; k < METRIC_VERSION_COUNT; k++) {
		if (strcmp(name, metric_version_defs[k].name) != 0)
			continue;
		if (m->nsamples == m->cap) {
			size_t cap = m->cap ? m->cap * 2 : 64;
			struct version_sample *grown = realloc(m->samples, cap * sizeof(*grown));
			if (!grown) {
				m->oom = true;
				return;
			}
			m->samples = grown;
			m->cap = cap;
		}
		m->samples[m->nsamples++] = (struct version_sample){ version, k, value };
	}
}

static int sample_cmp(const void *a, const void *b)
{
	const struct version_sample *x = a, *y = b;
	int c = strcmp(x->version, y->version);

	return c ? c : x->kind - y->kind;
}

static const char *opt_text(struct opt_u64 o, char *buf, size_t size)
{
	if (!o.have)
		return "?";
	snprintf(buf, size, "%" PRIu64, o.v);
	return buf;
}

static void print_versions(struct metrics_view *m)
{
	char a[32], b[32];
	int width = 7;

	if (m->nsamples)
		qsort(m->samples, m->nsamples, sizeof(*m->samples), sample_cmp);
	for (size_t i = 0; i < m->nsamples; i++) {
		int len = (int)strlen(m->samples[i].version);
		if (len > width)
			width = len;
	}
	printf("\n");
	if (m->nsamples == 0) {
		printf("no weight versions\n");
		return;
	}
	printf("%-*s  %8s  %10s  %7s  %4s\n", width, "VERSION", "OBJECTS", "BYTES", "IDLE", "OPEN");
	for (size_t i = 0; i < m->nsamples;) {
		const char *name = m->samples[i].version;
		struct opt_u64 v[METRIC_VERSION_COUNT] = { { 0 } };
		for (; i < m->nsamples && strcmp(m->samples[i].version, name) == 0; i++)
			v[m->samples[i].kind] = (struct opt_u64){ true, m->samples[i].value };
		char objects[24], open_files[24];
		printf("%-*s  %8s  %10s  %7s  %4s\n", width, name,
		       opt_text(v[METRIC_VERSION_OBJECTS], objects, sizeof(objects)),
		       v[METRIC_VERSION_BYTES].have ? human_bytes(v[METRIC_VERSION_BYTES].v, a, sizeof(a)) : "?",
		       v[METRIC_VERSION_IDLE].have ? human_duration(v[METRIC_VERSION_IDLE].v, b, sizeof(b)) : "?",
		       opt_text(v[METRIC_VERSION_OPEN], open_files, sizeof(open_files)));
	}
}

static int status_report(const struct ctl *ctl, struct config_view *c, struct metrics_view *m)
{
	char s1[32], s2[32], s3[32], safe[512];
	struct opt_u64 *g = m->global;
	struct opt_u64 capacity = g[METRIC_CAPACITY].have ? g[METRIC_CAPACITY] : config_u64(c, "capacity");
	struct opt_u64 ttl = config_u64(c, "ttl");
	unsigned store_bit;
	config_option_find("store", &store_bit);
	const char *store = c->cfg.given & store_bit ? c->cfg.store : NULL;

	printf("mount       %s\n", printable(c->mountpoint && *c->mountpoint ? c->mountpoint
									     : ctl->mnt,
						 safe, sizeof(safe), 400));
	printf("store       %s\n", store ? printable(store, safe, sizeof(safe), 400) : "?");
	printf("objects     %s in %s versions\n", opt_text(g[METRIC_OBJECTS], s1, sizeof(s1)),
	       opt_text(g[METRIC_VERSIONS], s2, sizeof(s2)));
	printf("used        %s of %s",
	       g[METRIC_BYTES_USED].have ? human_bytes(g[METRIC_BYTES_USED].v, s1, sizeof(s1)) : "?",
	       capacity.have ? human_bytes(capacity.v, s2, sizeof(s2)) : "?");
	if (g[METRIC_BYTES_USED].have && capacity.have && capacity.v > 0)
		printf(" (%.1f%%)", 100.0 * (double)g[METRIC_BYTES_USED].v / (double)capacity.v);
	printf("\n");
	printf("reserved    %s by %s publishes in flight\n",
	       g[METRIC_BYTES_RESERVED].have ? human_bytes(g[METRIC_BYTES_RESERVED].v, s1, sizeof(s1)) : "?",
	       opt_text(g[METRIC_PUBLISHING], s2, sizeof(s2)));
	printf("publishes   %s, %s checksum failures\n", opt_text(g[METRIC_PUBLISHES], s1, sizeof(s1)),
	       opt_text(g[METRIC_CHECKSUM_FAILURES], s2, sizeof(s2)));
	if (!ttl.have)
		printf("ttl         ?\n");
	else if (ttl.v == 0)
		printf("ttl         never (0)\n");
	else
		printf("ttl         %s (%s s)\n", human_duration(ttl.v, s1, sizeof(s1)),
		       opt_text(ttl, s3, sizeof(s3)));
	print_versions(m);
	if (fflush(stdout) != 0 || ferror(stdout))
		return fail("writing to stdout: %s", strerror(errno));
	return 0;
}

/* How long status waits for the mount's answers by default: a mount whose
 * daemon does not serve (one that cannot start: the holder retries, and
 * says why in its log) answers nothing, and a read of it waits for good. */
#define STATUS_WAIT_S 5

static int write_all(int fd, const void *buf, size_t len);
static double seconds_now(void);

struct status_texts {
	char *text[2];             /* .artfs/config, .artfs/metrics */
	size_t len[2];
};

static const char *const status_files[2] = { ".artfs/config", ".artfs/metrics" };

/* In a child of its own (status_fetch): the two files, each as its read's
 * result (int), then its length and bytes, on fd. Exits with the exit
 * status of the mount's check. */
static void status_child(const struct ctl *ctl, int fd)
{
	int rc = mount_check(ctl);

	if (rc)
		_exit(rc);
	for (int i = 0; i < 2; i++) {
		char *text = NULL;
		size_t len = 0;
		int32_t r = info_read(ctl, status_files[i], &text, &len);
		uint64_t n = len;
		if (write(fd, &r, sizeof(r)) != sizeof(r) ||
		    (r == 0 && (write(fd, &n, sizeof(n)) != sizeof(n) || write_all(fd, text, len) < 0)))
			_exit(1);
		free(text);
	}
	_exit(0);
}

/* Reads len bytes from fd until the deadline (CLOCK_MONOTONIC s): 0,
 * -ETIMEDOUT, -EPIPE (the writer ended first) or -errno. */
static int read_until(int fd, void *buf, size_t len, double deadline)
{
	for (size_t done = 0; done < len;) {
		double left = deadline - seconds_now();
		struct pollfd p = { .fd = fd, .events = POLLIN };
		int n = left > 0 ? poll(&p, 1, (int)(left * 1000) + 1) : 0;
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return -ETIMEDOUT;
		ssize_t r = read(fd, (char *)buf + done, len - done);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return r < 0 ? -errno : -EPIPE;
		done += (size_t)r;
	}
	return 0;
}

/* One file's text from the child: 0, the read's -errno (*failed set), or
 * the pipe's. */
static int status_take(int fd, struct status_texts *t, int i, double deadline, int *failed)
{
	int32_t r;
	uint64_t n;
	int rc = read_until(fd, &r, sizeof(r), deadline);

	if (rc < 0)
		return rc;
	if (r < 0) {
		*failed = r;
		return 0;
	}
	if ((rc = read_until(fd, &n, sizeof(n), deadline)) < 0)
		return rc;
	if (n >= INFO_FILE_MAX || !(t->text[i] = malloc((size_t)n + 1)))
		return -ENOMEM;
	t->len[i] = (size_t)n;
	t->text[i][n] = '\0';
	return read_until(fd, t->text[i], (size_t)n, deadline);
}

/* Reads .artfs/config and .artfs/metrics in a child process, waiting at
 * most wait_s for them: a read of a mount whose daemon does not serve
 * waits in the kernel, where only a fatal signal ends it (the child is
 * killed then, and this process answers). Returns 0 or the exit status
 * after saying why. */
static int status_fetch(const struct ctl *ctl, unsigned wait_s, struct status_texts *t)
{
	int p[2], rc = 0, failed[2] = { 0, 0 };

	if (pipe2(p, O_CLOEXEC) < 0)
		return fail("status: %s", strerror(errno));
	fflush(NULL);
	pid_t pid = fork();
	if (pid == 0) {
		close(p[0]);
		status_child(ctl, p[1]);
	}
	close(p[1]);
	if (pid < 0) {
		close(p[0]);
		return fail("status: %s", strerror(errno));
	}
	double deadline = seconds_now() + wait_s;
	for (int i = 0; i < 2 && rc == 0; i++)
		rc = status_take(p[0], t, i, deadline, &failed[i]);
	close(p[0]);
	if (rc == -ETIMEDOUT) {
		kill(pid, SIGKILL);
		waitpid(pid, NULL, WNOHANG); /* a request already read by a dying daemon holds it */
		return fail("%s does not answer within %u s: its daemon does not serve (the artfs "
			    "log, syslog in the background, says why)", ctl->mnt, wait_s);
	}
	int status = 0;
	waitpid(pid, &status, 0);
	if (rc == -EPIPE && WIFEXITED(status) && WEXITSTATUS(status) != 0)
		return WEXITSTATUS(status); /* the mount's check said why */
	if (rc < 0)
		return fail("status: %s", strerror(-rc));
	for (int i = 0; i < 2; i++)
		if (failed[i] < 0)
			return fail("reading %s/%s: %s", ctl->mnt, status_files[i], strerror(-failed[i]));
	return 0;
}

static int cmd_status(struct ctl *ctl, int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "mount", required_argument, NULL, 'm' },
		{ "timeout", required_argument, NULL, 't' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	char o[64];
	int opt;
	uint64_t wait_s = STATUS_WAIT_S;

	optind = 0;
	while ((opt = getopt_long(argc, argv, ":m:t:h", longopts, NULL)) != -1) {
		switch (opt) {
		case 'm': ctl->mnt = optarg; break;
		case 't':
			if (!parse_positive(optarg, &wait_s) || wait_s > 86400)
				return bad_usage("status: --timeout takes seconds, 1 to 86400");
			break;
		case 'h': usage(stdout); return 0;
		case ':': return bad_usage("status: %s needs a value", bad_option(argv, o, sizeof(o)));
		default: return bad_usage("status: unknown option %s", bad_option(argv, o, sizeof(o)));
		}
	}
	if (optind < argc)
		return bad_usage("status: unexpected argument \"%s\"", argv[optind]);
	struct status_texts t = { { NULL, NULL }, { 0, 0 } };
	int rc = status_fetch(ctl, (unsigned)wait_s, &t);
	if (rc) {
		free(t.text[0]);
		free(t.text[1]);
		return rc;
	}
	struct config_view c = { 0 };
	struct metrics_view m = { 0 };
	config_init(&c.cfg);
	for_each_line(t.text[0], t.len[0], config_line, &c);
	for_each_line(t.text[1], t.len[1], metrics_line, &m);
	if (m.oom)
		rc = fail("reading %s/.artfs/metrics: %s", ctl->mnt, strerror(ENOMEM));
	else
		rc = status_report(ctl, &c, &m);
	config_free(&c.cfg);
	free(m.samples);
	free(t.text[0]);
	free(t.text[1]);
	return rc;
}

/* ---- materialize ---------------------------------------------------------- */

struct buffer {
	char *data;
	size_t len, cap;
};

static bool buffer_add(struct buffer *b, const char *s, size_t n)
{
	if (n == 0)
		return true;
	if (b->cap - b->len < n) {
		size_t cap = b->cap ? b->cap : 4096;
		while (cap - b->len < n)
			cap *= 2;
		char *grown = realloc(b->data, cap);
		if (!grown)
			return false;
		b->data = grown;
		b->cap = cap;
	}
	memcpy(b->data + b->len, s, n);
	b->len += n;
	return true;
}

/* Writes all of buf, across short writes and signals. Returns 0 or -errno. */
static int write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len > 0) {
		ssize_t w = write(fd, p, len);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return -errno;
		if (w == 0)
			return -EIO;
		p += w;
		len -= (size_t)w;
	}
	return 0;
}

enum line_status { LINE_OK, LINE_EOF, LINE_LONG, LINE_NUL, LINE_ERROR };

/* One line of stdin into buf (size bytes), without its newline. */
static enum line_status read_line(FILE *f, char *buf, size_t size)
{
	size_t n = 0;
	int ch;

	while ((ch = getc(f)) != EOF && ch != '\n') {
		if (ch == '\0')
			return LINE_NUL;
		if (n + 1 >= size)
			return LINE_LONG;
		buf[n++] = (char)ch;
	}
	if (ch == EOF && ferror(f))
		return LINE_ERROR;
	if (ch == EOF && n == 0)
		return LINE_EOF;
	buf[n] = '\0';
	return LINE_OK;
}

/* Appends the block hashes of stdin, one a line, to the request. Returns 0,
 * or the exit status after saying what was wrong. */
static int read_hashes(struct buffer *req)
{
	char line[ARTFS_HASH_HEX_MAX + 64], safe[64];
	uint8_t bytes[ARTFS_HASH_BYTES_MAX];
	size_t lineno = 0, count = 0, len;

	for (;;) {
		enum line_status st = read_line(stdin, line, sizeof(line));
		lineno++;
		if (st == LINE_EOF)
			break;
		if (st == LINE_ERROR)
			return fail("reading the block hashes from stdin: %s", strerror(errno));
		if (st == LINE_LONG || st == LINE_NUL) {
			fprintf(stderr, PROG ": stdin line %zu: %s; expected one block hash a line "
				"(2 to 128 lowercase hex digits, even length)\n",
				lineno, st == LINE_LONG ? "too long" : "NUL byte");
			return EXIT_USAGE;
		}
		char *h = config_trim(line);
		if (*h == '\0')
			continue;
		if (key_hash_decode(h, bytes, &len) < 0) {
			fprintf(stderr, PROG ": stdin line %zu: \"%s\" is not a block hash "
				"(2 to 128 lowercase hex digits, even length)\n",
				lineno, printable(h, safe, sizeof(safe), 40));
			return EXIT_USAGE;
		}
		if (!buffer_add(req, h, strlen(h)) || !buffer_add(req, "\n", 1))
			return fail("reading the block hashes from stdin: %s", strerror(ENOMEM));
		count++;
	}
	if (count == 0) {
		fprintf(stderr, PROG ": no block hashes on stdin (one a line, in token order)\n");
		return EXIT_USAGE;
	}
	return 0;
}

/* What a failed read of .materialize means (DESIGN.md §3.4). */
static const char *materialize_error(int err)
{
	switch (err) {
	case ENOENT: return "an object of the request does not exist";
	case EIO: return "an object failed verification";
	case EBADMSG: return "the objects do not form the request (see the daemon log)";
	case EINVAL: return "malformed request";
	default: return "reading the result failed";
	}
}

/* Reads the result from offset 0 to EOF onto stdout. */
static int materialize_copy(int fd, const char *wv)
{
	char *buf = malloc(COPY_CHUNK);
	uint64_t off = 0;
	int rc = 0;

	if (!buf)
		return fail("materialize %s: %s", wv, strerror(ENOMEM));
	for (;;) {
		ssize_t r = pread(fd, buf, COPY_CHUNK, (off_t)off);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			int err = errno;
			rc = fail("materialize %s: %s (%s)%s", wv, materialize_error(err),
				  strerror(err), off ? "; the output is incomplete" : "");
			break;
		}
		if (r == 0)
			break;
		int w = write_all(STDOUT_FILENO, buf, (size_t)r);
		if (w < 0) {
			rc = fail("materialize %s: writing to stdout: %s", wv, strerror(-w));
			break;
		}
		off += (uint64_t)r;
	}
	free(buf);
	return rc;
}

struct materialize_args {
	uint64_t token_end, block_size;   /* 0: not given */
	const char *wv;
	bool helped;                      /* --help: the usage is printed, nothing else */
};

/* The options and the weight version of the command line. Returns 0, or
 * the exit status after saying what was wrong. */
static int materialize_read_args(struct ctl *ctl, int argc, char **argv, struct materialize_args *a)
{
	enum { OPT_TOKEN_END = 256, OPT_BLOCK_SIZE };
	static const struct option longopts[] = {
		{ "token-end", required_argument, NULL, OPT_TOKEN_END },
		{ "block-size", required_argument, NULL, OPT_BLOCK_SIZE },
		{ "mount", required_argument, NULL, 'm' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	char o[64];
	int opt;

	optind = 0;
	while ((opt = getopt_long(argc, argv, ":m:h", longopts, NULL)) != -1) {
		switch (opt) {
		case OPT_TOKEN_END:
		case OPT_BLOCK_SIZE:
			if (!parse_positive(optarg, opt == OPT_TOKEN_END ? &a->token_end : &a->block_size))
				return bad_usage("materialize: %s needs a positive integer, not \"%s\"",
						 opt == OPT_TOKEN_END ? "--token-end" : "--block-size",
						 optarg);
			break;
		case 'm': ctl->mnt = optarg; break;
		case 'h': usage(stdout); a->helped = true; return 0;
		case ':':
			return bad_usage("materialize: %s needs a value", bad_option(argv, o, sizeof(o)));
		default:
			return bad_usage("materialize: unknown option %s", bad_option(argv, o, sizeof(o)));
		}
	}
	if (optind >= argc)
		return bad_usage("materialize: which weight version?");
	if (optind + 1 < argc)
		return bad_usage("materialize: unexpected argument \"%s\"", argv[optind + 1]);
	a->wv = argv[optind];
	if (!key_version_name_valid(a->wv)) {
		char safe[160];
		return bad_usage("materialize: \"%s\" is not a weight version name",
				 printable(a->wv, safe, sizeof(safe), 140));
	}
	return 0;
}

/* The request's text: its token_end and block_size lines, then the block
 * hashes of stdin. Returns 0, or the exit status after saying why not. */
static int materialize_request(const struct materialize_args *a, struct buffer *req)
{
	char head[64];
	int n = 0;

	if (a->token_end)
		n += snprintf(head + n, sizeof(head) - (size_t)n, "token_end %" PRIu64 "\n",
			      a->token_end);
	if (a->block_size)
		n += snprintf(head + n, sizeof(head) - (size_t)n, "block_size %" PRIu64 "\n",
			      a->block_size);
	if (!buffer_add(req, head, (size_t)n))
		return fail("materialize %s: %s", a->wv, strerror(ENOMEM));
	return read_hashes(req);
}

/* Why <wv>/.materialize did not open: a version the mount lacks, or the
 * error at path. Returns the exit status. */
static int materialize_open_failed(const struct ctl *ctl, const char *wv, const char *path,
				   int err)
{
	struct stat st;

	if (err == ENOENT && stat(ctl->mnt, &st) == 0)
		return fail("materialize %s: no weight version \"%s\" in %s (%s)", wv, wv, ctl->mnt,
			    strerror(err));
	return fail("materialize %s: opening %s: %s", wv, path, strerror(err));
}

/* The request written to <wv>/.materialize, its result read back onto
 * stdout. Returns 0 or the exit status. */
static int materialize_run(const struct ctl *ctl, const char *wv, const struct buffer *req)
{
	char rel[ARTFS_VERSION_NAME_MAX + 16];
	snprintf(rel, sizeof(rel), "%s/.materialize", wv);
	char *path = path_in(ctl->mnt, rel);
	if (!path)
		return fail("materialize %s: %s", wv, strerror(ENOMEM));
	int rc;
	int fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		rc = materialize_open_failed(ctl, wv, path, errno);
		free(path);
		return rc;
	}
	int w = write_all(fd, req->data, req->len);
	if (w < 0)
		rc = fail("materialize %s: writing the request to %s: %s%s", wv, path, strerror(-w),
			  w == -EFBIG ? " (more than the daemon accepts in one request)" : "");
	else
		rc = materialize_copy(fd, wv);
	close(fd);
	free(path);
	return rc;
}

static int cmd_materialize(struct ctl *ctl, int argc, char **argv)
{
	struct materialize_args a = { 0 };
	int rc = materialize_read_args(ctl, argc, argv, &a);

	if (rc || a.helped)
		return rc;
	if (isatty(STDOUT_FILENO))
		return fail("materialize %s: stdout is a terminal; redirect the .npy to a file or "
			    "a pipe", a.wv);
	if ((rc = mount_check(ctl)))
		return rc;
	struct buffer req = { 0 };
	rc = materialize_request(&a, &req);
	if (rc == 0)
		rc = materialize_run(ctl, a.wv, &req);
	free(req.data);
	return rc;
}

/* ---- load and unload (GPU weights) ------------------------------------------------ */

static int control_write(const struct ctl *ctl, const char *what, const char *line)
{
	char *path = path_in(ctl->mnt, ".artfs/control");
	if (!path)
		return -ENOMEM;
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	free(path);
	if (fd < 0)
		return -errno;
	int rc = write_all(fd, line, strlen(line));
	if (close(fd) < 0 && rc == 0)
		rc = -errno;
	(void)what;
	return rc;
}

/* key = value lines of <wv>/weights/status; the value of key into out. */
static bool status_value(const char *text, const char *key, char *out, size_t size)
{
	size_t klen = strlen(key);

	for (const char *line = text; line && *line;) {
		const char *nl = strchr(line, '\n');
		size_t len = nl ? (size_t)(nl - line) : strlen(line);
		if (len > klen + 3 && strncmp(line, key, klen) == 0 && strncmp(line + klen, " = ", 3) == 0) {
			size_t v = len - klen - 3;
			if (v >= size)
				v = size - 1;
			memcpy(out, line + klen + 3, v);
			out[v] = '\0';
			return true;
		}
		line = nl ? nl + 1 : NULL;
	}
	return false;
}

static void progress(const char *wv, uint64_t done, uint64_t total, double rate)
{
	const int width = 40;
	int filled = total ? (int)((double)done / (double)total * width) : 0;
	char hd[32], ht[32];

	human_bytes(done, hd, sizeof(hd));
	human_bytes(total, ht, sizeof(ht));
	fprintf(stderr, "\r%s [", wv);
	for (int i = 0; i < width; i++)
		fputc(i < filled ? '#' : '.', stderr);
	fprintf(stderr, "] %s / %s  %.0f MB/s ", hd, ht, rate);
	fflush(stderr);
}

/* Follows <wv>/weights/status until ready (0) or failed (1). */
static int wait_ready(const struct ctl *ctl, const char *wv)
{
	char rel[ARTFS_VERSION_NAME_MAX + 32], state[32], v[512];
	bool bar = isatty(STDERR_FILENO);

	snprintf(rel, sizeof(rel), "%s/weights/status", wv);
	for (;;) {
		char *text;
		size_t len;
		int rc = info_read(ctl, rel, &text, &len);
		if (rc < 0)
			return fail("load %s: the weights are gone (%s): unloaded meanwhile?", wv,
				    strerror(-rc));
		uint64_t done = 0, total = 0;
		double rate = 0;
		if (status_value(text, "bytes_done", v, sizeof(v)))
			done = strtoull(v, NULL, 10);
		if (status_value(text, "bytes_total", v, sizeof(v)))
			total = strtoull(v, NULL, 10);
		if (status_value(text, "rate_mb_per_s", v, sizeof(v)))
			rate = strtod(v, NULL);
		if (!status_value(text, "state", state, sizeof(state)))
			state[0] = '\0';
		if (bar)
			progress(wv, done, total, rate);
		if (strcmp(state, "loading") != 0) {
			if (bar)
				fputc('\n', stderr);
			if (strcmp(state, "ready") == 0) {
				char secs[32] = "?", hb[32];
				status_value(text, "seconds", secs, sizeof(secs));
				human_bytes(total, hb, sizeof(hb));
				printf("%s: ready, %s in %s s (%.0f MB/s)\n", wv, hb, secs, rate);
				free(text);
				return 0;
			}
			if (!status_value(text, "error", v, sizeof(v)))
				v[0] = '\0';
			free(text);
			return fail("load %s: %s: %s", wv, state, v);
		}
		free(text);
		usleep(20 * 1000); /* a flip waits on this: poll often */
	}
}

static int cmd_load(struct ctl *ctl, int argc, char **argv)
{
	enum { OPT_GPUS = 256, OPT_NO_WAIT };
	static const struct option longopts[] = {
		{ "gpus", required_argument, NULL, OPT_GPUS },
		{ "no-wait", no_argument, NULL, OPT_NO_WAIT },
		{ "mount", required_argument, NULL, 'm' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *gpus = NULL;
	bool wait = true;
	char o[64];
	int opt;

	optind = 0;
	while ((opt = getopt_long(argc, argv, ":m:h", longopts, NULL)) != -1) {
		switch (opt) {
		case OPT_GPUS: gpus = optarg; break;
		case OPT_NO_WAIT: wait = false; break;
		case 'm': ctl->mnt = optarg; break;
		case 'h': usage(stdout); return 0;
		case ':': return bad_usage("load: %s needs a value", bad_option(argv, o, sizeof(o)));
		default: return bad_usage("load: unknown option %s", bad_option(argv, o, sizeof(o)));
		}
	}
	if (argc - optind != 2)
		return bad_usage("load: needs <wv> <checkpoint-dir>");
	const char *wv = argv[optind];
	if (!key_version_name_valid(wv))
		return bad_usage("load: \"%s\" is not a weight version name", wv);
	if (gpus && (!*gpus || strspn(gpus, "0123456789,") != strlen(gpus)))
		return bad_usage("load: --gpus takes a list like 0,1,2");
	char dir[PATH_MAX];
	if (!realpath(argv[optind + 1], dir))
		return fail("load %s: %s: %s", wv, argv[optind + 1], strerror(errno));
	if (strpbrk(dir, " \t\n"))
		return fail("load %s: %s: a checkpoint path with spaces is not supported", wv, dir);
	int rc = mount_check(ctl);
	if (rc)
		return rc;
	char line[PATH_MAX + 512];
	snprintf(line, sizeof(line), "load %s %s%s%s\n", wv, dir, gpus ? " gpus=" : "", gpus ? gpus : "");
	rc = control_write(ctl, "load", line);
	switch (rc) {
	case 0: break;
	case -ENODEV: return fail("load %s: no GPU support in this artfs, or no GPU (%s)", wv, strerror(-rc));
	case -ENOENT: return fail("load %s: %s holds no safetensors checkpoint (%s)", wv, dir, strerror(-rc));
	case -EEXIST: return fail("load %s: weights of %s are already loaded; loaded weights are "
				  "immutable, use a new version (%s)", wv, wv, strerror(-rc));
	case -EINVAL: return fail("load %s: the checkpoint or the GPU list was refused; the daemon "
				  "log says why (%s)", wv, strerror(-rc));
	case -ENOMEM: return fail("load %s: the GPUs lack room for it; attached versions are "
				  "untouched; the daemon log says how much is free (%s)", wv, strerror(-rc));
	default: return fail("load %s: %s", wv, strerror(-rc));
	}
	return wait ? wait_ready(ctl, wv) : 0;
}

static int cmd_unload(struct ctl *ctl, int argc, char **argv)
{
	if (argc == 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
		usage(stdout);
		return 0;
	}
	if (argc != 2)
		return bad_usage("unload: needs <wv>");
	if (!key_version_name_valid(argv[1]))
		return bad_usage("unload: \"%s\" is not a weight version name", argv[1]);
	int rc = mount_check(ctl);
	if (rc)
		return rc;
	char line[ARTFS_VERSION_NAME_MAX + 16];
	snprintf(line, sizeof(line), "unload %s\n", argv[1]);
	rc = control_write(ctl, "unload", line);
	if (rc == -ENOENT)
		return fail("unload %s: no weights of %s are loaded", argv[1], argv[1]);
	if (rc < 0)
		return fail("unload %s: %s", argv[1], strerror(-rc));
	printf("%s: unloaded (GPU memory is freed when the last attached engine closes)\n", argv[1]);
	return 0;
}

/* ---- upgrade ------------------------------------------------------------------------ */

#define UPGRADE_WAIT_S 120

/* The serving daemon's pid and generation, from the metrics. */
static int daemon_of(const struct ctl *ctl, uint64_t *pid, uint64_t *generation)
{
	char *text = NULL;
	size_t len;
	struct metrics_view m = { 0 };
	int rc = info_read(ctl, ".artfs/metrics", &text, &len);

	if (rc < 0)
		return rc;
	for_each_line(text, len, metrics_line, &m);
	free(m.samples);
	free(text);
	if (!m.global[METRIC_DAEMON_PID].have || !m.global[METRIC_DAEMON_GENERATION].have)
		return -EPROTO; /* a daemon from before restarts */
	*pid = m.global[METRIC_DAEMON_PID].v;
	*generation = m.global[METRIC_DAEMON_GENERATION].v;
	return 0;
}

static double seconds_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* <store>/upgrade-outcome of the mount's store (from .artfs/config), or
 * NULL when the store is not known. */
static char *upgrade_outcome_path(const struct ctl *ctl)
{
	char *text = NULL, *path = NULL;
	size_t len;
	struct config_view c = { 0 };
	unsigned store_bit;

	if (info_read(ctl, ".artfs/config", &text, &len) < 0)
		return NULL;
	config_init(&c.cfg);
	for_each_line(text, len, config_line, &c);
	config_option_find("store", &store_bit);
	if ((c.cfg.given & store_bit) && c.cfg.store && c.cfg.store[0] == '/')
		path = path_in(c.cfg.store, "upgrade-outcome");
	config_free(&c.cfg);
	free(text);
	return path;
}

/* The holder's record of its last upgrade: its line in buf ("" when there
 * is none); -errno when it cannot be read. */
static int outcome_read(const char *path, char *buf, size_t size)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);

	buf[0] = '\0';
	if (fd < 0)
		return errno == ENOENT ? 0 : -errno;
	ssize_t n = read(fd, buf, size - 1);
	int rc = n < 0 ? -errno : 0;
	close(fd);
	buf[n > 0 ? n : 0] = '\0';
	char *nl = strchr(buf, '\n');
	if (nl)
		*nl = '\0';
	return rc;
}

struct upgrade_wait {
	uint64_t old_pid, old_gen;
	char *outcome_path;        /* NULL: the store is not known */
	char before[768];          /* the record before the request */
	unsigned long long seq;    /* the record of this upgrade, once seen */
	bool seen;
	double start;
};

/* One look at the holder's record: 1 the upgrade served (a new daemon
 * answers the metrics), -1 it failed (said), 0 not yet. */
static int outcome_look(const struct ctl *ctl, struct upgrade_wait *w)
{
	char line[768], state[16];
	unsigned long long seq;
	long pid;
	int at = 0;
	uint64_t now_pid, now_gen;

	if (!w->outcome_path || outcome_read(w->outcome_path, line, sizeof(line)) < 0 ||
	    strcmp(line, w->before) == 0 ||
	    sscanf(line, "%llu %15s %ld %n", &seq, state, &pid, &at) != 3)
		return 0;
	if (!w->seen) { /* the first new record is this upgrade's */
		w->seen = true;
		w->seq = seq;
	}
	if (seq != w->seq)
		return 0; /* another's, written over this one's: this one's comes again */
	if (strcmp(state, "failed") == 0) {
		fail("upgrade: failed: %s", line + at);
		return -1;
	}
	/* Served: the daemon named answers (if it died right after it took
	 * over, the holder says so next). */
	if (strcmp(state, "served") == 0 && daemon_of(ctl, &now_pid, &now_gen) == 0 &&
	    now_pid == (uint64_t)pid) {
		printf("%s: upgraded: daemon %ld serves it, after daemon %" PRIu64 " (%.3f s)\n",
		       ctl->mnt, pid, w->old_pid, seconds_now() - w->start);
		return 1;
	}
	return 0;
}

static int upgrade_wait(const struct ctl *ctl, struct upgrade_wait *w)
{
	uint64_t now_pid, now_gen;

	for (;;) {
		int r = outcome_look(ctl, w);
		if (r)
			return r > 0 ? 0 : 1;
		/* No record of the holder's: a new daemon answering is the sign. */
		if (!w->seen && seconds_now() - w->start > 1.0 &&
		    daemon_of(ctl, &now_pid, &now_gen) == 0 && now_pid != w->old_pid &&
		    now_gen > w->old_gen) {
			printf("%s: upgraded: daemon %" PRIu64 " serves it, after daemon %" PRIu64
			       " (%.3f s)\n", ctl->mnt, now_pid, w->old_pid, seconds_now() - w->start);
			return 0;
		}
		if (seconds_now() - w->start > UPGRADE_WAIT_S)
			return fail("upgrade: no new daemon serves %s after %d s (the daemon log "
				    "says why)", ctl->mnt, UPGRADE_WAIT_S);
		usleep(10000);
	}
}

/* Asks for the binary on disk to take over the mount (the holder starts
 * it beside the serving daemon, which drains), and waits until it serves
 * or the holder says the upgrade failed (and why), in the record it keeps
 * in the store's directory (fs/holder.c: "<seq> <state> <pid> <why>").
 * Where that record cannot be read (another user's store, a holder from
 * before it), a new daemon answering the metrics is the success. */
static int cmd_upgrade(struct ctl *ctl, int argc, char **argv)
{
	uint64_t pid, gen;

	if (argc == 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
		usage(stdout);
		return 0;
	}
	if (argc != 1)
		return bad_usage("upgrade: takes no argument");
	int rc = mount_check(ctl);
	if (rc)
		return rc;
	if ((rc = daemon_of(ctl, &pid, &gen)) < 0)
		return fail("upgrade: %s does not say which daemon serves it (%s): an artfs "
			    "from before in-place upgrades", ctl->mnt, strerror(-rc));
	struct upgrade_wait w = { .old_pid = pid, .old_gen = gen };
	w.outcome_path = upgrade_outcome_path(ctl);
	if (w.outcome_path)
		outcome_read(w.outcome_path, w.before, sizeof(w.before));
	w.start = seconds_now();
	rc = control_write(ctl, "upgrade", "upgrade\n");
	if (rc == -EOPNOTSUPP)
		rc = fail("upgrade: the daemon of %s was not started by a holder", ctl->mnt);
	else if (rc < 0)
		rc = fail("upgrade: %s", strerror(-rc));
	else
		rc = upgrade_wait(ctl, &w);
	free(w.outcome_path);
	return rc;
}

/* ---- dispatch ------------------------------------------------------------------ */

/* One entry and one function per command. */
static const struct command commands[] = {
	{ "status", "[--timeout SECONDS]",
	  "the mount, its store and capacity, and one line per weight version (waiting at most\n"
	  "      --timeout seconds, default 5, for a mount whose daemon does not answer)",
	  cmd_status },
	{ "materialize", "<wv> [--token-end N] [--block-size N] < hashes > out.npy",
	  "one request's R3 array as .npy, from its block hashes on stdin (one a line)",
	  cmd_materialize },
	{ "load", "<wv> <checkpoint-dir> [--gpus 0,1,...] [--no-wait]",
	  "load a safetensors checkpoint into GPU memory as <wv>/weights, with a progress bar",
	  cmd_load },
	{ "unload", "<wv>",
	  "remove <wv>/weights; GPU memory is freed when the last attached engine closes",
	  cmd_unload },
	{ "upgrade", "",
	  "the artfs binary now on disk takes the mount over; no client sees an error",
	  cmd_upgrade },
};

static const struct command *commands_list(size_t *n)
{
	*n = sizeof(commands) / sizeof(commands[0]);
	return commands;
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "mount", required_argument, NULL, 'm' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *env = getenv("ARTFS_MOUNT");
	struct ctl ctl = { .mnt = env && *env ? env : CONFIG_DEFAULT_MOUNTPOINT };
	char o[64];
	int opt;

	opterr = 0;
	while ((opt = getopt_long(argc, argv, "+:m:h", longopts, NULL)) != -1) {
		switch (opt) {
		case 'm': ctl.mnt = optarg; break;
		case 'h': usage(stdout); return 0;
		case ':': return bad_usage("%s needs a value", bad_option(argv, o, sizeof(o)));
		default: return bad_usage("unknown option %s", bad_option(argv, o, sizeof(o)));
		}
	}
	if (optind >= argc)
		return bad_usage("no command given");
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		if (strcmp(argv[optind], commands[i].name) == 0)
			return commands[i].run(&ctl, argc - optind, argv + optind);
	char safe[64];
	return bad_usage("unknown command \"%s\"", printable(argv[optind], safe, sizeof(safe), 40));
}
