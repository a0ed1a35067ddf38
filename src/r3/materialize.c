/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/key.h"
#include "format/npy.h"
#include "lib/log.h"
#include "lib/parallel.h"
#include "r3/fetch.h"
#include "r3/materialize.h"
#include "r3/object.h"
#include "state/transaction.h"

/* A .materialize file: its request names objects, its result is the .npy
 * of their concatenation. */
struct mat {
	struct transaction x;     /* first: the handle */
	struct version *ver;      /* referenced */
};

/* ---- the request text ---------------------------------------------------- */

static int parse_number(const char *s, uint64_t *out)
{
	char *end;

	if (!isdigit((unsigned char)*s))
		return -EINVAL;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || *end)
		return -EINVAL;
	*out = v;
	return 0;
}

/* The next line of text from *pos, without its surrounding spaces:
 * its start and length; *pos moves past it. */
static size_t next_line(const char *text, size_t len, size_t *pos, const char **line)
{
	const char *nl = memchr(text + *pos, '\n', len - *pos);
	size_t end = nl ? (size_t)(nl - text) : len, n = end - *pos;
	const char *s = text + *pos;

	while (n && isspace((unsigned char)*s))
		s++, n--;
	while (n && isspace((unsigned char)s[n - 1]))
		n--;
	*pos = end + 1;
	*line = s;
	return n;
}

/* A line "keyword value" (line cut at the space): token_end, block_size. */
static int parse_keyword(char *line, char *space, size_t lineno, struct materialize_request *req,
			 char *err, size_t errlen)
{
	char *value = space + 1;
	bool *has;
	uint64_t *dst;

	*space = '\0';
	while (isspace((unsigned char)*value))
		value++;
	if (strcmp(line, "token_end") == 0)
		has = &req->has_token_end, dst = &req->token_end;
	else if (strcmp(line, "block_size") == 0)
		has = &req->has_block_size, dst = &req->block_size;
	else {
		snprintf(err, errlen, "line %zu: unknown keyword \"%.32s\"", lineno, line);
		return -EINVAL;
	}
	if (*has || parse_number(value, dst) < 0 || *dst == 0) {
		snprintf(err, errlen, "line %zu: %s needs one positive integer", lineno, line);
		return -EINVAL;
	}
	*has = true;
	return 0;
}

/* A line that names an object by its hash: one more block (*cap: the
 * blocks that req->blocks has room for). */
static int parse_block(const char *line, size_t lineno, struct materialize_request *req,
		       size_t *cap, char *err, size_t errlen)
{
	size_t hlen;

	if (req->count == MATERIALIZE_BLOCKS_MAX) {
		snprintf(err, errlen, "more than %u objects", MATERIALIZE_BLOCKS_MAX);
		return -EINVAL;
	}
	if (req->count == *cap) {
		size_t more = *cap ? *cap * 2 : 64;
		struct materialize_block *b = realloc(req->blocks, more * sizeof(*b));
		if (!b) {
			snprintf(err, errlen, "out of memory");
			return -ENOMEM;
		}
		req->blocks = b;
		*cap = more;
	}
	if (key_hash_decode(line, req->blocks[req->count].hash, &hlen) < 0) {
		snprintf(err, errlen, "line %zu: \"%.40s\" is not a block hash", lineno, line);
		return -EINVAL;
	}
	req->blocks[req->count++].len = (uint8_t)hlen;
	return 0;
}

int materialize_parse(const char *text, size_t len, struct materialize_request *req,
		      char *err, size_t errlen)
{
	size_t cap = 0, lineno = 0;
	char line[ARTFS_HASH_HEX_MAX + 64];
	int rc = 0;

	memset(req, 0, sizeof(*req));
	for (size_t pos = 0; pos < len && rc == 0;) {
		const char *start;
		size_t n = next_line(text, len, &pos, &start);
		lineno++;
		if (n >= sizeof(line)) {
			snprintf(err, errlen, "line %zu: too long", lineno);
			rc = -EINVAL;
			break;
		}
		if (n == 0)
			continue;
		memcpy(line, start, n);
		line[n] = '\0';
		if (memchr(line, '\0', n)) {
			snprintf(err, errlen, "line %zu: NUL byte", lineno);
			rc = -EINVAL;
			break;
		}
		char *space = strpbrk(line, " \t");
		rc = space ? parse_keyword(line, space, lineno, req, err, errlen)
			   : parse_block(line, lineno, req, &cap, err, errlen);
	}
	if (rc == 0 && req->count == 0) {
		snprintf(err, errlen, "no object hashes");
		rc = -EINVAL;
	}
	if (rc < 0)
		materialize_request_free(req);
	return rc;
}

