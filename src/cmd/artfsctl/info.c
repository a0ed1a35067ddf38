/* SPDX-License-Identifier: Apache-2.0 */
/* The daemon's .artfs/config and .artfs/metrics as artfsctl reads them:
 * a whole file, cut into bounded lines, each parsed as outside input
 * (config lines through the daemon's own option table, metrics lines in
 * the exposition format; unknown or malformed lines are skipped). */
#include "autoconf.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmd/artfsctl/artfsctl_i.h"
#include "format/key.h"
#include "state/config.h"
#include "state/metrics.h"

#define INFO_LINE_MAX 4096         /* longer lines of those files are skipped */

/* Reads a whole .artfs file; stat says 0 for them (like /proc), so it reads
 * to EOF. Returns 0 and a NUL-terminated malloc'd text, or -errno. */
int info_read(const struct ctl *ctl, const char *rel, char **text, size_t *len)
{
	char *path = ctl_path_in(ctl->mnt, rel);
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
void ctl_for_each_line(char *text, size_t len, void (*fn)(char *line, void *arg), void *arg)
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

void info_config_line(char *line, void *arg)
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

bool info_sample_parse(char *line, const char **name, const char **version, uint64_t *value)
{
	char *p = line;

	*version = NULL;
	while (*p == ' ' || *p == '\t')
		p++;
	if (!is_name_char(*p, true))
		return false; /* comments, blank and malformed lines */
	char *start = p;
	while (is_name_char(*p, false))
		p++;
	size_t name_len = (size_t)(p - start);
	if (*p == '{' && !parse_labels(&p, version))
		return false;
	if (*p != ' ' && *p != '\t')
		return false;
	start[name_len] = '\0';
	p = config_trim(p + 1);
	char *ts = strpbrk(p, " \t");  /* an optional timestamp follows the value */
	if (ts)
		*ts = '\0';
	if (!parse_value(p, value))
		return false;
	*name = start;
	return true;
}

void info_metrics_line(char *line, void *arg)
{
	struct metrics_view *m = arg;
	const char *name, *version;
	uint64_t value;

	if (!info_sample_parse(line, &name, &version, &value))
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
