/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/key.h"
#include "format/npy.h"
#include "lib/cleanup.h"
#include "lib/log.h"
#include "lib/sha256.h"
#include "r3/object.h"

/* An open reader of a committed object: its .npy (object_open) or its
 * envelope as published (object_open_envelope), loaded whole and verified
 * at the first read. */
struct object_reader {
	struct handle h;
	pthread_mutex_t mu;
	struct object *obj;   /* referenced */
	bool envelope;        /* serves the envelope, not the .npy */
	int fd;               /* .npy: the store file, open since open(); else -1 */
	uint64_t size;        /* .npy: the store file's size and ctime at open */
	uint64_t ctime;
	bool loaded;
	int error;
	uint8_t *buf;
	const uint8_t *data;  /* what reads serve, inside buf */
	size_t len;
};

static uint64_t ctime_ns(const struct stat *st)
{
	return (uint64_t)st->st_ctim.tv_sec * 1000000000u + (uint64_t)st->st_ctim.tv_nsec;
}

/* Errors of the daemon's own resources, not of the store's content. */
static bool resource_error(int rc)
{
	return rc == -EMFILE || rc == -ENFILE || rc == -ENOMEM;
}

/* The store does not hold what the index says: refuse, count, say why. */
static int corrupt(struct tree *t, struct version *ver, const char *name, const char *why)
{
	counter_inc(&t->metrics.checksum_failures);
	log_err("read %s/%s: stored object fails verification (%s); refusing to serve it",
		ver->name, name, why);
	return -EIO;
}

static int check_identity(struct tree *t, struct version *ver, const char *name,
			  const uint8_t *hash, size_t hash_len, const struct envelope *env,
			  uint64_t file_size)
{
	char key[ARTFS_KEY_LEN + 1], why[160];

	version_object_key(ver, hash, hash_len, key);
	if (strcmp(key, env->key) != 0)
		return corrupt(t, ver, name, "its key is not the key of its path");
	if (envelope_total_len(env) != file_size) {
		snprintf(why, sizeof(why), "file has %" PRIu64 " bytes, its header declares %" PRIu64,
			 file_size, envelope_total_len(env));
		return corrupt(t, ver, name, why);
	}
	return 0;
}

static int open_stored(struct tree *t, struct version *ver, const char *name, struct stat *st)
{
	int fd = store_object_open(ver->dirfd, ver->keyonly, name, st);

	if (fd < 0 && fd != -ENOENT && !resource_error(fd))
		return corrupt(t, ver, name, store_open_error(fd));
	return fd;
}

/* Opens the stored <ver>/<hash> (name: its name, filled in) and reads and
 * checks its header: the open fd, or a negative errno. */
static int open_header(struct tree *t, struct version *ver, const uint8_t *hash, size_t hash_len,
		       char name[ARTFS_HASH_HEX_MAX + 1], struct envelope *env)
{
	char detail[160];
	uint8_t head[ENVELOPE_HEADER_BYTES_MAX];
	struct stat st;

	key_hex(hash, hash_len, name);
	int fd = open_stored(t, ver, name, &st);
	if (fd < 0)
		return fd;
	int rc;
	size_t want = (uint64_t)st.st_size < sizeof(head) ? (size_t)st.st_size : sizeof(head);
	if (st.st_size < ENVELOPE_PREFIX_LEN)
		rc = corrupt(t, ver, name, "too short to be an envelope");
	else if (store_pread_all(fd, head, want, 0) < 0)
		rc = corrupt(t, ver, name, "short read");
	else if (envelope_parse(head, want, env, detail, sizeof(detail)))
		rc = corrupt(t, ver, name, detail);
	else
		rc = check_identity(t, ver, name, hash, hash_len, env, (uint64_t)st.st_size);
	if (rc < 0) {
		close(fd);
		return rc;
	}
	return fd;
}

int object_read_meta(struct tree *t, struct version *ver, const uint8_t *hash, size_t hash_len,
		     struct envelope *env)
{
	char name[ARTFS_HASH_HEX_MAX + 1];
	int fd = open_header(t, ver, hash, hash_len, name, env);

	if (fd < 0)
		return fd;
	close(fd);
	return 0;
}

/* Where the header's payload_sha256 is, and its digest; 0 when it is
 * written any other way (spaces, escapes): that object's header is then
 * parsed at every read. */
static size_t header_digest(const uint8_t *json, size_t len, uint8_t digest[32])
{
	size_t pos = envelope_sha_hex_at(json, len);

	if (!pos || pos > UINT16_MAX)
		return 0;
	sha256_once(json, len, digest);
	return pos;
}

