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

#include "key.h"
#include "log.h"
#include "materialize.h"
#include "npy.h"
#include "object.h"

struct mat {
	struct handle h;
	pthread_mutex_t mu;
	struct version *ver;      /* referenced */
	char *text;               /* the request as written */
	size_t text_len, text_cap;
	bool done;                /* the result (or error) is final */
	int error;
	uint8_t *out;             /* the .npy */
	size_t out_len;
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

struct loaded {
	struct envelope env;
	uint8_t *buf;
	const uint8_t *npy;
	size_t npy_len;
	int error;
};

struct job {
	struct tree *t;
	struct version *ver;
	const struct materialize_request *req;
	struct loaded *objs;
	_Atomic size_t next;
};

static void *load_worker(void *arg)
{
	struct job *j = arg;
	char name[ARTFS_HASH_HEX_MAX + 1];
	uint64_t ctime;

	for (;;) {
		size_t i = atomic_fetch_add(&j->next, 1);
		if (i >= j->req->count)
			break;
		const struct materialize_block *b = &j->req->blocks[i];
		struct loaded *l = &j->objs[i];
		key_hex(b->hash, b->len, name);
		int fd = store_object_open(j->ver->dirfd, name);
		if (fd < 0) {
			l->error = fd == -ENOENT ? -ENOENT : -EIO;
			continue;
		}
		l->error = object_load_verified(j->t, j->ver, fd, name, b->hash, b->len, &l->env,
						&l->buf, &l->npy, &l->npy_len, &ctime);
		close(fd);
	}
	return NULL;
}

/* Reads and verifies every object, several at a time. */
static void load_all(struct job *j)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	size_t n = j->req->count / 64 + 1;
	if (n > 8)
		n = 8;
	if (cpus > 0 && n > (size_t)cpus)
		n = (size_t)cpus;
	pthread_t threads[8];
	size_t started = 0;
	for (size_t i = 1; i < n; i++)
		if (pthread_create(&threads[started], NULL, load_worker, j) == 0)
			started++;
	load_worker(j);
	for (size_t i = 0; i < started; i++)
		pthread_join(threads[i], NULL);
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

static int run(struct tree *t, struct mat *m)
{
	struct materialize_request req;
	char err[256], name[ARTFS_HASH_HEX_MAX + 1];
	int rc = materialize_parse(m->text ? m->text : "", m->text_len, &req, err, sizeof(err));

	if (rc < 0)
		return fail(m, rc, "bad request: %s", err);

	/* Every object exists: ENOENT names the first that does not. */
	pthread_mutex_lock(&t->lock);
	size_t missing = req.count;
	for (size_t i = 0; i < req.count && missing == req.count; i++)
		if (!index_object_find(&t->idx, m->ver, req.blocks[i].hash, req.blocks[i].len))
			missing = i;
	pthread_mutex_unlock(&t->lock);
	if (missing < req.count) {
		key_hex(req.blocks[missing].hash, req.blocks[missing].len, name);
		rc = fail(m, -ENOENT, "object %zu (%s) does not exist", missing, name);
		goto out_req;
	}

	/* Checksums hold: EIO (each failure is logged where it is found). */
	struct loaded *objs = calloc(req.count, sizeof(*objs));
	if (!objs) {
		rc = -ENOMEM;
		goto out_req;
	}
	struct job j = { .t = t, .ver = m->ver, .req = &req, .objs = objs };
	load_all(&j);
	rc = 0;
	/* A store file gone since the index check is a missing object, and a
	 * missing object outranks a corrupt one wherever it is. */
	for (int pass = 0; pass < 2 && !rc; pass++)
		for (size_t i = 0; i < req.count && !rc; i++) {
			if (!objs[i].error || (pass == 0) != (objs[i].error == -ENOENT))
				continue;
			key_hex(req.blocks[i].hash, req.blocks[i].len, name);
			rc = pass == 0 ? fail(m, -ENOENT, "object %zu (%s) does not exist", i, name)
				       : fail(m, -EIO, "object %zu (%s) cannot be served", i, name);
		}
	if (rc)
		goto out_objs;

	/* The layout: EBADMSG. */
	struct envelope *envs = malloc(req.count * sizeof(*envs));
	if (!envs) {
		rc = -ENOMEM;
		goto out_objs;
	}
	for (size_t i = 0; i < req.count; i++)
		envs[i] = objs[i].env;
	uint64_t token_end;
	rc = materialize_check(&req, envs, &token_end, err, sizeof(err));
	if (rc < 0) {
		free(envs);
		rc = fail(m, rc, "%s", err);
		goto out_objs;
	}

	/* One .npy of the concatenation. */
	struct array_desc whole = envs[0].array;
	whole.shape[0] = token_end;
	free(envs);
	uint8_t hdr[NPY_HEADER_MAX];
	ssize_t hl = npy_header(&whole, hdr, sizeof(hdr));
	uint64_t payload;
	if (hl < 0 || array_payload_len(&whole, &payload) < 0 || payload > SIZE_MAX - (size_t)hl) {
		rc = fail(m, -EBADMSG, "the concatenation has no .npy form");
		goto out_objs;
	}
	m->out = malloc((size_t)hl + payload);
	if (!m->out) {
		rc = -ENOMEM;
		goto out_objs;
	}
	memcpy(m->out, hdr, (size_t)hl);
	size_t at = (size_t)hl;
	for (size_t i = 0; i < req.count; i++) {
		size_t body = (size_t)objs[i].env.payload_len;
		memcpy(m->out + at, objs[i].npy + (objs[i].npy_len - body), body);
		at += body;
	}
	m->out_len = at;
out_objs:
	for (size_t i = 0; i < req.count; i++)
		free(objs[i].buf);
	free(objs);
out_req:
	materialize_request_free(&req);
	return rc;
}

/* ---- the handle ------------------------------------------------------------- */

int materialize_open(struct tree *t, struct version *v, struct handle **h,
		     struct tree_open_reply *r)
{
	struct mat *m = calloc(1, sizeof(*m));

