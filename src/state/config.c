/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <ctype.h>
#include <stddef.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/key.h"
#include "state/config.h"

int config_parse_size(const char *text, uint64_t *out)
{
	uint64_t whole = 0, frac = 0, frac_scale = 1, mult = 1;
	const char *p = text;

	if (!text || !isdigit((unsigned char)*p))
		return -EINVAL;
	for (; isdigit((unsigned char)*p); p++)
		if (__builtin_mul_overflow(whole, 10, &whole) ||
		    __builtin_add_overflow(whole, (uint64_t)(*p - '0'), &whole))
			return -EINVAL;
	if (*p == '.') {
		p++;
		if (!isdigit((unsigned char)*p))
			return -EINVAL;
		for (; isdigit((unsigned char)*p); p++)
			if (frac_scale < 1000000000ULL) {
				frac = frac * 10 + (uint64_t)(*p - '0');
				frac_scale *= 10;
			}
	}
	switch (toupper((unsigned char)*p)) {
	case 'K': mult = 1ULL << 10; p++; break;
	case 'M': mult = 1ULL << 20; p++; break;
	case 'G': mult = 1ULL << 30; p++; break;
	case 'T': mult = 1ULL << 40; p++; break;
	default: break;
	}
	if (mult > 1 && *p == 'i')
		p++;
	if (*p == 'B' || *p == 'b')
		p++;
	if (*p != '\0')
		return -EINVAL;
	uint64_t bytes;
	if (__builtin_mul_overflow(whole, mult, &bytes) ||
	    __builtin_add_overflow(bytes, (uint64_t)((unsigned __int128)frac * mult / frac_scale),
				   &bytes))
		return -EINVAL;
	*out = bytes;
	return 0;
}

static int parse_uint(const char *text, int base, uint64_t max, uint64_t *out)
{
	char *end;

	if (!text || !*text || !isdigit((unsigned char)text[0]))
		return -EINVAL;
	errno = 0;
	unsigned long long v = strtoull(text, &end, base);
	if (errno || *end || v > max)
		return -EINVAL;
	*out = v;
	return 0;
}

static int set_string(char **dst, const char *value)
{
	char *copy = strdup(value);

	if (!copy)
		return -ENOMEM;
	free(*dst);
	*dst = copy;
	return 0;
}

static int add_weights(struct artfs_config *c, const char *version, const char *dir,
		       char *err, size_t errlen)
{
	if (!key_version_name_valid(version)) {
		snprintf(err, errlen, "weights.%s: not a valid weight version name", version);
		return -EINVAL;
	}
	struct config_weights *w = realloc(c->weights, (c->nweights + 1) * sizeof(*w));
	if (!w)
		return -ENOMEM;
	c->weights = w;
	w[c->nweights].version = strdup(version);
	w[c->nweights].dir = strdup(dir);
	if (!w[c->nweights].version || !w[c->nweights].dir) {
		free(w[c->nweights].version);
		free(w[c->nweights].dir);
		return -ENOMEM;
	}
	c->nweights++;
	return 0;
}

/* Defaults that follow other options, or the daemon. */
static uint64_t daemon_uid(const struct artfs_config *c)
{
	(void)c;
	return getuid();
}

static uint64_t daemon_gid(const struct artfs_config *c)
{
	(void)c;
	return getgid();
}

static uint64_t quarter_capacity(const struct artfs_config *c)
{
	return c->capacity / 4 > MATERIALIZE_MAX_FLOOR ? c->capacity / 4 : MATERIALIZE_MAX_FLOOR;
}

static uint64_t capacity_quarter(const struct artfs_config *c)
{
	return c->capacity / 4;
}

static uint64_t same_as_max_object(const struct artfs_config *c)
{
	return c->max_object;
}

static uint64_t same_as_ttl(const struct artfs_config *c)
{
	return c->ttl;
}

/* Every option artfs takes: its defaults, parsing, .artfs/config, the
 * usage text and artfsctl's view all come from this table. */