void materialize_request_free(struct materialize_request *req)
{
	free(req->blocks);
	memset(req, 0, sizeof(*req));
}

int materialize_check(const struct materialize_request *req, const struct envelope *envs,
		      uint64_t *token_end_out, char *err, size_t errlen)
{
	uint64_t block_size = req->has_block_size ? req->block_size : envs[0].array.shape[0];
	uint64_t total = 0, start = 0;

	for (size_t i = 0; i < req->count; i++)
		total += envs[i].array.shape[0];
	uint64_t token_end = req->has_token_end ? req->token_end : total;

	for (size_t i = 0; i < req->count; i++) {
		const struct envelope *e = &envs[i];
		uint64_t rows = e->array.shape[0];
		uint64_t want = token_end - start < block_size ? token_end - start : block_size;
		if (e->source_token_start != start) {
			snprintf(err, errlen, "object %zu starts at token %" PRIu64 ", expected %" PRIu64,
				 i, e->source_token_start, start);
			return -EBADMSG;
		}
		if (start >= token_end || rows != want) {
			snprintf(err, errlen, "object %zu has %" PRIu64 " rows, expected %" PRIu64
				 " (block_size %" PRIu64 ", token_end %" PRIu64 ")",
				 i, rows, start >= token_end ? 0 : want, block_size, token_end);
			return -EBADMSG;
		}
		uint8_t kind = rows == block_size ? ENVELOPE_BLOCK : ENVELOPE_TAIL;
		if (e->kind != kind) {
			snprintf(err, errlen, "object %zu is a %s, expected a %s", i,
				 envelope_kind_name(e->kind), envelope_kind_name(kind));
			return -EBADMSG;
		}
		if (memcmp(e->array.dtype, envs[0].array.dtype, 4) != 0 ||
		    e->array.ndim != envs[0].array.ndim ||
		    memcmp(e->array.shape + 1, envs[0].array.shape + 1,
			   (size_t)(e->array.ndim - 1) * sizeof(uint64_t)) != 0) {
			char a[ARRAY_SHAPE_TEXT_MAX], b[ARRAY_SHAPE_TEXT_MAX];
			array_shape_text(&envs[0].array, a, sizeof(a));
			array_shape_text(&e->array, b, sizeof(b));
			snprintf(err, errlen, "object %zu is %s (%s), object 0 is %s (%s)", i,
				 e->array.dtype, b, envs[0].array.dtype, a);
			return -EBADMSG;
		}
		start += rows;
	}
	if (start != token_end) {
		snprintf(err, errlen, "objects hold %" PRIu64 " rows, token_end is %" PRIu64,
			 start, token_end);
		return -EBADMSG;
	}
	*token_end_out = token_end;
	return 0;
}

/* ---- running a request ----------------------------------------------------- */

/* First the headers of every object (small), and the layout over them;
 * then the result is allocated once, under materialize_max=, and each
 * payload is read straight into its place and verified there. So a request
 * holds its result and nothing else, and gives it back at close. A request
 * that fails its layout is still verified whole (streaming), so that a
 * corrupt object says EIO before a bad layout says EBADMSG. */
struct slot {
	struct envelope env;
	uint64_t at;             /* offset of its payload in the result */
	int error;
};

enum pass { PASS_HEADERS, PASS_VERIFY, PASS_LOAD };

struct job {
	struct tree *t;
	struct mat *m;
	struct version *ver;
	const struct materialize_request *req;
	struct slot *slots;
	const size_t *which;     /* the slots to work on, or NULL for all */
	size_t count;
	enum pass pass;
	uint8_t *out;            /* PASS_LOAD: the result */
	uint8_t **fetched;       /* per block: its envelope as just fetched from
				  * the cluster and committed here, or NULL */
	size_t *fetched_len;
	size_t *distinct_at;     /* one block of each distinct object (resolve) */
	size_t distinct;
	size_t repeat, first;    /* the first block that repeats one before it,
				  * and that one; repeat == req->count: none */
};

/* A block fetched from the cluster by this request is served from the bytes
 * that were validated (key, size, SHA-256) and committed as it arrived,
 * instead of reading back the file just written. */
