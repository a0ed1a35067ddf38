/* SPDX-License-Identifier: Apache-2.0 */
/* The fuzz targets' src/lib/log.c: every message is still formatted (a bad
 * argument shows under the sanitizers) but only printed with
 * ARTFS_FUZZ_LOG=1, so that a million refused inputs do not flood the
 * output. */
#include "autoconf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "lib/log.h"

static int verbose = -1;

void log_init(int use_syslog, int debug)
{
	(void)use_syslog;
	(void)debug;
}

void log_msg(int level, const char *fmt, ...)
{
	char line[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	if (verbose < 0) {
		const char *v = getenv("ARTFS_FUZZ_LOG");
		verbose = v && *v == '1';
	}
	if (verbose)
		fprintf(stderr, "artfs %d: %s\n", level, line);
}