#define FIELD(f) offsetof(struct artfs_config, f)
const struct config_option config_options[] = {
	{ .name = "store", .kind = CONFIG_PATH, .offset = FIELD(store),
	  .initial = CONFIG_DEFAULT_STORE, .flags = CONFIG_REQUIRED,
	  .arg = "DIR", .help = "store directory, created 0700" },
	{ .name = "capacity", .kind = CONFIG_SIZE, .offset = FIELD(capacity), .initial = "8G",
	  .arg = "SIZE", .help = "bytes of committed objects" },
	{ .name = "max_object", .kind = CONFIG_SIZE, .offset = FIELD(max_object), .initial = "64M",
	  .arg = "SIZE", .help = "bytes of one published object" },
	{ .name = "materialize_max", .kind = CONFIG_SIZE, .offset = FIELD(materialize_max),
	  .derived = quarter_capacity,
	  .arg = "SIZE", .help = "bytes open .materialize, .get and .put files may hold at once\n"
	  "                           (default capacity/4, at least 64M)" },
	{ .name = "cache_capacity", .kind = CONFIG_SIZE, .offset = FIELD(cache_capacity),
	  .derived = capacity_quarter,
	  .arg = "SIZE", .help = "bytes of the .cache/ tree; least recently opened files go first\n"
	  "                           (default capacity/4)" },
	{ .name = "cache_max_file", .kind = CONFIG_SIZE, .offset = FIELD(cache_max_file),
	  .derived = same_as_max_object,
	  .arg = "SIZE", .help = "bytes of one .cache/ file (default max_object=)" },
	{ .name = "blocks_capacity", .kind = CONFIG_SIZE, .offset = FIELD(blocks_capacity),
	  .derived = capacity_quarter,
	  .arg = "SIZE", .help = "bytes of the .blocks/ tree; full is ENOSPC, nothing evicted\n"
	  "                           (default capacity/4)" },
	{ .name = "ttl", .kind = CONFIG_SECONDS, .offset = FIELD(ttl), .initial = "3600",
	  .arg = "SECONDS", .help = "idle time before a version is collected, 0 = never" },
	{ .name = "allow_quant", .kind = CONFIG_TEXT, .offset = FIELD(allow_quant), .initial = "",
	  .arg = "LIST", .help = "quantization methods served zero-copy besides unquantized and fp8" },
	/* A path, so absolute: each daemon reads it again, from / when the
	 * holder runs in the background. */
	{ .name = "config", .kind = CONFIG_PATH, .offset = FIELD(config_file),
	  .flags = CONFIG_COMMAND_LINE,
	  .arg = "FILE", .help = "`key = value` lines with any option, and weights.<wv> = <dir>" },
	{ .name = "remote", .kind = CONFIG_TEXT, .offset = FIELD(remote),
	  .arg = "HOST:PORT,...",
	  .help = "Redis Cluster seed nodes: R3 objects readable on every node (default: none)" },
	{ .name = "remote_prefix", .kind = CONFIG_TEXT, .offset = FIELD(remote_prefix),
	  .initial = "artfs",
	  .arg = "NAME", .help = "key namespace of this deployment in the cluster" },
	{ .name = "remote_ttl", .kind = CONFIG_SECONDS, .offset = FIELD(remote_ttl),
	  .derived = same_as_ttl,
	  .arg = "SECONDS",
	  .help = "expiry of values written to the cluster, 0 = never (default: ttl=)" },
	{ .name = "remote_timeout", .kind = CONFIG_SECONDS, .offset = FIELD(remote_timeout),
	  .initial = "2",
	  .arg = "SECONDS", .help = "bound of one cluster call; unreachable within it is EIO" },
	{ .name = "remote_auth", .kind = CONFIG_PATH, .offset = FIELD(remote_auth),
	  .arg = "FILE", .help = "file whose first line is the cluster's AUTH password" },
	{ .name = "uid", .kind = CONFIG_ID, .offset = FIELD(uid), .derived = daemon_uid,
	  .arg = "N", .help = "owner shown for every entry but .artfs/control, which stays\n"
	  "                           the daemon's (default: the daemon's)" },
	{ .name = "gid", .kind = CONFIG_ID, .offset = FIELD(gid), .derived = daemon_gid,
	  .arg = "N", .help = "group shown for every entry (default: the daemon's)" },
	{ .name = "umask", .kind = CONFIG_OCTAL, .offset = FIELD(umask), .initial = "022",
	  .arg = "OCTAL", .help = "mode bits removed from every entry" },
	{ .name = "resend", .kind = CONFIG_BOOL, .offset = FIELD(resend), .initial = "1",
	  .arg = "0|1", .help = "after a daemon dies, the next has the kernel send again what it\n"
	  "                           had read (1); 0 answers those requests EIO" },
};
#undef FIELD
const size_t config_option_count = sizeof(config_options) / sizeof(config_options[0]);

