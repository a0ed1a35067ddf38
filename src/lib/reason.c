/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <stdarg.h>
#include <stdio.h>

#include "lib/reason.h"

int reason(int rc, char *buf, size_t len, const char *fmt, ...)
{
	va_list ap;

	if (buf && len) {
		va_start(ap, fmt);
		vsnprintf(buf, len, fmt, ap);
		va_end(ap);
	}
	return rc;
}
