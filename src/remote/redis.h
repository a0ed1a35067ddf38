/* SPDX-License-Identifier: Apache-2.0 */
/* One connection to one Redis server over hiredis, with artfs's own I/O so
 * that nothing waits past a deadline: non-blocking socket, poll(), hiredis
 * only for connecting and for parsing replies. Not thread-safe: its owner
 * holds it for a round. Deadlines are CLOCK_MONOTONIC nanoseconds. */
#ifndef ARTFS_REDIS_H
#define ARTFS_REDIS_H

#include <hiredis.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct redis_conn;

int64_t redis_now(void);

/* Most elements an array reply may have: hiredis 0.14 allocates room for
 * as many as a reply's header claims before they arrive. No reply artfs
 * asks for comes near it (CLUSTER SLOTS: at most one range per slot). */
#define REDIS_REPLY_ELEMENTS_MAX (1u << 16)

/* Makes r refuse (as out of memory, a protocol error to its caller) an
 * array longer than REDIS_REPLY_ELEMENTS_MAX; every connection's parser
 * is so bounded. */
void redis_reader_bound(redisReader *r);

/* Milliseconds left before deadline for poll(): 0 when past, rounded up. */
int redis_poll_ms(int64_t deadline);

/* Connects and, with a password, sends AUTH. Returns 0, -ETIMEDOUT,
 * -EACCES (AUTH refused), -ENOMEM or -EIO; err says why in words. */
int redis_conn_open(const char *host, int port, const char *password, int64_t deadline,
		    struct redis_conn **out, char *err, size_t errlen);
void redis_conn_close(struct redis_conn *c);

/* Queues one command (RESP array of bulk strings). -ENOMEM. */
int redis_conn_append(struct redis_conn *c, int argc, const char *const *argv,
		      const size_t *lens);

int redis_conn_fd(const struct redis_conn *c);
bool redis_conn_has_output(const struct redis_conn *c);

/* Writes what the socket takes now / reads what has arrived (one read, and
 * none while what the last one brought is not parsed); neither waits.
 * Returns 0 or -EIO (err in redis_conn_error). */
int redis_conn_send(struct redis_conn *c);
int redis_conn_receive(struct redis_conn *c);

/* The next parsed reply, or NULL in *reply when none is complete in what
 * was received. Returns 0 or -EIO (protocol error). Free with
 * freeReplyObject. */
int redis_conn_reply(struct redis_conn *c, redisReply **reply);

/* Sends one command and waits for its reply until deadline: for AUTH and
 * CLUSTER SLOTS. Returns 0, -ETIMEDOUT or -EIO. */
int redis_conn_call(struct redis_conn *c, int64_t deadline, int argc, const char *const *argv,
		    const size_t *lens, redisReply **reply);

/* Bytes sent and received since the last call; resets them. */
void redis_conn_take_bytes(struct redis_conn *c, uint64_t *sent, uint64_t *received);

/* Why the last call failed, in words. */
const char *redis_conn_error(const struct redis_conn *c);

#endif