const struct config_option *config_option_find(const char *name, unsigned *bit)
{
	for (size_t i = 0; i < config_option_count; i++)
		if (strcmp(config_options[i].name, name) == 0) {
			if (bit)
				*bit = 1u << i;
			return &config_options[i];
		}
	return NULL;
}

static bool holds_text(const struct config_option *o)
{
	return o->kind == CONFIG_PATH || o->kind == CONFIG_TEXT;
}

/* A number into the option's field, at the field's width. */
static void store_number(const struct config_option *o, void *field, uint64_t n)
{
	switch (o->kind) {
	case CONFIG_ID:
		*(uint32_t *)field = (uint32_t)n;
		break;
	case CONFIG_OCTAL:
		*(mode_t *)field = (mode_t)n;
		break;
	default:
		*(uint64_t *)field = n;
	}
}

static int set_text(const struct config_option *o, void *field, const char *value, char *err,
		    size_t errlen)
{
	if (o->kind == CONFIG_PATH) {
		if (!value[0] && !(o->flags & CONFIG_REQUIRED)) {
			free(*(char **)field); /* empty: not set (as .artfs/config shows it) */
			*(char **)field = NULL;
			return 0;
		}
		if (value[0] != '/') {
			snprintf(err, errlen, "%s=%s: must be an absolute path", o->name, value);
			return -EINVAL;
		}
	}
	if (set_string(field, value) < 0) {
		snprintf(err, errlen, "%s: out of memory", o->name);
		return -ENOMEM;
	}
	return 0;
}

static int set_value(struct artfs_config *c, const struct config_option *o, const char *value,
		     char *err, size_t errlen)
{
	void *field = (char *)c + o->offset;
	uint64_t n;

	switch (o->kind) {
	case CONFIG_PATH:
	case CONFIG_TEXT:
		return set_text(o, field, value, err, errlen);
	case CONFIG_SIZE:
		if (config_parse_size(value, &n) < 0 || n == 0) {
			snprintf(err, errlen, "%s=%s: not a size (e.g. 8G, 64M, 4096)", o->name, value);
			return -EINVAL;
		}
		break;
	case CONFIG_SECONDS:
		if (parse_uint(value, 10, UINT32_MAX, &n) < 0) {
			snprintf(err, errlen, "%s=%s: not a number of seconds", o->name, value);
			return -EINVAL;
		}
		break;
	case CONFIG_ID:
		if (parse_uint(value, 10, UINT32_MAX - 1, &n) < 0) {
			snprintf(err, errlen, "%s=%s: not a numeric id", o->name, value);
			return -EINVAL;
		}
		break;
	case CONFIG_OCTAL:
		if (parse_uint(value, 8, 0777, &n) < 0) {
			snprintf(err, errlen, "%s=%s: not an octal mode", o->name, value);
			return -EINVAL;
		}
		break;
	case CONFIG_BOOL:
		if (parse_uint(value, 10, 1, &n) < 0) {
			snprintf(err, errlen, "%s=%s: not 0 or 1", o->name, value);
			return -EINVAL;
		}
		break;
	default:
		return -EINVAL;
	}
	store_number(o, field, n);
	return 0;
}

void config_init(struct artfs_config *c)
{
	char err[128];

	memset(c, 0, sizeof(*c));
	for (size_t i = 0; i < config_option_count; i++)
		if (config_options[i].initial)
			set_value(c, &config_options[i], config_options[i].initial, err, sizeof(err));
	config_finish(c);
}

void config_free(struct artfs_config *c)
{
	for (size_t i = 0; i < config_option_count; i++)
		if (holds_text(&config_options[i]))
			free(*(char **)((char *)c + config_options[i].offset));
	free(c->mountpoint);
	for (unsigned i = 0; i < c->nweights; i++) {
		free(c->weights[i].version);
		free(c->weights[i].dir);
	}
	free(c->weights);
	memset(c, 0, sizeof(*c));
}

int config_set(struct artfs_config *c, const char *key, const char *value, bool from_file,
	       char *err, size_t errlen)
{
	unsigned bit;

	if (strncmp(key, "weights.", 8) == 0 && from_file)
		return add_weights(c, key + 8, value, err, errlen);
	const struct config_option *o = config_option_find(key, &bit);
	if (!o || (from_file && (o->flags & CONFIG_COMMAND_LINE))) {
		snprintf(err, errlen, "unknown option \"%s\"", key);
		return -ENOENT;
	}
	if (from_file && (c->set & bit))
		return 0; /* the command line wins */
	int rc = set_value(c, o, value, err, errlen);
	if (rc == 0 && !from_file)
		c->set |= bit;
	if (rc == 0)
		c->given |= bit;
	return rc;
}