static int work_fetched(struct job *j, size_t i)
{
	const uint8_t *v = j->fetched[i];
	struct slot *sl = &j->slots[i];
	char detail[128];

	switch (j->pass) {
	case PASS_HEADERS:
		if (envelope_parse(v, j->fetched_len[i], &sl->env, detail, sizeof(detail)) != ENVELOPE_OK ||
		    envelope_total_len(&sl->env) != j->fetched_len[i])
			return -EIO; /* cannot be: it passed a publish's checks */
		return 0;
	case PASS_VERIFY:
		return 0;
	default:
		memcpy(j->out + sl->at, v + ENVELOPE_PREFIX_LEN + sl->env.header_len,
		       (size_t)sl->env.payload_len);
		return 0;
	}
}

static int work_one(struct job *j, size_t i)
{
	const struct materialize_block *b = &j->req->blocks[i];
	struct slot *sl = &j->slots[i];

	if (j->fetched && j->fetched[i])
		return work_fetched(j, i);
	switch (j->pass) {
	case PASS_HEADERS:
		return object_read_meta(j->t, j->ver, b->hash, b->len, &sl->env);
	case PASS_VERIFY:
		return object_verify(j->t, j->ver, b->hash, b->len, &sl->env, NULL);
	default:
		return object_verify(j->t, j->ver, b->hash, b->len, &sl->env, j->out + sl->at);
	}
}

static void work_item(void *ctx, size_t k)
{
	struct job *j = ctx;
	size_t i = j->which ? j->which[k] : k;

	j->slots[i].error = work_one(j, i);
}

/* Runs one pass of the job on several threads. */
static void run_pass(struct job *j, enum pass pass)
{
	j->pass = pass;
	parallel_for(j->count, 64, PARALLEL_THREADS_MAX, work_item, j);
}

/* The first failure of a pass, by precedence: a missing object, then the
 * daemon's own resources, then a corrupt object. 0 if none. */
static int pass_error(const struct job *j)
{
	const struct materialize_request *req = j->req;
	struct transaction *x = &j->m->x;
	char name[ARTFS_HASH_HEX_MAX + 1];

	for (int pass = 0; pass < 3; pass++)
		for (size_t i = 0; i < req->count; i++) {
			int e = j->slots[i].error;
			bool hit = pass == 0 ? e == -ENOENT
				 : pass == 1 ? (e == -ENOMEM || e == -EMFILE || e == -ENFILE)
				 : e != 0;
			if (!hit)
				continue;
			key_hex(req->blocks[i].hash, req->blocks[i].len, name);
			if (pass == 0)
				return transaction_fail(x, -ENOENT, "object %zu (%s) does not exist", i,
							name);
			if (pass == 1)
				return transaction_fail(x, e, "object %zu (%s): out of resources", i, name);
			return transaction_fail(x, -EIO, "object %zu (%s) cannot be served", i, name);
		}
	return 0;
}

struct named {
	struct object *o;
	size_t i;
};

static int by_object(const void *a, const void *b)
{
	const struct named *x = a, *y = b;
	uintptr_t p = (uintptr_t)x->o, q = (uintptr_t)y->o;
	return p < q ? -1 : p > q ? 1 : x->i < y->i ? -1 : x->i > y->i;
}

static size_t find_all(struct tree *t, struct mat *m, const struct materialize_request *req,
		       struct named *seen)
{
	size_t missing = req->count;

	if (!atomic_load(&m->ver->listed)) /* a daemon that took over indexes it meanwhile */
		for (size_t i = 0; i < req->count; i++)
			version_probe(t, m->ver, req->blocks[i].hash, req->blocks[i].len);
	pthread_mutex_lock(&t->lock);
	for (size_t i = 0; i < req->count; i++) {
		seen[i].o = index_object_find(&t->idx, m->ver, req->blocks[i].hash, req->blocks[i].len);
		seen[i].i = i;
		if (!seen[i].o && missing == req->count)
			missing = i;
	}
	pthread_mutex_unlock(&t->lock);
	return missing;
}

/* Fetches every local miss; fetched[i] gets block i's envelope when it is
 * what was committed here. */
static int fetch_misses(struct tree *t, struct mat *m, const struct materialize_request *req,
			const struct named *seen, uint8_t **fetched, size_t *fetched_len)
{
	struct fetch_item *items = calloc(req->count, sizeof(*items));
	size_t *block = calloc(req->count, sizeof(*block));
	size_t k = 0;
	int rc = 0;

	if (!items || !block) {
		free(items);
		free(block);
		return -ENOMEM;
	}
	for (size_t i = 0; i < req->count; i++)
		if (!seen[i].o) {
			block[k] = i;
			items[k++] = (struct fetch_item){ .ver = m->ver, .hash = req->blocks[i].hash,
							  .hash_len = req->blocks[i].len, .keep = true };
		}
	rc = fetch_objects(t, items, k);
	for (size_t x = 0; x < k; x++) {
		fetched[block[x]] = items[x].value;
		fetched_len[block[x]] = items[x].value_len;
	}
	free(items);
	free(block);
	return rc == -ENOENT ? 0 : rc; /* absence is said by the lookup after */
}

