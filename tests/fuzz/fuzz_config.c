/* SPDX-License-Identifier: Apache-2.0 */
/* The config file and options (README "Mounting"): config_load_file over a
 * file whose content is the input, config_set with any key and value, and
 * config_parse_size, compared with a plain reading of its grammar. A file
 * that loads must load again, to the same configuration, from the
 * `key = value` rendering that .artfs/config shows. */
#include "autoconf.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "fuzz.h"
#include "state/config.h"

#define FILE_MAX 9000

static const char *const keys[] = {
	"store", "capacity", "max_object", "ttl", "allow_quant", "uid", "gid", "umask",
	"weights.default", "weights.", "config", "mountpoint",
};

/* Digits, an optional K/M/G/T (an optional i after it), an optional B:
 * the value without a fraction, or -1 when the text is not of that form. */
static int plain_size(const char *s, uint64_t *out)
{
	uint64_t whole = 0, mult = 1;
	bool overflow = false;
	const char *p = s;

	if (!isdigit((unsigned char)*p))
		return -1;
	for (; isdigit((unsigned char)*p); p++)
		overflow |= __builtin_mul_overflow(whole, 10, &whole) ||
			    __builtin_add_overflow(whole, (uint64_t)(*p - '0'), &whole);
	const char *units = "KMGT", *u = *p ? strchr(units, toupper((unsigned char)*p)) : NULL;
	if (u) {
		mult = 1ull << (10 * (u - units + 1));
		p++;
		if (*p == 'i')
			p++;
	}
	if (*p == 'B' || *p == 'b')
		p++;
	if (*p)
		return -1;
	overflow |= __builtin_mul_overflow(whole, mult, &whole);
	if (overflow)
		return 1;
	*out = whole;
	return 0;
}

static void check_size(const char *text)
{
	uint64_t got = 0, want;
	int rc = config_parse_size(text, &got);
	int form = plain_size(text, &want);

	FZ_CHECK(rc == 0 || rc == -EINVAL);
	if (form == 0)
		FZ_CHECK(rc == 0 && got == want);
	else if (form == 1)
		FZ_CHECK(rc == -EINVAL);
	else if (rc == 0) {
		/* "1.5G": between the whole number of units and one unit more. */
		char copy[64];
		snprintf(copy, sizeof(copy), "%s", text);
		char *dot = strchr(copy, '.');
		FZ_CHECK(dot);
		size_t frac = strspn(dot + 1, "0123456789");
		memmove(dot, dot + 1 + frac, strlen(dot + 1 + frac) + 1);
		uint64_t low;
		FZ_CHECK(plain_size(copy, &low) == 0);
		uint64_t unit = 1;
		const char *u = strchr("KMGT", toupper((unsigned char)*dot));
		if (*dot && u)
			unit = 1ull << (10 * (u - "KMGT" + 1));
		FZ_CHECK(got >= low && got - low < unit);
	}
}

/* The rendering without the lines a file cannot set. */
static char *settable(const char *render)
{
	char *out = malloc(strlen(render) + 1), *o = out;

	for (const char *p = render; *p;) {
		const char *nl = strchr(p, '\n');
		size_t len = nl ? (size_t)(nl - p + 1) : strlen(p);
		if (strncmp(p, "mountpoint = ", 13) != 0 && strncmp(p, "config = ", 9) != 0) {
			memcpy(o, p, len);
			o += len;
		}
		p += len;
	}
	*o = '\0';
	return out;
}

static bool lines_shorter_than(const char *text, size_t max)
{
	for (const char *p = text; *p;) {
		const char *nl = strchr(p, '\n');
		size_t len = nl ? (size_t)(nl - p) : strlen(p);
		if (len >= max)
			return false;
		p += len + (nl != NULL);
	}
	return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static char path[300];
	struct fuzz_in in = { data, size };
	struct artfs_config c, again;
	char err[600], key[64], value[320], sizetext[48];
	const uint8_t *content;

	if (!path[0])
		snprintf(path, sizeof(path), "%s/artfs.conf", fz_scratch());

	/* 1. the file */
	size_t len = fz_bytes(&in, FILE_MAX, &content);
	FZ_CHECK(fz_write_file(path, content, len) == 0);
	config_init(&c);
	err[0] = '\0';
	int rc = config_load_file(&c, path, err, sizeof(err));
	FZ_CHECK(rc == 0 || rc == -EINVAL || rc == -ENOENT || rc == -ENOMEM);
	FZ_CHECK(rc == 0 || strncmp(err, path, strlen(path)) == 0);
	/* Read plainly: a NUL byte anywhere is refused, and a line is too
	 * long exactly when it holds more than 4094 bytes before its '\n'. */
	bool nul = len && memchr(content, '\0', len), too_long = false;
	for (size_t pos = 0, end; pos < len; pos = end + 1) {
		const uint8_t *nl = memchr(content + pos, '\n', len - pos);
		end = nl ? (size_t)(nl - content) : len;
		too_long |= end - pos > 4094;
	}
	if (nul || too_long)
		FZ_CHECK(rc < 0); /* -EINVAL, or the error of a line before */
	size_t elen = strlen(err);
	if (!too_long && rc < 0 && elen >= 15)
		FZ_CHECK(strcmp(err + elen - 15, ": line too long") != 0);
	char *render = config_render(&c);
	FZ_CHECK(render);
	if (rc == 0) {
		char *text = settable(render);
		/* config_load_file reads lines of up to 4094 bytes and '\n'. */
		if (lines_shorter_than(text, 4094)) {
			FZ_CHECK(fz_write_file(path, text, strlen(text)) == 0);
			config_init(&again);
			rc = config_load_file(&again, path, err, sizeof(err));
			if (rc != 0)
				fprintf(stderr, "reloading the rendering: %s\n", err);
			FZ_CHECK(rc == 0);
			char *render2 = config_render(&again);
			FZ_CHECK(render2 && strcmp(render, render2) == 0);
			free(render2);
			config_free(&again);
		}
		free(text);
	}
	free(render);

	/* 2. one option, as from the command line (-o key=value) or a file */
	uint8_t sel = fz_u8(&in);
	if (sel & 0x80)
		fz_str(&in, key, 40, 'x');
	else
		snprintf(key, sizeof(key), "%s", keys[sel % (sizeof(keys) / sizeof(keys[0]))]);
	fz_str(&in, value, 300, '0');
	err[0] = '\0';
	rc = config_set(&c, key, value, sel & 0x40, err, sizeof(err));
	FZ_CHECK(rc == 0 || rc == -EINVAL || rc == -ENOENT || rc == -ENOMEM);
	FZ_CHECK(rc == 0 || err[0] != '\0');
	FZ_CHECK(c.store && c.store[0] == '/' && c.capacity > 0 && c.max_object > 0);
	FZ_CHECK(c.ttl <= UINT32_MAX && c.umask <= 0777);
	render = config_render(&c);
	FZ_CHECK(render);
	free(render);
	config_free(&c);

	/* 3. a size */
	fz_str(&in, sizetext, 40, '0');
	check_size(sizetext);
	return 0;
}
