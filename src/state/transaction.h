/* SPDX-License-Identifier: Apache-2.0 */
/* Transaction files (.materialize, .keys/.get): each open is one request,
 * written as text, run at the first read, its result served by every
 * read. The request text lies in the holder's memory (src/restart/held.h), so that
 * a daemon that takes over reads what was written before it. */
#ifndef ARTFS_TRANSACTION_H
#define ARTFS_TRANSACTION_H

#include "state/base.h"

/* A transaction file's result (a .materialize .npy, a .get's envelopes):
 * its own mapping, so that close gives it back to the system rather than
 * to the heap, charged to materialize_max=. */
struct transaction_result {
	uint8_t *bytes;     /* NULL while nothing is mapped */
	size_t len;         /* bytes of the result, once it is complete */
	size_t map;         /* bytes mapped and charged */
};

/* The text a transaction file's writes send (a .materialize request, the
 * keys of a .get), grown as it comes and charged to materialize_max=. It
 * lies in the holder's memory, in the text of the handle's record there
 * (held.h), so that a daemon that takes over reads what was written. */
struct request_text {
	char *text;
	size_t len, cap;    /* cap bytes are charged to materialize_max= */
	bool held;          /* text is the held record's (else malloc'd: no record) */
};

/* A transaction file (.materialize, .keys/.get), the first member of its
 * module's handle: its writes send the request text, its first read runs
 * the request (run, once) and every read serves the result. */
struct transaction {
	struct handle h;
	pthread_mutex_t mu;
	int (*run)(struct tree *t, struct transaction *x); /* under mu */
	char who[160];              /* for logs: "materialize <wv>", "get .keys" */
	struct request_text req;    /* the request as written */
	bool done;                  /* the result (or error) is final */
	int error;
	struct transaction_result out;
};

void transaction_init(struct transaction *x, const struct handle_ops *ops,
		      int (*run)(struct tree *t, struct transaction *x));
/* Appends a write to the request: len, or -EINVAL once it has run (one
 * transaction per open) or not at the end, -EFBIG (past max bytes),
 * -ENOMEM (no memory, or materialize_max= reached). */
int transaction_append(struct tree *t, struct transaction *x, uint64_t off, const void *buf,
		       size_t len, size_t max);
/* The read operation of a transaction's handle: runs it at the first. */
int transaction_read(struct tree *t, struct handle *h, uint64_t off, size_t size,
		     const void **data, size_t *len);
/* Gives the result size bytes (nothing for 0), charged to materialize_max=,
 * not cleared (a kept buffer holds an earlier result's bytes): the caller
 * writes every one before it sets out.len, or frees the result. 0, or
 * -ENOMEM (logged; counted as refused when materialize_max= has no room
 * for them). */
int transaction_result_make(struct tree *t, struct transaction *x, size_t size);
void transaction_result_free(struct tree *t, struct transaction_result *r);
/* Unmaps the result buffers kept for reuse (at the tree's close). */
void transaction_results_drop(struct tree *t);
/* Logs a failure of the transaction ("<who>: msg (errno text)"); returns err. */
int transaction_fail(const struct transaction *x, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* A transaction file's handle, allocated here, its reads direct (its
 * result is not what was written): 0 or -ENOMEM. */
int transaction_open(const struct handle_ops *ops, int (*run)(struct tree *t, struct transaction *x),
		     const char *who, struct handle **h, struct open_reply *r);
/* The release of transaction_open's handle; a read that runs the request
 * is never quick. */
void transaction_release_free(struct tree *t, struct handle *h);
bool transaction_read_not_quick(struct tree *t, struct handle *h);
/* Frees what the transaction holds (not x itself). */
void transaction_release(struct tree *t, struct transaction *x);
/* A transaction (h, with its fh set) opened again by a daemon that takes
 * over: its request as written before, from the holder's memory; the
 * resume of its handle ops. 0, -ENOMEM. */
int transaction_resume(struct tree *t, struct handle *h);

#endif
