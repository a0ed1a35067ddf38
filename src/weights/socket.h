/* SPDX-License-Identifier: Apache-2.0 */
/* The mount's socket .artfs/attach (artfs/artfs.h, DESIGN.md §4, §8): an
 * engine that attached (ARTFS_IOC_ATTACH) connects, sends the token the
 * ioctl gave it and receives its rank's slab descriptors (SCM_RIGHTS).
 *
 * The listening socket is bound once per mount, in the mount itself, so
 * that whoever sees the mount can reach it (another container, no shared
 * PID or network namespace); the holder keeps it across daemons, and each
 * daemon serves it from a thread of its own. One request and one reply
 * per connection; a client that sends nothing within a second is cut off.
 * Descriptors a client passes are never received: a connection that holds
 * any is closed on a thread that nothing waits for (its close can block),
 * so that a client delays only itself, and an upgrade, which stops the
 * serving thread, none. What clients cause is logged a few lines a second. */
#ifndef ARTFS_ATTACH_H
#define ARTFS_ATTACH_H

#include <stddef.h>
#include <stdint.h>

#include "artfs/artfs.h"

/* What a token gives: new descriptors (the server closes them once sent). */
struct attach_slabs {
	uint32_t count;
	int fd[ARTFS_SLABS_MAX];
	uint64_t size[ARTFS_SLABS_MAX];
};

/* Resolves a token: 0 with out filled, or -errno for the reply. */
typedef int (*attach_resolve_fn)(void *ctx, const uint8_t token[ARTFS_ATTACH_TOKEN_SIZE],
				 struct attach_slabs *out);

/* len bytes received as a request: 0 with *req filled, or -EPROTO (not
 * exactly one request of this wire, abi other than ARTFS_ABI_VERSION). */
int attach_request_parse(const void *buf, size_t len, struct artfs_slabs_request *req);

/* Serves the one request of a connection: reads it (waiting timeout_ms at
 * most), resolves its token and replies (the descriptors with the reply).
 * 0 when a reply was sent (an error reply included), else -errno. */
int attach_serve_conn(int conn, attach_resolve_fn resolve, void *ctx, int timeout_ms);

/* A listening SOCK_SEQPACKET socket bound at path (what was there first
 * is unlinked). The descriptor, or -errno with why in err. */
int attach_socket_make(const char *path, char *err, size_t errlen);

/* The same, made by a child process: a daemon that binds in its own mount
 * asks itself (the mknod is a request it answers), and a thread of it that
 * waited for that answer when the daemon died would wait until a next
 * daemon answered, keeping the dead one from ending and so the next one
 * from starting. The child is killed with the daemon; what it asked is
 * answered by the next one. */
int attach_socket_make_apart(const char *path, char *err, size_t errlen);

/* Serves listen_fd (not taken: the caller closes it after stop) on a
 * thread of its own. NULL when the thread cannot start. */
struct attach_server *attach_server_start(int listen_fd, attach_resolve_fn resolve, void *ctx);
/* Stops accepting (a connection being served is finished first). */
void attach_server_stop(struct attach_server *s);

#endif
