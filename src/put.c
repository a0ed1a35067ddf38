#include "autoconf.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "envelope.h"
#include "key.h"
#include "log.h"
#include "publish.h"
#include "put.h"
#include "remote.h"

enum put_state {
	PUT_LINE,    /* <wv>/.put: reading `<hash>\n` */
	PUT_HEAD,    /* reading an envelope's length prefix and header */
	PUT_BODY,    /* feeding the rest of the record to its publish */
	PUT_SKIP,    /* passing over the rest of a refused record */
	PUT_DEAD,    /* a header that gives no length: nothing after it can be read */
	PUT_DONE,    /* fsync or close ended the transaction */
};

struct put {
	struct handle h;
	pthread_mutex_t mu;
	struct version *ver;        /* <wv>/.put: referenced; NULL for .keys/.put */
	enum put_state state;
	uint64_t received;          /* bytes written, for the sequential check */
	uint64_t owner;             /* file table of the writes */
	/* the record in progress */
	char line[ARTFS_HASH_HEX_MAX + 2];
	size_t line_len;
	bool bad_line;              /* its hash line was not a hash: refused, skipped */
	uint8_t hash[ARTFS_HASH_BYTES_MAX];
	size_t hash_len;
	uint8_t head[ENVELOPE_HEADER_BYTES_MAX];
	size_t head_len, head_need;
	uint64_t remaining;         /* bytes of the record after its header */
	uint64_t fed;               /* bytes given to the publish */
	struct handle *pub;         /* the record's publish */
	char key[65];               /* its key hex, or "-" */
	/* with remote=: records whose bytes are all in, waiting for one
	 * pipelined round to the cluster (then committed here in order) */
	struct pending {
		struct handle *pub;
		char key[65];
	} pending[PUT_PIPELINE];
	size_t npending;
	/* outcomes */
	uint32_t records;
	int first_error;
	char *results;
	size_t results_len, results_cap;
};

static const char *errno_label(int rc)
{
	switch (-rc) {
	case 0: return "0";
	case EEXIST: return "EEXIST";
	case EBADMSG: return "EBADMSG";
	case ENOSPC: return "ENOSPC";
	case EFBIG: return "EFBIG";
	case EIO: return "EIO";
	case ENOENT: return "ENOENT";
	case ENFILE: return "ENFILE";
	case ENOMEM: return "ENOMEM";
	default: return "EIO";
	}
}

/* One record's outcome: a result line, and the batch's errno if first. */
static int record_line(struct put *p, int rc)
{
	char line[96];
	int n = snprintf(line, sizeof(line), "%s %s\n", p->key, errno_label(rc));

	if (p->results_len + (size_t)n > p->results_cap) {
		size_t cap = p->results_cap ? p->results_cap * 2 : 4096;
		char *grown = realloc(p->results, cap);
		if (!grown)
			return -ENOMEM;
		p->results = grown;
		p->results_cap = cap;
	}
	memcpy(p->results + p->results_len, line, (size_t)n);
	p->results_len += (size_t)n;
	p->records++;
	if (rc && !p->first_error)
		p->first_error = rc;
	return 0;
}

static int flush_pending(struct tree *t, struct put *p);

/* A record refused before its publish began: its line comes after those
 * of the records still waiting for the cluster. */
static int refused(struct tree *t, struct put *p, int rc)
{
	char key[65];

	memcpy(key, p->key, sizeof(key));
	int r = flush_pending(t, p);
	memcpy(p->key, key, sizeof(key));
	return r < 0 ? r : record_line(p, rc);
}

static void next_record(struct put *p)
{
	p->state = p->ver ? PUT_LINE : PUT_HEAD;
	p->line_len = 0;
	p->bad_line = false;
	p->head_len = 0;
	p->head_need = ENVELOPE_PREFIX_LEN;
	p->remaining = p->fed = 0;
	p->pub = NULL;
	snprintf(p->key, sizeof(p->key), "-");
}

static const char *where(const struct put *p)
{
	return p->ver ? p->ver->name : ".keys";
}

