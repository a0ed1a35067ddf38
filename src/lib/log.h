/* SPDX-License-Identifier: Apache-2.0 */
/* Daemon log: stderr in the foreground, syslog once daemonized. */
#ifndef ARTFS_LOG_H
#define ARTFS_LOG_H

#include <syslog.h>

/* use_syslog: send lines to syslog(LOG_DAEMON) instead of stderr.
 * debug: also emit LOG_DEBUG lines. */
void log_init(int use_syslog, int debug);
void log_msg(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_err(...)   log_msg(LOG_ERR, __VA_ARGS__)
#define log_warn(...)  log_msg(LOG_WARNING, __VA_ARGS__)
#define log_info(...)  log_msg(LOG_INFO, __VA_ARGS__)
#define log_debug(...) log_msg(LOG_DEBUG, __VA_ARGS__)

#endif
