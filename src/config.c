#include "autoconf.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "key.h"

enum {
	SET_STORE = 1 << 0,
	SET_CAPACITY = 1 << 1,
	SET_MAX_OBJECT = 1 << 2,
	SET_TTL = 1 << 3,
	SET_ALLOW_QUANT = 1 << 4,
	SET_UID = 1 << 5,
	SET_GID = 1 << 6,
	SET_UMASK = 1 << 7,
};

void config_init(struct artfs_config *c)
{
	memset(c, 0, sizeof(*c));
	c->store = strdup(CONFIG_DEFAULT_STORE);
	c->capacity = 8ULL << 30;
	c->max_object = 64ULL << 20;
	c->ttl = 3600;
	c->allow_quant = strdup("");
	c->uid = getuid();
	c->gid = getgid();
	c->umask = 022;
}

void config_free(struct artfs_config *c)
{
	free(c->store);
	free(c->allow_quant);
	free(c->config_file);
	free(c->mountpoint);
	for (unsigned i = 0; i < c->nweights; i++) {
		free(c->weights[i].version);
		free(c->weights[i].dir);
	}
	free(c->weights);
	memset(c, 0, sizeof(*c));
}

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

int config_set(struct artfs_config *c, const char *key, const char *value, bool from_file,
	       char *err, size_t errlen)
{
	uint64_t n;
	unsigned bit;

	if (strncmp(key, "weights.", 8) == 0 && from_file)
		return add_weights(c, key + 8, value, err, errlen);

	if (strcmp(key, "store") == 0)
		bit = SET_STORE;
	else if (strcmp(key, "capacity") == 0)
		bit = SET_CAPACITY;
	else if (strcmp(key, "max_object") == 0)
		bit = SET_MAX_OBJECT;
	else if (strcmp(key, "ttl") == 0)
		bit = SET_TTL;
	else if (strcmp(key, "allow_quant") == 0)
		bit = SET_ALLOW_QUANT;
	else if (strcmp(key, "uid") == 0)
		bit = SET_UID;
	else if (strcmp(key, "gid") == 0)
		bit = SET_GID;
	else if (strcmp(key, "umask") == 0)
		bit = SET_UMASK;
	else {
		snprintf(err, errlen, "unknown option \"%s\"", key);
		return -ENOENT;
	}
	if (from_file && (c->set & bit))
		return 0; /* the command line wins */

	int rc = 0;
	switch (bit) {
	case SET_STORE:
		if (value[0] != '/') {
			snprintf(err, errlen, "store=%s: must be an absolute path", value);
			return -EINVAL;
		}
		rc = set_string(&c->store, value);
		break;
	case SET_CAPACITY:
	case SET_MAX_OBJECT:
		if (config_parse_size(value, &n) < 0 || n == 0) {
			snprintf(err, errlen, "%s=%s: not a size (e.g. 8G, 64M, 4096)", key, value);
			return -EINVAL;
		}
		*(bit == SET_CAPACITY ? &c->capacity : &c->max_object) = n;
		break;
	case SET_TTL:
		if (parse_uint(value, 10, UINT32_MAX, &n) < 0) {
			snprintf(err, errlen, "ttl=%s: not a number of seconds", value);
			return -EINVAL;
		}
		c->ttl = n;
		break;
	case SET_ALLOW_QUANT:
		rc = set_string(&c->allow_quant, value);
		break;
	case SET_UID:
	case SET_GID:
		if (parse_uint(value, 10, UINT32_MAX - 1, &n) < 0) {
			snprintf(err, errlen, "%s=%s: not a numeric id", key, value);
			return -EINVAL;
		}
		if (bit == SET_UID)
			c->uid = (uid_t)n;
		else
			c->gid = (gid_t)n;
		break;
	case SET_UMASK:
		if (parse_uint(value, 8, 0777, &n) < 0) {
			snprintf(err, errlen, "umask=%s: not an octal mode", value);
			return -EINVAL;
		}
		c->umask = (mode_t)n;
		break;
	}
	if (rc < 0) {
		snprintf(err, errlen, "%s: out of memory", key);
		return rc;
	}
	if (!from_file)
		c->set |= bit;
	return 0;
}

static char *trim(char *s)
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
		char *s = trim(line);
		if (*s == '\0' || *s == '#')
			continue;
		char *eq = strchr(s, '=');
		if (!eq) {
			snprintf(err, errlen, "%s:%u: expected key = value", path, lineno);
			rc = -EINVAL;
			break;
		}
		*eq = '\0';
		char *key = trim(s), *value = trim(eq + 1);
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
	fprintf(f, "store = %s\n", c->store);
	fprintf(f, "capacity = %" PRIu64 "\n", c->capacity);
	fprintf(f, "max_object = %" PRIu64 "\n", c->max_object);
	fprintf(f, "ttl = %" PRIu64 "\n", c->ttl);
	fprintf(f, "allow_quant = %s\n", c->allow_quant);
	fprintf(f, "config = %s\n", c->config_file ? c->config_file : "");
	fprintf(f, "uid = %u\n", (unsigned)c->uid);
	fprintf(f, "gid = %u\n", (unsigned)c->gid);
	fprintf(f, "umask = %03o\n", (unsigned)c->umask);
	for (unsigned i = 0; i < c->nweights; i++)
		fprintf(f, "weights.%s = %s\n", c->weights[i].version, c->weights[i].dir);
	if (fclose(f) != 0) {
		free(text);
		return NULL;
	}
	return text;
}