/* The header is in: find the record's object and start its publish. */
static int start_record(struct tree *t, struct put *p)
{
	struct envelope env;
	char detail[256];
	uint32_t hlen = (uint32_t)(p->head_len - ENVELOPE_PREFIX_LEN);

	if (envelope_parse_header(p->head + ENVELOPE_PREFIX_LEN, hlen, &env, detail,
				  sizeof(detail))) {
		/* Without a header there is no length: the rest cannot be read. */
		log_warn("put %s: record %u: %s; the rest of the batch is refused", where(p),
			 p->records, detail);
		p->state = PUT_DEAD;
		return refused(t, p, -EBADMSG);
	}
	uint64_t total = envelope_total_len(&env);
	if (total == UINT64_MAX) {
		p->state = PUT_DEAD;
		return refused(t, p, -EBADMSG);
	}
	p->remaining = total - p->head_len;
	const char *hex = env.key + sizeof(ARTFS_KEY_PREFIX) - 1;
	struct version *v = NULL; /* referenced */
	int rc = 0;
	if (!p->ver) {
		/* .keys/.put: the record's key names it. */
		memcpy(p->key, hex, 64);
		p->key[64] = '\0';
		p->hash_len = 32;
		rc = key_sha256_decode(hex, p->hash) < 0 ? -EBADMSG : version_keyonly(t, &v);
	} else {
		v = p->ver;
		node_ref(&v->node);
		if (p->bad_line)
			rc = -EBADMSG;
		else {
			char key[ARTFS_KEY_LEN + 1];
			version_object_key(p->ver, p->hash, p->hash_len, key);
			memcpy(p->key, key + sizeof(ARTFS_KEY_PREFIX) - 1, 64);
			p->key[64] = '\0';
		}
	}
	for (int attempt = 0; rc == 0; attempt++) {
		struct object *o = object_new(v, p->hash, p->hash_len);
		rc = o ? publish_begin(t, o, &p->pub) : -ENOMEM;
		if (o)
			node_unref(&o->node, 1);
		if (rc != -ENOENT || p->ver || attempt == 2)
			break;
		/* The key-only version was collected (ttl=) meanwhile: a new one. */
		node_unref(&v->node, 1);
		v = NULL;
		rc = version_keyonly(t, &v);
	}
	if (rc == 0) {
		rc = p->pub->ops->write(t, p->pub, 0, p->head, p->head_len, p->owner);
		if (rc > 0) {
			p->fed = p->head_len;
			rc = 0;
		}
	}
	if (v)
		node_unref(&v->node, 1);
	if (rc < 0 && !p->pub) {
		/* Refused before its publish began: pass over its bytes. */
		p->state = PUT_SKIP;
		return refused(t, p, rc);
	}
	p->state = PUT_BODY; /* a refusal is sticky in the publish: said at its end */
	return 0;
}

/* Sends the waiting records to the cluster in one pipelined round per
 * node, then commits each here, in order. */
static int flush_pending(struct tree *t, struct put *p)
{
	size_t n = p->npending, k = 0;
	const char *keys[PUT_PIPELINE];
	const void *vals[PUT_PIPELINE];
	size_t lens[PUT_PIPELINE], which[PUT_PIPELINE];
	uint8_t *bufs[PUT_PIPELINE] = { 0 };
	int results[PUT_PIPELINE], prep[PUT_PIPELINE], rc = 0;

	if (!n)
		return 0;
	for (size_t i = 0; i < n; i++) {
		prep[i] = publish_prepare(t, p->pending[i].pub, &bufs[i], &lens[i]);
		if (prep[i] == 0 && bufs[i]) {
			keys[k] = p->pending[i].key;
			vals[k] = bufs[i];
			lens[k] = lens[i];
			which[k++] = i;
		}
	}
	if (k)
		remote_put_many(t->remote, k, keys, vals, lens, results);
	for (size_t j = 0; j < k; j++)
		publish_remote_result(t, p->pending[which[j]].pub, results[j]);
	for (size_t i = 0; i < n; i++) {
		struct handle *pub = p->pending[i].pub;
		int r = pub->ops->fsync(t, pub);
		handle_put(t, pub);
		free(bufs[i]);
		memcpy(p->key, p->pending[i].key, sizeof(p->key));
		if (rc == 0)
			rc = record_line(p, r);
	}
	p->npending = 0;
	snprintf(p->key, sizeof(p->key), "-");
	return rc;
}