void object_header_learn(struct tree *t, struct object *o, const uint8_t *json, size_t len)
{
	uint8_t digest[32];

	if (atomic_load(&o->sha_at))
		return;
	size_t pos = header_digest(json, len, digest);
	if (!pos)
		return;
	pthread_mutex_lock(&t->lock);
	if (!atomic_load_explicit(&o->sha_at, memory_order_relaxed)) {
		memcpy(o->head_digest, digest, sizeof(o->head_digest));
		atomic_store_explicit(&o->sha_at, (uint16_t)pos, memory_order_release);
	}
	pthread_mutex_unlock(&t->lock);
}

void object_header_learn_unshared(struct object *o, const uint8_t *json, size_t len)
{
	uint8_t digest[32];
	size_t pos = header_digest(json, len, digest);

	if (!pos)
		return;
	memcpy(o->head_digest, digest, sizeof(o->head_digest));
	atomic_store_explicit(&o->sha_at, (uint16_t)pos, memory_order_release);
}

/* The checks of a header known by its digest: the bytes read back are the
 * header that was validated, so payload_sha256 is read at its known place. */
static int check_known_header(const struct object *o, uint16_t sha_at, const uint8_t *dst,
			      size_t size, uint8_t payload_sha[32], size_t *head_len)
{
	uint8_t digest[32];
	uint32_t hlen;
	char hex[65];

	if (size < ENVELOPE_PREFIX_LEN || envelope_header_len(dst, &hlen) != ENVELOPE_OK ||
	    hlen > size - ENVELOPE_PREFIX_LEN || (size_t)sha_at + 64 > hlen)
		return -1;
	sha256_once(dst + ENVELOPE_PREFIX_LEN, hlen, digest);
	if (memcmp(digest, o->head_digest, sizeof(o->head_digest)) != 0)
		return -1;
	memcpy(hex, dst + ENVELOPE_PREFIX_LEN + sha_at, 64);
	hex[64] = '\0';
	if (key_sha256_decode(hex, payload_sha) < 0)
		return -1;
	*head_len = ENVELOPE_PREFIX_LEN + hlen;
	return 0;
}

/* The payload's digest against payload_sha256: each check counted, a
 * mismatch refused. */
static int check_payload(struct tree *t, struct version *ver, const char *name,
			 const uint8_t digest[32], const uint8_t want[32])
{
	counter_inc(&t->metrics.verifications);
	if (memcmp(digest, want, 32) != 0)
		return corrupt(t, ver, name, "payload does not match payload_sha256");
	return 0;
}

/* The one read of a stored object: its open store file (size bytes, its
 * stat's) whole into dst, then verified: well-formed, the key of its name,
 * its payload against payload_sha256. With env the header is parsed into
 * it; without, a header known by its digest (object_header_learn) is
 * compared instead, and one parsed is learned. *payload_at: where the
 * payload begins in dst. */
static int read_verified(struct tree *t, struct object *o, const char *name, int fd,
			 uint8_t *dst, size_t size, struct envelope *env, size_t *payload_at)
{
	char detail[160];
	struct envelope parsed;
	uint8_t digest[32], known_sha[32];
	const uint8_t *payload_sha = known_sha;
	size_t head_len;

	if (store_pread_all(fd, dst, size, 0) < 0)
		return corrupt(t, o->ver, name, "short read");
	uint16_t sha_at = env ? 0 : atomic_load_explicit(&o->sha_at, memory_order_acquire);
	if (sha_at) {
		if (check_known_header(o, sha_at, dst, size, known_sha, &head_len) < 0)
			return corrupt(t, o->ver, name, "its header is not the one published");
	} else {
		struct envelope *e = env ? env : &parsed;
		if (envelope_parse(dst, size, e, detail, sizeof(detail)))
			return corrupt(t, o->ver, name, detail);
		int rc = check_identity(t, o->ver, name, o->hash, o->hash_len, e, size);
		if (rc < 0)
			return rc;
		payload_sha = e->payload_sha256;
		head_len = ENVELOPE_PREFIX_LEN + e->header_len;
	}
	sha256_once(dst + head_len, size - head_len, digest);
	int rc = check_payload(t, o->ver, name, digest, payload_sha);
	if (rc < 0)
		return rc;
	if (!sha_at && !env)
		object_header_learn(t, o, dst + ENVELOPE_PREFIX_LEN, head_len - ENVELOPE_PREFIX_LEN);
	*payload_at = head_len;
	return 0;
}

