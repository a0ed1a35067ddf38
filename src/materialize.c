#include "autoconf.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fetch.h"
#include "key.h"
#include "log.h"
#include "materialize.h"
#include "npy.h"
#include "object.h"
#include "parallel.h"

struct mat {
	struct handle h;
	pthread_mutex_t mu;
	struct version *ver;      /* referenced */
	struct request_text req;  /* the request as written */
	bool done;                /* the result (or error) is final */
	int error;
	struct transaction_result out; /* the .npy */
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

int materialize_parse(const char *text, size_t len, struct materialize_request *req,
		      char *err, size_t errlen)
{
	size_t cap = 0, lineno = 0;
	char line[ARTFS_HASH_HEX_MAX + 64];

	memset(req, 0, sizeof(*req));
	for (size_t pos = 0; pos < len;) {
		const char *nl = memchr(text + pos, '\n', len - pos);
		size_t end = nl ? (size_t)(nl - text) : len, n = end - pos;
		lineno++;
		while (n && isspace((unsigned char)text[pos]))
			pos++, n--;
		while (n && isspace((unsigned char)text[pos + n - 1]))
			n--;
		if (n >= sizeof(line)) {
			snprintf(err, errlen, "line %zu: too long", lineno);
			goto bad;
		}
		memcpy(line, text + pos, n);
		line[n] = '\0';
		pos = end + 1;
		if (n == 0)
			continue;
		if (memchr(line, '\0', n)) {
			snprintf(err, errlen, "line %zu: NUL byte", lineno);
			goto bad;
		}
		char *space = strpbrk(line, " \t");
		if (space) {
			*space = '\0';
			char *value = space + 1;
			while (isspace((unsigned char)*value))
				value++;
			bool *has;
			uint64_t *dst;
			if (strcmp(line, "token_end") == 0)
				has = &req->has_token_end, dst = &req->token_end;
			else if (strcmp(line, "block_size") == 0)
				has = &req->has_block_size, dst = &req->block_size;
			else {
				snprintf(err, errlen, "line %zu: unknown keyword \"%.32s\"", lineno, line);
				goto bad;
			}
			if (*has || parse_number(value, dst) < 0 || *dst == 0) {
				snprintf(err, errlen, "line %zu: %s needs one positive integer", lineno, line);
				goto bad;
			}
			*has = true;
			continue;
		}
		if (req->count == MATERIALIZE_BLOCKS_MAX) {
			snprintf(err, errlen, "more than %u objects", MATERIALIZE_BLOCKS_MAX);
			goto bad;
		}
		if (req->count == cap) {
			cap = cap ? cap * 2 : 64;
			struct materialize_block *b = realloc(req->blocks, cap * sizeof(*b));
			if (!b) {
				snprintf(err, errlen, "out of memory");
				materialize_request_free(req);
				return -ENOMEM;
			}
			req->blocks = b;
		}
		size_t hlen;
		if (key_hash_decode(line, req->blocks[req->count].hash, &hlen) < 0) {
			snprintf(err, errlen, "line %zu: \"%.40s\" is not a block hash", lineno, line);
			goto bad;
		}
		req->blocks[req->count++].len = (uint8_t)hlen;
	}
	if (req->count == 0) {
		snprintf(err, errlen, "no object hashes");
		goto bad;
	}
	return 0;
bad:
	materialize_request_free(req);
	return -EINVAL;
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

static int fail(struct mat *m, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int fail(struct mat *m, int err, const char *fmt, ...)
{
	char msg[384];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	log_warn("materialize %s: %s (%s)", m->ver->name, msg, strerror(-err));
	return err;
}

/* The first failure of a pass, by precedence: a missing object, then the
 * daemon's own resources, then a corrupt object. 0 if none. */
static int pass_error(struct mat *m, const struct materialize_request *req,
		      const struct slot *slots)
{
	char name[ARTFS_HASH_HEX_MAX + 1];

	for (int pass = 0; pass < 3; pass++)
		for (size_t i = 0; i < req->count; i++) {
			int e = slots[i].error;
			bool hit = pass == 0 ? e == -ENOENT
				 : pass == 1 ? (e == -ENOMEM || e == -EMFILE || e == -ENFILE)
				 : e != 0;
			if (!hit)
				continue;
			key_hex(req->blocks[i].hash, req->blocks[i].len, name);
			if (pass == 0)
				return fail(m, -ENOENT, "object %zu (%s) does not exist", i, name);
			if (pass == 1)
				return fail(m, e, "object %zu (%s): out of resources", i, name);
			return fail(m, -EIO, "object %zu (%s) cannot be served", i, name);
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

/* Resolves every name (ENOENT for the first missing one); fills which with
 * one slot per distinct object and returns how many are distinct. */
static int resolve(struct tree *t, struct mat *m, const struct materialize_request *req,
		   size_t *which, size_t *distinct, size_t *repeat, size_t *first,
		   uint8_t **fetched, size_t *fetched_len)
{
	char name[ARTFS_HASH_HEX_MAX + 1];
	struct named *seen = calloc(req->count, sizeof(*seen));

	if (!seen)
		return -ENOMEM;
	size_t missing = find_all(t, m, req, seen);
	if (missing < req->count && t->remote) {
		/* Every local miss from the cluster, one pipelined round per node. */
		int rc = fetch_misses(t, m, req, seen, fetched, fetched_len);
		if (rc < 0) {
			free(seen);
			return fail(m, rc, "objects missing here could not be fetched from the cluster");
		}
		missing = find_all(t, m, req, seen);
	}
	if (missing < req->count) {
		free(seen);
		key_hex(req->blocks[missing].hash, req->blocks[missing].len, name);
		return fail(m, -ENOENT, "object %zu (%s) does not exist", missing, name);
	}
	qsort(seen, req->count, sizeof(*seen), by_object); /* the same object side by side */
	*distinct = 0;
	*repeat = req->count;
	for (size_t k = 0; k < req->count; k++) {
		if (k == 0 || seen[k].o != seen[k - 1].o)
			which[(*distinct)++] = seen[k].i;
		else if (*repeat == req->count || seen[k].i < *repeat) {
			*repeat = seen[k].i;
			*first = seen[k - 1].i;
		}
	}
	free(seen);
	return 0;
}

static int run(struct tree *t, struct mat *m)
{
	struct materialize_request req;
	char err[256];
	int rc = materialize_parse(m->req.text ? m->req.text : "", m->req.len, &req, err, sizeof(err));

	if (rc < 0)
		return fail(m, rc, "bad request: %s", err);
	struct slot *slots = calloc(req.count, sizeof(*slots));
	size_t *which = calloc(req.count, sizeof(*which));
	uint8_t **fetched = calloc(req.count, sizeof(*fetched));
	size_t *fetched_len = calloc(req.count, sizeof(*fetched_len));
	size_t distinct = 0, repeat = 0, first = 0;
	if (!slots || !which || !fetched || !fetched_len) {
		rc = -ENOMEM;
		goto out;
	}
	rc = resolve(t, m, &req, which, &distinct, &repeat, &first, fetched, fetched_len);
	if (rc < 0)
		goto out;
	struct job j = { .t = t, .ver = m->ver, .req = &req, .slots = slots, .fetched = fetched,
			 .fetched_len = fetched_len };
	if (repeat < req.count) {
		/* Checksums still come first: verify each distinct object once. */
		j.which = which;
		j.count = distinct;
		run_pass(&j, PASS_HEADERS);
		rc = pass_error(m, &req, slots);
		if (!rc) {
			run_pass(&j, PASS_VERIFY);
			rc = pass_error(m, &req, slots);
		}
		if (!rc)
			rc = fail(m, -EBADMSG, "object %zu repeats object %zu", repeat, first);
		goto out;
	}

	/* Every object's header (ENOENT if one vanished, EIO if corrupt). */
	j.count = req.count;
	run_pass(&j, PASS_HEADERS);
	rc = pass_error(m, &req, slots);
	if (rc)
		goto out;

	/* The layout: EBADMSG, once every payload is known to be sound. */
	struct envelope *envs = malloc(req.count * sizeof(*envs));
	if (!envs) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < req.count; i++)
		envs[i] = slots[i].env;
	uint64_t token_end;
	rc = materialize_check(&req, envs, &token_end, err, sizeof(err));
	free(envs);
	if (rc < 0) {
		int bad = rc;
		run_pass(&j, PASS_VERIFY);
		rc = pass_error(m, &req, slots);
		if (!rc)
			rc = fail(m, bad, "%s", err);
		goto out;
	}

	/* One .npy of the concatenation, each payload read into its place. */
	struct array_desc whole = slots[0].env.array;
	whole.shape[0] = token_end;
	uint8_t hdr[NPY_HEADER_MAX];
	ssize_t hl = npy_header(&whole, hdr, sizeof(hdr));
	uint64_t payload;
	if (hl < 0 || array_payload_len(&whole, &payload) < 0 ||
	    payload > SIZE_MAX / 2 - (size_t)hl) {
		rc = fail(m, -EBADMSG, "the concatenation has no .npy form");
		goto out;
	}
	size_t len = (size_t)hl + (size_t)payload;
	rc = transaction_result_map(t, &m->out, len);
	if (rc == -EDQUOT) {
		counter_inc(&t->metrics.materialize_refused);
		rc = fail(m, -ENOMEM, "a %zu-byte result would exceed materialize_max=%" PRIu64
			  " (%" PRIu64 " bytes held by open .materialize files)", len,
			  t->cfg->materialize_max, atomic_load(&t->materialize_held));
		goto out;
	}
	if (rc < 0) {
		rc = fail(m, -ENOMEM, "no memory for a %zu-byte result", len);
		goto out;
	}
	memcpy(m->out.bytes, hdr, (size_t)hl);
	uint64_t at = (uint64_t)hl;
	for (size_t i = 0; i < req.count; i++) {
		slots[i].at = at;
		at += slots[i].env.payload_len;
	}
	j.out = m->out.bytes;
	run_pass(&j, PASS_LOAD);
	rc = pass_error(m, &req, slots);
	if (rc) {
		transaction_result_free(t, &m->out);
		goto out;
	}
	m->out.len = len;
out:
	for (size_t i = 0; fetched && i < req.count; i++)
		free(fetched[i]);
	free(fetched);
	free(fetched_len);
	free(slots);
	free(which);
	materialize_request_free(&req);
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
	handle_init(&m->h, &materialize_ops);
	pthread_mutex_init(&m->mu, NULL);
	m->ver = v;
	node_ref(&v->node);
	pthread_mutex_lock(&t->lock);
	v->open_files++;
	pthread_mutex_unlock(&t->lock);
	version_touch(v);
	r->direct_io = true; /* every open sees its own bytes */
	*h = &m->h;
	return 0;
}

static int materialize_write(struct tree *t, struct handle *h, uint64_t off, const void *buf,
			     size_t len, uint64_t owner)
{
	struct mat *m = (struct mat *)h;
	int rc = (int)len;

	(void)owner;
	pthread_mutex_lock(&m->mu);
	if (m->done)
		rc = -EINVAL; /* one transaction per open: reopen for another */
	else
		rc = request_text_append(t, &m->req, off, buf, len, MATERIALIZE_REQUEST_MAX);
	pthread_mutex_unlock(&m->mu);
	if (rc < 0)
		log_warn("materialize %s: write refused (%s)", m->ver->name,
			 rc == -ENOMEM ? "request text would exceed materialize_max=" : strerror(-rc));
	return rc;
}

static int materialize_read(struct tree *t, struct handle *h, uint64_t off, size_t size,
		     const void **data, size_t *len)
{
	struct mat *m = (struct mat *)h;

	pthread_mutex_lock(&m->mu);
	if (!m->done) {
		m->error = run(t, m);
		m->done = true;
		version_touch(m->ver);
	}
	pthread_mutex_unlock(&m->mu);
	if (m->error)
		return m->error;
	transaction_result_slice(&m->out, off, size, data, len);
	return 0;
}

static bool materialize_busy(struct handle *h)
{
	struct mat *m = (struct mat *)h;

	if (pthread_mutex_trylock(&m->mu) != 0)
		return true;
	pthread_mutex_unlock(&m->mu);
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
	pthread_mutex_destroy(&m->mu);
	transaction_result_free(t, &m->out);
	request_text_free(t, &m->req);
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
	.read = materialize_read,
	.write = materialize_write,
	.release = materialize_release,
	.read_quick = materialize_read_quick,
	.write_quick = materialize_write_quick,
};