/* Resolves every name (ENOENT for the first missing one); fills
 * j->distinct_at with one block of each distinct object, and finds the
 * first repeat. */
static int resolve(struct job *j)
{
	struct tree *t = j->t;
	struct mat *m = j->m;
	const struct materialize_request *req = j->req;
	char name[ARTFS_HASH_HEX_MAX + 1];
	struct named *seen = calloc(req->count, sizeof(*seen));

	if (!seen)
		return -ENOMEM;
	size_t missing = find_all(t, m, req, seen);
	if (missing < req->count && t->remote) {
		/* Every local miss from the cluster, one pipelined round per node. */
		int rc = fetch_misses(t, m, req, seen, j->fetched, j->fetched_len);
		if (rc < 0) {
			free(seen);
			return transaction_fail(&m->x, rc, "objects missing here could not be fetched "
						"from the cluster");
		}
		missing = find_all(t, m, req, seen);
	}
	if (missing < req->count) {
		free(seen);
		key_hex(req->blocks[missing].hash, req->blocks[missing].len, name);
		return transaction_fail(&m->x, -ENOENT, "object %zu (%s) does not exist", missing,
					name);
	}
	qsort(seen, req->count, sizeof(*seen), by_object); /* the same object side by side */
	j->distinct = 0;
	j->repeat = req->count;
	for (size_t k = 0; k < req->count; k++) {
		if (k == 0 || seen[k].o != seen[k - 1].o)
			j->distinct_at[j->distinct++] = seen[k].i;
		else if (j->repeat == req->count || seen[k].i < j->repeat) {
			j->repeat = seen[k].i;
			j->first = seen[k - 1].i;
		}
	}
	free(seen);
	return 0;
}

/* A request that names an object twice: checksums still come first
 * (each distinct object verified once), then EBADMSG. */
static int refuse_repeat(struct job *j)
{
	j->which = j->distinct_at;
	j->count = j->distinct;
	run_pass(j, PASS_HEADERS);
	int rc = pass_error(j);
	if (!rc) {
		run_pass(j, PASS_VERIFY);
		rc = pass_error(j);
	}
	if (!rc)
		rc = transaction_fail(&j->m->x, -EBADMSG, "object %zu repeats object %zu", j->repeat,
				      j->first);
	return rc;
}

/* The layout of the objects whose headers are in: EBADMSG, once every
 * payload is known to be sound. */
static int check_layout(struct job *j, uint64_t *token_end)
{
	const struct materialize_request *req = j->req;
	char err[256];
	struct envelope *envs = malloc(req->count * sizeof(*envs));

	if (!envs)
		return -ENOMEM;
	for (size_t i = 0; i < req->count; i++)
		envs[i] = j->slots[i].env;
	int bad = materialize_check(req, envs, token_end, err, sizeof(err));
	free(envs);
	if (bad == 0)
		return 0;
	run_pass(j, PASS_VERIFY);
	int rc = pass_error(j);
	return rc ? rc : transaction_fail(&j->m->x, bad, "%s", err);
}

/* One .npy of the concatenation (token_end rows), each payload read into
 * its place. */
static int assemble(struct job *j, uint64_t token_end)
{
	struct mat *m = j->m;
	struct slot *slots = j->slots;
	struct array_desc whole = slots[0].env.array;
	uint8_t hdr[NPY_HEADER_MAX];
	uint64_t payload;

	whole.shape[0] = token_end;
	ssize_t hl = npy_header(&whole, hdr, sizeof(hdr));
	if (hl < 0 || array_payload_len(&whole, &payload) < 0 ||
	    payload > SIZE_MAX / 2 - (size_t)hl)
		return transaction_fail(&m->x, -EBADMSG, "the concatenation has no .npy form");
	size_t len = (size_t)hl + (size_t)payload;
	int rc = transaction_result_make(j->t, &m->x, len);
	if (rc < 0)
		return rc;
	memcpy(m->x.out.bytes, hdr, (size_t)hl);
	uint64_t at = (uint64_t)hl;
	for (size_t i = 0; i < j->req->count; i++) {
		slots[i].at = at;
		at += slots[i].env.payload_len;
	}
	j->out = m->x.out.bytes;
	run_pass(j, PASS_LOAD);
	rc = pass_error(j);
	if (rc) {
		transaction_result_free(j->t, &m->x.out);
		return rc;
	}
	m->x.out.len = len;
	return 0;
}

