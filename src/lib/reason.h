/* SPDX-License-Identifier: Apache-2.0 */
/* A failure that explains itself: the reason goes into the caller's buffer
 * (when it gave one) and the error code comes back, so that a parser can
 * `return reason(-EINVAL, err, errlen, "...", ...)` at the place that knows. */
#ifndef ARTFS_REASON_H
#define ARTFS_REASON_H

#include <stddef.h>

int reason(int rc, char *buf, size_t len, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

#endif