	if (!m)
		return -ENOMEM;
	handle_init(&m->h, HANDLE_MATERIALIZE);
	pthread_mutex_init(&m->mu, NULL);
	m->ver = v;
	node_ref(&v->node);
	pthread_mutex_lock(&t->lock);
	v->open_files++;
	pthread_mutex_unlock(&t->lock);
	tree_touch(v);
	r->direct_io = true; /* every open sees its own bytes */
	*h = &m->h;
	return 0;
}

int materialize_write(struct tree *t, struct handle *h, uint64_t off, const void *buf, size_t len)
{
	struct mat *m = (struct mat *)h;
	int rc = (int)len;

	pthread_mutex_lock(&m->mu);
	if (m->done)
		rc = -EINVAL; /* one transaction per open: reopen for another */
	else if (off != m->text_len)
		rc = -EINVAL;
	else if (len > MATERIALIZE_REQUEST_MAX - m->text_len)
		rc = -EFBIG;
	else {
		if (m->text_len + len > m->text_cap) {
			size_t cap = m->text_cap ? m->text_cap : 4096;
			while (cap < m->text_len + len)
				cap *= 2;
			char *grown = realloc(m->text, cap);
			if (!grown)
				rc = -ENOMEM;
			else {
				m->text = grown;
				m->text_cap = cap;
			}
		}
		if (rc > 0) {
			memcpy(m->text + m->text_len, buf, len);
			m->text_len += len;
		}
	}
	pthread_mutex_unlock(&m->mu);
	if (rc == -EINVAL || rc == -EFBIG)
		log_warn("materialize %s: write refused (%s)", m->ver->name, strerror(-rc));
	return rc;
}

int materialize_read(struct tree *t, struct handle *h, uint64_t off, size_t size,
		     const void **data, size_t *len)
{
	struct mat *m = (struct mat *)h;

	pthread_mutex_lock(&m->mu);
	if (!m->done) {
		m->error = run(t, m);
		m->done = true;
		tree_touch(m->ver);
	}
	pthread_mutex_unlock(&m->mu);
	if (m->error)
		return m->error;
	*data = m->out + (off < m->out_len ? off : m->out_len);
	*len = off >= m->out_len ? 0 : (m->out_len - off < size ? m->out_len - (size_t)off : size);
	return 0;
}

void materialize_release(struct tree *t, struct handle *h)
{
	struct mat *m = (struct mat *)h;

	pthread_mutex_lock(&t->lock);
	m->ver->open_files--;
	pthread_mutex_unlock(&t->lock);
	tree_touch(m->ver); /* idle time counts from the last close */
	node_unref(&m->ver->node, 1);
	pthread_mutex_destroy(&m->mu);
	free(m->text);
	free(m->out);
	free(m);
}