static int finish_record(struct tree *t, struct put *p)
{
	if (t->remote) {
		/* Its cluster write goes with the others of this round. */
		p->pending[p->npending].pub = p->pub;
		memcpy(p->pending[p->npending].key, p->key, sizeof(p->key));
		p->npending++;
		p->pub = NULL;
		return p->npending == PUT_PIPELINE ? flush_pending(t, p) : 0;
	}
	int rc = p->pub->ops->fsync(t, p->pub);

	handle_put(t, p->pub);
	p->pub = NULL;
	return record_line(p, rc);
}

static int consume(struct tree *t, struct put *p, const uint8_t *buf, size_t len)
{
	int rc = 0;

	while (len && rc == 0) {
		switch (p->state) {
		case PUT_LINE: {
			const uint8_t *nl = memchr(buf, '\n', len);
			size_t take = nl ? (size_t)(nl - buf) : len;
			if (p->line_len + take > ARTFS_HASH_HEX_MAX) {
				p->bad_line = true; /* too long: not a hash; keep counting */
				p->line_len = 0;
			} else {
				memcpy(p->line + p->line_len, buf, take);
				p->line_len += take;
			}
			buf += take;
			len -= take;
			if (!nl)
				break;
			buf++;
			len--;
			p->line[p->line_len] = '\0';
			if (p->bad_line || key_hash_decode(p->line, p->hash, &p->hash_len) < 0) {
				log_warn("put %s: record %u: \"%.140s\" is not a block hash", where(p),
					 p->records, p->line);
				p->bad_line = true;
			}
			p->state = PUT_HEAD;
			break;
		}
		case PUT_HEAD: {
			size_t take = p->head_need - p->head_len < len ? p->head_need - p->head_len : len;
			memcpy(p->head + p->head_len, buf, take);
			p->head_len += take;
			buf += take;
			len -= take;
			if (p->head_len < p->head_need)
				break;
			if (p->head_need == ENVELOPE_PREFIX_LEN) {
				uint32_t hlen;
				if (envelope_header_len(p->head, &hlen)) {
					log_warn("put %s: record %u: header length %u outside 1..%u; "
						 "the rest of the batch is refused", where(p), p->records,
						 hlen, ARTFS_ENVELOPE_HEADER_MAX);
					p->state = PUT_DEAD;
					rc = refused(t, p, -EBADMSG);
					break;
				}
				p->head_need = ENVELOPE_PREFIX_LEN + hlen;
				break;
			}
			rc = start_record(t, p);
			if (rc == 0 && p->remaining == 0 &&
			    (p->state == PUT_BODY || p->state == PUT_SKIP)) {
				if (p->state == PUT_BODY)
					rc = finish_record(t, p);
				if (rc == 0)
					next_record(p);
			}
			break;
		}
		case PUT_BODY:
		case PUT_SKIP: {
			size_t take = p->remaining < len ? (size_t)p->remaining : len;
			if (p->state == PUT_BODY) {
				int w = p->pub->ops->write(t, p->pub, p->fed, buf, take, p->owner);
				(void)w; /* a refusal is sticky: the record's fsync says it */
				p->fed += take;
			}
			buf += take;
			len -= take;
			p->remaining -= take;
			if (p->remaining)
				break;
			if (p->state == PUT_BODY)
				rc = finish_record(t, p);
			if (rc == 0)
				next_record(p);
			break;
		}
		case PUT_DEAD:
			len = 0;
			break;
		case PUT_DONE:
			return -EINVAL;
		}
		if (p->records >= PUT_RECORDS_MAX && p->state != PUT_DEAD) {
			log_warn("put %s: more than %u records in one batch", where(p), PUT_RECORDS_MAX);
			return -EFBIG;
		}
	}
	return rc;
}

static int put_write(struct tree *t, struct handle *h, uint64_t off, const void *buf, size_t len,
		     uint64_t owner)
{
	struct put *p = (struct put *)h;
	int rc;

	pthread_mutex_lock(&p->mu);
	if (owner)
		p->owner = owner;
	if (p->state == PUT_DONE)
		rc = -EINVAL; /* one transaction per open */
	else if (off != p->received)
		rc = -EINVAL; /* records are a stream: sequential writes only */
	else {
		rc = consume(t, p, buf, len);
		p->received += len;
	}
	pthread_mutex_unlock(&p->mu);
	if (rc < 0)
		log_warn("put %s: write refused (%s)", where(p), strerror(-rc));
	return rc < 0 ? rc : (int)len;
}