/* o's envelope (size bytes, as indexed) into dst, verified. */
static int load_envelope(struct tree *t, struct object *o, uint8_t *dst, size_t size)
{
	char name[ARTFS_HASH_HEX_MAX + 1];
	struct stat st;
	size_t payload_at;

	object_name(o, name);
	_cleanup_close_ int fd = open_stored(t, o->ver, name, &st);
	if (fd < 0)
		return fd;
	if ((uint64_t)st.st_size != size)
		return corrupt(t, o->ver, name, "its size changed since it was indexed");
	return read_verified(t, o, name, fd, dst, size, NULL, &payload_at);
}

/* A key-only object that gains its name meanwhile (an adoption: its file
 * moves to <wv>/<hash>, held by a new node) is gone from where the caller
 * found it; the key's holder now has the same file. Read from there once. */
int object_load_envelope(struct tree *t, struct object *o, uint8_t *dst, size_t size)
{
	int rc = load_envelope(t, o, dst, size);

	if (rc != -ENOENT || !o->keyed)
		return rc;
	pthread_mutex_lock(&t->lock);
	struct object *now = index_key_find(&t->idx, o->key);
	if (now == o)
		now = NULL;
	if (now)
		node_ref(&now->node);
	pthread_mutex_unlock(&t->lock);
	if (!now)
		return rc;
	rc = load_envelope(t, now, dst, size);
	node_unref(&now->node, 1);
	return rc;
}

int object_envelope_size(struct tree *t, struct object *o, uint64_t *size)
{
	char name[ARTFS_HASH_HEX_MAX + 1];
	struct stat st;

	*size = atomic_load(&o->file_size);
	if (*size != OBJECT_SIZE_UNKNOWN)
		return 0;
	object_name(o, name); /* counted at a restart, not yet sized */
	int rc = store_object_stat(o->ver->dirfd, o->ver->keyonly, name, &st);
	if (rc < 0)
		return rc == -ENOENT ? rc : corrupt(t, o->ver, name, "not a regular file");
	*size = (uint64_t)st.st_size;
	return 0;
}

#define VERIFY_CHUNK (1u << 20)

int object_verify(struct tree *t, struct version *ver, const uint8_t *hash, size_t hash_len,
		  const struct envelope *expect, uint8_t *dst)
{
	char name[ARTFS_HASH_HEX_MAX + 1];
	struct envelope env;
	struct sha256 sha;
	uint8_t digest[32];

	int fd = open_header(t, ver, hash, hash_len, name, &env);
	if (fd < 0)
		return fd;
	int rc = 0;
	if (!envelope_same(&env, expect))
		rc = corrupt(t, ver, name, "it changed while the request was served");
	off_t at = ENVELOPE_PREFIX_LEN + (off_t)env.header_len;
	uint8_t *chunk = NULL;
	if (rc == 0 && !dst && !(chunk = malloc(VERIFY_CHUNK)))
		rc = -ENOMEM;
	if (rc == 0 && sha256_begin(&sha) < 0)
		rc = -ENOMEM;
	for (uint64_t done = 0; rc == 0 && done < env.payload_len;) {
		uint64_t left = env.payload_len - done;
		size_t n = dst ? (size_t)left : left < VERIFY_CHUNK ? (size_t)left : VERIFY_CHUNK;
		uint8_t *p = dst ? dst : chunk;
		if (store_pread_all(fd, p, n, at + (off_t)done) < 0) {
			sha256_abandon(&sha);
			rc = corrupt(t, ver, name, "short read");
			break;
		}
		sha256_update(&sha, p, n);
		done += n;
		if (dst)
			dst += n;
	}
	if (rc == 0) {
		sha256_end(&sha, digest);
		rc = check_payload(t, ver, name, digest, env.payload_sha256);
	}
	free(chunk);
	close(fd);
	return rc;
}

int object_know_size(struct tree *t, struct object *o)
{
	struct envelope env;
	uint64_t size;

	if (atomic_load(&o->npy_size))
		return 0;
	int rc = object_read_meta(t, o->ver, o->hash, o->hash_len, &env);
	if (rc < 0)
		return rc == -ENOENT || resource_error(rc) ? rc : -EIO;
	if (npy_file_size(&env.array, &size) < 0)
		return -EIO;
	atomic_store(&o->npy_size, size);
	return 0;
}

