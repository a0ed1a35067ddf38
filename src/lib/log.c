/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "lib/log.h"

static int log_to_syslog;
static int log_debug_on;

void log_init(int use_syslog, int debug)
{
	log_to_syslog = use_syslog;
	log_debug_on = debug;
	if (use_syslog)
		openlog("artfs", LOG_PID, LOG_DAEMON);
}

static const char *level_name(int level)
{
	switch (level) {
	case LOG_ERR: return "error";
	case LOG_WARNING: return "warning";
	case LOG_INFO: return "info";
	default: return "debug";
	}
}

void log_msg(int level, const char *fmt, ...)
{
	char line[1024];
	va_list ap;

	if (level == LOG_DEBUG && !log_debug_on)
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	if (log_to_syslog) {
		syslog(level, "%s", line);
		return;
	}
	struct timespec ts;
	struct tm tm;
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	/* One fprintf per line so that lines of concurrent threads do not mix. */
	fprintf(stderr, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ artfs %s: %s\n",
		tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
		tm.tm_sec, ts.tv_nsec / 1000000, level_name(level), line);
}