/* Ends the transaction: a record cut short is EBADMSG and commits nothing. */
static int put_end(struct tree *t, struct put *p)
{
	if (p->state == PUT_DONE)
		return p->first_error;
	bool cut = (p->state == PUT_LINE && p->line_len) ||
		   (p->state == PUT_HEAD && (p->head_len || p->line_len || p->bad_line)) ||
		   p->state == PUT_BODY || p->state == PUT_SKIP;
	if (p->pub) {
		handle_put(t, p->pub); /* its release says "closed early" */
		p->pub = NULL;
	}
	flush_pending(t, p);
	if (cut && p->state != PUT_SKIP) {
		log_warn("put %s: record %u cut short; nothing of it committed", where(p), p->records);
		record_line(p, -EBADMSG);
	} else if (cut && !p->first_error)
		p->first_error = -EBADMSG;
	if (p->state == PUT_DEAD && !p->first_error)
		p->first_error = -EBADMSG;
	p->state = PUT_DONE;
	return p->first_error;
}

static int put_fsync(struct tree *t, struct handle *h)
{
	struct put *p = (struct put *)h;

	pthread_mutex_lock(&p->mu);
	int rc = put_end(t, p);
	pthread_mutex_unlock(&p->mu);
	return rc;
}

static int put_flush(struct tree *t, struct handle *h, uint64_t owner)
{
	struct put *p = (struct put *)h;

	pthread_mutex_lock(&p->mu);
	bool foreign = p->state != PUT_DONE && owner && p->owner && owner != p->owner;
	int rc = foreign ? 0 : put_end(t, p);
	pthread_mutex_unlock(&p->mu);
	return rc;
}

static int put_read(struct tree *t, struct handle *h, uint64_t off, size_t size,
		    const void **data, size_t *len)
{
	struct put *p = (struct put *)h;

	(void)t;
	pthread_mutex_lock(&p->mu);
	bool done = p->state == PUT_DONE;
	pthread_mutex_unlock(&p->mu);
	if (!done)
		return -EINVAL; /* the results come after fsync */
	*data = p->results ? p->results + (off < p->results_len ? off : p->results_len) : "";
	*len = off >= p->results_len ? 0
	     : (p->results_len - off < size ? p->results_len - (size_t)off : size);
	return 0;
}

static void put_release(struct tree *t, struct handle *h)
{
	struct put *p = (struct put *)h;

	if (p->pub)
		handle_put(t, p->pub);
	for (size_t i = 0; i < p->npending; i++)
		handle_put(t, p->pending[i].pub); /* never ended: nothing committed */
	if (p->ver) {
		pthread_mutex_lock(&t->lock);
		p->ver->open_files--;
		pthread_mutex_unlock(&t->lock);
		version_touch(p->ver);
		node_unref(&p->ver->node, 1);
	}
	pthread_mutex_destroy(&p->mu);
	free(p->results);
	free(p);
}

/* Records commit as they arrive: not while the store's bytes are counted. */
static bool put_write_quick(struct tree *t, struct handle *h, size_t len)
{
	(void)h;
	return len <= HANDLE_QUICK_BYTES && !t->sizing && !t->remote;
}

static bool put_flush_quick(struct tree *t, struct handle *h)
{
	(void)h;
	return !t->sizing && !t->remote; /* the cluster is a round trip away */
}

static const struct handle_ops put_ops = {
	.kind = "put",
	.read = put_read,
	.write = put_write,
	.flush = put_flush,
	.fsync = put_fsync,
	.release = put_release,
	.write_quick = put_write_quick,
	.flush_quick = put_flush_quick,
};

int put_open(struct tree *t, struct version *v, struct handle **h, struct open_reply *r)
{
	struct put *p = calloc(1, sizeof(*p));

	if (!p)
		return -ENOMEM;
	handle_init(&p->h, &put_ops);
	pthread_mutex_init(&p->mu, NULL);
	p->ver = v;
	if (v) {
		node_ref(&v->node);
		pthread_mutex_lock(&t->lock);
		v->open_files++;
		pthread_mutex_unlock(&t->lock);
		version_touch(v);
	}
	next_record(p);
	r->direct_io = true; /* what is read is not what was written */
	*h = &p->h;
	return 0;
}