/* The .npy of rd's object, from the store file open since open(): the
 * .npy header goes right before the payload, in the room that the
 * envelope prefix and JSON leave plus NPY_HEADER_MAX spare bytes. */
static int load_npy(struct tree *t, struct object_reader *rd, const char *name)
{
	struct object *o = rd->obj;
	struct envelope env;
	uint8_t hdr[NPY_HEADER_MAX];
	size_t payload_at;

	if (rd->size < ENVELOPE_PREFIX_LEN || rd->size > (SIZE_MAX >> 2))
		return corrupt(t, o->ver, name, "implausible file size");
	uint8_t *buf = malloc(NPY_HEADER_MAX + (size_t)rd->size);
	if (!buf)
		return -ENOMEM;
	uint8_t *envb = buf + NPY_HEADER_MAX;
	int rc = read_verified(t, o, name, rd->fd, envb, (size_t)rd->size, &env, &payload_at);
	ssize_t hl = 0;
	if (rc == 0 && (hl = npy_header(&env.array, hdr, sizeof(hdr))) < 0)
		rc = corrupt(t, o->ver, name, "no .npy header for its shape");
	if (rc < 0) {
		free(buf);
		return rc;
	}
	uint8_t *npy = envb + payload_at - hl;
	memcpy(npy, hdr, (size_t)hl);
	rd->buf = buf;
	rd->data = npy;
	rd->len = (size_t)hl + env.payload_len;
	uint64_t known = atomic_load(&o->npy_size);
	if (known && known != rd->len)
		return corrupt(t, o->ver, name, "its size changed since it was indexed");
	return 0;
}

/* The envelope of rd's object as published, its size as indexed. */
static int load_whole_envelope(struct tree *t, struct object_reader *rd)
{
	uint64_t size;
	int rc = object_envelope_size(t, rd->obj, &size);

	if (rc < 0)
		return rc;
	uint8_t *buf = malloc(size ? size : 1);
	if (!buf)
		return -ENOMEM;
	rc = object_load_envelope(t, rd->obj, buf, (size_t)size);
	if (rc < 0) {
		free(buf);
		return rc;
	}
	rd->buf = buf;
	rd->data = buf;
	rd->len = (size_t)size;
	return 0;
}

/* Under rd->mu, at the first read. A verified .npy lets later opens keep
 * the kernel's pages while the store file's ctime stays that of open. */
static void reader_load(struct tree *t, struct object_reader *rd)
{
	struct object *o = rd->obj;
	char name[ARTFS_HASH_HEX_MAX + 1];

	rd->loaded = true;
	if (rd->envelope) {
		rd->error = load_whole_envelope(t, rd);
		return;
	}
	object_name(o, name);
	rd->error = load_npy(t, rd, name);
	if (rd->error) {
		atomic_store(&o->verified, 0);
		return;
	}
	atomic_store(&o->npy_size, rd->len);
	atomic_store(&o->ctime_ns, rd->ctime);
	atomic_store(&o->verified, 1);
}

static int reader_read(struct tree *t, struct handle *h, uint64_t off, size_t size,
		       const void **data, size_t *len)
{
	struct object_reader *rd = (struct object_reader *)h;

	pthread_mutex_lock(&rd->mu);
	if (!rd->loaded)
		reader_load(t, rd);
	pthread_mutex_unlock(&rd->mu);
	if (rd->error)
		return rd->error;
	buffer_slice(rd->data, rd->len, off, size, data, len);
	return 0;
}

/* A read that must first load and verify a large object goes to a worker. */
static bool reader_read_quick(struct tree *t, struct handle *h)
{
	struct object_reader *rd = (struct object_reader *)h;

	(void)t;
	return rd->loaded || atomic_load(&rd->obj->file_size) <= HANDLE_QUICK_BYTES;
}

static void reader_release(struct tree *t, struct handle *h)
{
	struct object_reader *rd = (struct object_reader *)h;

	pthread_mutex_lock(&t->lock);
	rd->obj->ver->open_files--;
	pthread_mutex_unlock(&t->lock);
	version_touch(rd->obj->ver); /* idle time counts from the last close */
	if (rd->fd >= 0)
		close(rd->fd);
	free(rd->buf);
	node_unref(&rd->obj->node, 1);
	pthread_mutex_destroy(&rd->mu);
	free(rd);
}

static const struct handle_ops npy_reader_ops = {
	.kind = "object",
	.held_kind = HANDLE_OBJECT,
	.read = reader_read,
	.release = reader_release,
	.read_quick = reader_read_quick,
};