void config_finish(struct artfs_config *c)
{
	for (size_t i = 0; i < config_option_count; i++) {
		const struct config_option *o = &config_options[i];
		if (o->derived && !(c->given & (1u << i)))
			store_number(o, (char *)c + o->offset, o->derived(c));
	}
}

void config_usage(FILE *f)
{
	for (size_t i = 0; i < config_option_count; i++) {
		const struct config_option *o = &config_options[i];
		char left[40];
		snprintf(left, sizeof(left), "%s=%s", o->name, o->arg);
		fprintf(f, "    %-22s %s", left, o->help);
		if (o->initial && o->initial[0])
			fprintf(f, " (default %s)", o->initial);
		fputc('\n', f);
	}
}

static void render_value(FILE *f, const struct artfs_config *c, const struct config_option *o)
{
	const void *field = (const char *)c + o->offset;

	switch (o->kind) {
	case CONFIG_PATH:
	case CONFIG_TEXT: {
		const char *v = *(char *const *)field;
		fprintf(f, "%s", v ? v : "");
		break;
	}
	case CONFIG_SIZE:
	case CONFIG_SECONDS:
	case CONFIG_BOOL:
		fprintf(f, "%" PRIu64, *(const uint64_t *)field);
		break;
	case CONFIG_ID:
		fprintf(f, "%u", (unsigned)*(const uint32_t *)field);
		break;
	case CONFIG_OCTAL:
		fprintf(f, "%03o", (unsigned)*(const mode_t *)field);
		break;
	}
}

char *config_trim(char *s)
{
	while (isspace((unsigned char)*s))
		s++;
	char *e = s + strlen(s);
	while (e > s && isspace((unsigned char)e[-1]))
		*--e = '\0';
	return s;
}

int config_load_file(struct artfs_config *c, const char *path, char *err, size_t errlen)
{
	FILE *f = fopen(path, "re");
	char line[4096], msg[512];
	unsigned lineno = 0;
	int rc = 0;

	if (!f) {
		rc = -errno;
		snprintf(err, errlen, "config %s: %s", path, strerror(errno));
		return rc;
	}
	/* fgets cannot tell a NUL byte from the end of what it read: compare
	 * the bytes it consumed with the length of the string it gave. */
	long at = ftell(f);
	while (fgets(line, sizeof(line), f)) {
		long next = ftell(f);
		lineno++;
		if (at >= 0 && next >= 0 && (long)strlen(line) != next - at) {
			snprintf(err, errlen, "%s:%u: NUL byte", path, lineno);
			rc = -EINVAL;
			break;
		}
		at = next;
		if (!strchr(line, '\n') && !feof(f)) {
			snprintf(err, errlen, "%s:%u: line too long", path, lineno);
			rc = -EINVAL;
			break;
		}
		char *s = config_trim(line);
		if (*s == '\0' || *s == '#')
			continue;
		char *eq = strchr(s, '=');
		if (!eq) {
			snprintf(err, errlen, "%s:%u: expected key = value", path, lineno);
			rc = -EINVAL;
			break;
		}
		*eq = '\0';
		char *key = config_trim(s), *value = config_trim(eq + 1);
		rc = config_set(c, key, value, true, msg, sizeof(msg));
		if (rc < 0) {
			snprintf(err, errlen, "%s:%u: %s", path, lineno, msg);
			break;
		}
	}
	fclose(f);
	return rc;
}

char *config_render(const struct artfs_config *c)
{
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);

	if (!f)
		return NULL;
	fprintf(f, "mountpoint = %s\n", c->mountpoint ? c->mountpoint : "");
	for (size_t i = 0; i < config_option_count; i++) {
		fprintf(f, "%s = ", config_options[i].name);
		render_value(f, c, &config_options[i]);
		fputc('\n', f);
	}
	for (unsigned i = 0; i < c->nweights; i++)
		fprintf(f, "weights.%s = %s\n", c->weights[i].version, c->weights[i].dir);
	if (fclose(f) != 0) {
		free(text);
		return NULL;
	}
	return text;
}
