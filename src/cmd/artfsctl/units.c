/* SPDX-License-Identifier: Apache-2.0 */
/* artfsctl's numbers: a count on the command line, and sizes and
 * durations written for a person (1.5 GiB, 5m03s). */
#include "autoconf.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "cmd/artfsctl/artfsctl_i.h"

/* A positive decimal integer, nothing else. */
bool ctl_parse_positive(const char *s, uint64_t *out)
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

const char *ctl_human_bytes(uint64_t v, char *buf, size_t size)
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
const char *ctl_human_duration(uint64_t s, char *buf, size_t size)
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