static const struct handle_ops envelope_reader_ops = {
	.kind = "key",
	.held_kind = HANDLE_KEY,
	.read = reader_read,
	.release = reader_release,
	.read_quick = reader_read_quick,
};

/* A reader of o (fd: its store file, or -1), counted as an open file of
 * its version and as a read; NULL without memory. */
static struct object_reader *reader_new(struct tree *t, struct object *o, bool envelope, int fd)
{
	struct object_reader *rd = calloc(1, sizeof(*rd));

	if (!rd)
		return NULL;
	handle_init(&rd->h, envelope ? &envelope_reader_ops : &npy_reader_ops);
	pthread_mutex_init(&rd->mu, NULL);
	rd->obj = o;
	rd->envelope = envelope;
	rd->fd = fd;
	node_ref(&o->node);
	pthread_mutex_lock(&t->lock);
	o->ver->open_files++;
	pthread_mutex_unlock(&t->lock);
	counter_inc(&t->metrics.reads);
	version_touch(o->ver);
	return rd;
}

int object_open(struct tree *t, struct object *o, struct handle **h, struct open_reply *r)
{
	char name[ARTFS_HASH_HEX_MAX + 1];
	struct stat st;

	object_name(o, name);
	int fd = open_stored(t, o->ver, name, &st);
	if (fd < 0)
		return fd;
	struct object_reader *rd = reader_new(t, o, false, fd);
	if (!rd) {
		close(fd);
		return -ENOMEM;
	}
	rd->size = (uint64_t)st.st_size;
	rd->ctime = ctime_ns(&st);
	/* Pages the kernel cached were verified when they were read; keep them
	 * only while the store file is unchanged since (any write to it moves
	 * its ctime), otherwise drop them so the next read verifies again. */
	r->keep_cache = atomic_load(&o->verified) && atomic_load(&o->ctime_ns) == rd->ctime;
	r->noflush = true;
	*h = &rd->h;
	return 0;
}

int object_open_envelope(struct tree *t, struct object *o, struct handle **h,
			 struct open_reply *r)
{
	struct object_reader *rd = reader_new(t, o, true, -1);

	if (!rd)
		return -ENOMEM;
	/* Verified at every open: the pages of one open are not another's. */
	r->noflush = true;
	*h = &rd->h;
	return 0;
}

static const char *const xattr_names[] = {
	ARTFS_XATTR_KEY, ARTFS_XATTR_KIND, ARTFS_XATTR_DTYPE,
	ARTFS_XATTR_SHAPE, ARTFS_XATTR_TOKEN_START, ARTFS_XATTR_SHA256,
};
#define XATTR_COUNT (sizeof(xattr_names) / sizeof(xattr_names[0]))

static int put_value(const char *value, size_t n, char *buf, size_t cap, size_t *len)
{
	*len = n;
	if (cap == 0)
		return 0;
	if (cap < n)
		return -ERANGE;
	memcpy(buf, value, n);
	return 0;
}

int object_getxattr(struct tree *t, struct object *o, const char *name, char *buf, size_t cap,
		    size_t *len)
{
	struct envelope env;
	char value[ARRAY_SHAPE_TEXT_MAX + ARTFS_KEY_LEN];
	size_t i;

	for (i = 0; i < XATTR_COUNT; i++)
		if (strcmp(name, xattr_names[i]) == 0)
			break;
	if (i == XATTR_COUNT)
		return -ENODATA;
	int rc = object_read_meta(t, o->ver, o->hash, o->hash_len, &env);
	if (rc < 0)
		return rc == -ENOENT ? -ENOENT : -EIO;
	switch (i) {
	case 0: snprintf(value, sizeof(value), "%s", env.key); break;
	case 1: snprintf(value, sizeof(value), "%s", envelope_kind_name(env.kind)); break;
	case 2: snprintf(value, sizeof(value), "%s", env.array.dtype); break;
	case 3: array_shape_text(&env.array, value, sizeof(value)); break;
	case 4: snprintf(value, sizeof(value), "%" PRIu64, env.source_token_start); break;
	default: key_hex(env.payload_sha256, 32, value); break;
	}
	return put_value(value, strlen(value), buf, cap, len);
}

int object_listxattr(char *buf, size_t cap, size_t *len)
{
	char list[256];
	size_t n = 0;

	for (size_t i = 0; i < XATTR_COUNT; i++) {
		size_t l = strlen(xattr_names[i]) + 1;
		memcpy(list + n, xattr_names[i], l);
		n += l;
	}
	return put_value(list, n, buf, cap, len);
}