/* Every object's header (ENOENT if one vanished, EIO if corrupt), the
 * layout, then the result. */
static int build(struct job *j)
{
	uint64_t token_end;

	j->count = j->req->count;
	run_pass(j, PASS_HEADERS);
	int rc = pass_error(j);
	if (!rc)
		rc = check_layout(j, &token_end);
	return rc ? rc : assemble(j, token_end);
}

static int run_request(struct tree *t, struct mat *m, const struct materialize_request *req)
{
	size_t n = req->count;
	struct job j = { .t = t, .m = m, .ver = m->ver, .req = req };
	int rc = -ENOMEM;

	j.slots = calloc(n, sizeof(*j.slots));
	j.distinct_at = calloc(n, sizeof(*j.distinct_at));
	j.fetched = calloc(n, sizeof(*j.fetched));
	j.fetched_len = calloc(n, sizeof(*j.fetched_len));
	if (j.slots && j.distinct_at && j.fetched && j.fetched_len)
		rc = resolve(&j);
	if (rc == 0)
		rc = j.repeat < n ? refuse_repeat(&j) : build(&j);
	for (size_t i = 0; j.fetched && i < n; i++)
		free(j.fetched[i]);
	free(j.fetched);
	free(j.fetched_len);
	free(j.slots);
	free(j.distinct_at);
	return rc;
}

/* The transaction's run: at the first read, under its mutex. */
static int run(struct tree *t, struct transaction *x)
{
	struct mat *m = (struct mat *)x;
	struct materialize_request req;
	char err[256];
	int rc = materialize_parse(x->req.text ? x->req.text : "", x->req.len, &req, err,
				   sizeof(err));

	if (rc < 0)
		rc = transaction_fail(x, rc, "bad request: %s", err);
	else {
		rc = run_request(t, m, &req);
		materialize_request_free(&req);
	}
	version_touch(m->ver);
	return rc;
}

/* ---- the handle ------------------------------------------------------------- */

static const struct handle_ops materialize_ops;

int materialize_open(struct tree *t, struct version *v, struct handle **h,
		     struct open_reply *r)
{
	struct mat *m = calloc(1, sizeof(*m));

	if (!m)
		return -ENOMEM;
	transaction_init(&m->x, &materialize_ops, run);
	snprintf(m->x.who, sizeof(m->x.who), "materialize %s", v->name);
	m->ver = v;
	node_ref(&v->node);
	pthread_mutex_lock(&t->lock);
	v->open_files++;
	pthread_mutex_unlock(&t->lock);
	version_touch(v);
	r->direct_io = true; /* every open sees its own bytes */
	*h = &m->x.h;
	return 0;
}

static int materialize_write(struct tree *t, struct handle *h, uint64_t off, const void *buf,
			     size_t len, uint64_t owner)
{
	struct mat *m = (struct mat *)h;
	int rc = transaction_append(t, &m->x, off, buf, len, MATERIALIZE_REQUEST_MAX);

	(void)owner;
	if (rc < 0)
		log_warn("materialize %s: write refused (%s)", m->ver->name,
			 rc == -ENOMEM ? "request text would exceed materialize_max=" : strerror(-rc));
	return rc;
}

static bool materialize_busy(struct handle *h)
{
	struct mat *m = (struct mat *)h;

	if (pthread_mutex_trylock(&m->x.mu) != 0)
		return true;
	pthread_mutex_unlock(&m->x.mu);
	return false;
}

static void materialize_release(struct tree *t, struct handle *h)
{
	struct mat *m = (struct mat *)h;

	pthread_mutex_lock(&t->lock);
	m->ver->open_files--;
	pthread_mutex_unlock(&t->lock);
	version_touch(m->ver); /* idle time counts from the last close */
	node_unref(&m->ver->node, 1);
	transaction_release(t, &m->x);
	free(m);
}

/* Running a request reads every object: always on a worker. */
static bool materialize_read_quick(struct tree *t, struct handle *h)
{
	(void)t, (void)h;
	return false;
}

static bool materialize_write_quick(struct tree *t, struct handle *h, size_t len)
{
	(void)t, (void)len;
	return !materialize_busy(h);
}

static const struct handle_ops materialize_ops = {
	.kind = "materialize",
	.held_kind = HANDLE_MATERIALIZE,
	.resume = transaction_resume,
	.read = transaction_read,
	.write = materialize_write,
	.release = materialize_release,
	.read_quick = materialize_read_quick,
	.write_quick = materialize_write_quick,
};
