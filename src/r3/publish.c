/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "format/key.h"
#include "format/npy.h"
#include "lib/log.h"
#include "lib/sha256.h"
#include "r3/object.h"
#include "r3/publish.h"
#include "remote/remote.h"
#include "state/expiry.h"
#include "state/ids.h"

struct publish {
	struct handle h;
	pthread_mutex_t mu;
	struct object *obj;          /* referenced: the node the writer holds */
	struct version *ver;         /* obj->ver */
	char name[ARTFS_HASH_HEX_MAX + 1];
	char key[ARTFS_KEY_LEN + 1]; /* the key this path must carry */
	uint8_t key_bin[32];         /* the same, decoded */
	uint64_t owner;              /* file table of the last write, 0 unknown */
	uint64_t received;
	uint64_t total;              /* 4 + H + payload, once the header is in */
	bool have_header;
	/* The key was committed when the header came: the bytes are only
	 * hashed, nothing is stored or reserved, and the outcome is the
	 * comparison made then (0 identical, -EEXIST different). */
	bool onto_existing;
	int existing_result;
	bool fetched;                /* the bytes came from the cluster: not written back */
	bool checked;                /* the payload hashed to payload_sha256 */
	uint64_t npy_size;           /* what a read serves, once checked */
	uint64_t reserved;           /* bytes of t->bytes_reserved held: those received,
				      * or all of them at once (reserved_all) */
	bool reserved_all;           /* a batch record whose bytes are all in one write */
	bool finished;               /* result is final */
	int result;                  /* the publish's errno, once finished */
	int error;                   /* sticky failure before finishing */
	struct envelope env;
	struct store_tmp tmp;
	struct sha256 sha;           /* of the payload */
	uint8_t head[ENVELOPE_HEADER_BYTES_MAX];
};

static void unreserve(struct tree *t, struct publish *u)
{
	if (!u->reserved)
		return;
	pthread_mutex_lock(&t->lock);
	t->bytes_reserved -= u->reserved;
	pthread_mutex_unlock(&t->lock);
	u->reserved = 0;
}

/* The errno a publish answers when the daemon runs out of descriptors:
 * ENFILE, the daemon's table is full (EMFILE would blame the caller's). */
static int resource_errno(int rc)
{
	return rc == -EMFILE || rc == -ENFILE ? -ENFILE : rc == -ENOMEM ? -ENOMEM : 0;
}

static void drop_data(struct tree *t, struct publish *u)
{
	store_tmp_close(&u->tmp);
	sha256_abandon(&u->sha);
	unreserve(t, u);
}

/* A refused envelope: counted, logged once with the object's name, sticky. */
static int reject(struct tree *t, struct publish *u, enum envelope_error why, const char *detail)
{
	counter_inc(&t->metrics.rejected[why]);
	log_warn("publish %s/%s: rejected (%s): %s", u->ver->name, u->name,
		 envelope_error_name(why), detail);
	drop_data(t, u);
	u->error = -EBADMSG;
	return u->error;
}

static int fail(struct tree *t, struct publish *u, int err, const char *what)
{
	if (err == -EFBIG)
		counter_inc(&t->metrics.rejected_too_large);
	else if (err == -ENOSPC)
		counter_inc(&t->metrics.rejected_no_space);
	else
		counter_inc(&t->metrics.publish_errors);
	log_warn("publish %s/%s: %s", u->ver->name, u->name, what);
	drop_data(t, u);
	u->error = err;
	return err;
}

/* The committed object that holds this publish's key, referenced: by its
 * name (looked for in the store where its version is not listed yet, after
 * a takeover), or by its key (objects found at a restart get their key a
 * little later: the caller waited for that, unless the holder's key filter
 * said that none holds it). */
static struct object *existing(struct tree *t, struct publish *u)
{
	struct object *o = version_object_find(t, u->ver, u->obj->hash, u->obj->hash_len);

	if (o)
		return o;
	pthread_mutex_lock(&t->lock);
	o = index_key_find(&t->idx, u->key_bin);
	if (o)
		node_ref(&o->node);
	pthread_mutex_unlock(&t->lock);
	return o;
}

/* old has only a key and this publish gives a name: identical content
 * moves old to that name at commit instead of storing a second copy. */
static bool adoptable(const struct publish *u, const struct object *old)
{
	return old->ver->keyonly && !u->ver->keyonly;
}

/* The key already holds an object: identical content is 0, different
 * content -EEXIST (logged with both checksums). */
static int compare_existing(struct tree *t, struct publish *u, struct object *o)
{
	struct envelope old;
	int rc = object_read_meta(t, o->ver, o->hash, o->hash_len, &old);

	if (rc == -ENOENT)
		return rc; /* removed meanwhile */
	if (rc < 0) {
		int res = resource_errno(rc);
		log_warn("publish %s/%s: the key's stored object is unreadable (%s); publish refused",
			 u->ver->name, u->name, strerror(-rc));
		return res ? res : -EIO;
	}
	if (envelope_same(&old, &u->env))
		return 0;
	char a[65], b[65];
	key_hex(old.payload_sha256, 32, a);
	key_hex(u->env.payload_sha256, 32, b);
	log_warn("publish %s/%s: collision: the key holds different content "
		 "(stored payload %s, offered %s)", u->ver->name, u->name, a, b);
	return -EEXIST;
}

/* Counts the outcome of a publish onto a committed key. */
static int count_existing(struct tree *t, int rc)
{
	if (rc == 0)
		counter_inc(&t->metrics.republish_identical);
	else if (rc == -EEXIST)
		counter_inc(&t->metrics.collisions);
	else
		counter_inc(&t->metrics.publish_errors);
	return rc;
}

static const struct handle_ops publish_ops;

int publish_begin(struct tree *t, struct object *obj, struct handle **h)
{
	struct publish *u = calloc(1, sizeof(*u));

	if (!u)
		return -ENOMEM;
	u->obj = obj;
	u->ver = obj->ver;
	u->tmp.fd = -1;
	object_name(obj, u->name);
	version_object_key(u->ver, obj->hash, obj->hash_len, u->key);
	key_sha256_decode(u->key + sizeof(ARTFS_KEY_PREFIX) - 1, u->key_bin);

	pthread_mutex_lock(&t->lock);
	if (u->ver->removed) { /* collected or removed since the lookup */
		pthread_mutex_unlock(&t->lock);
		free(u);
		return -ENOENT;
	}
	u->ver->publishing++;
	u->ver->open_files++;
	t->publishing++;
	pthread_mutex_unlock(&t->lock);
		pthread_mutex_init(&u->mu, NULL);
	node_ref(&obj->node);
	version_touch(u->ver);
	handle_init(&u->h, &publish_ops);
	*h = &u->h;
	return 0;
}

/* Under t->lock: n more bytes fit beside the committed ones, those of
 * the publishes in flight and, while a warm takeover counts the store,
 * the bound of those not counted yet. */
static bool fits_locked(const struct tree *t, uint64_t n)
{
	uint64_t held = t->bytes_used + t->bytes_reserved + t->unsized_bound;

	return held <= t->cfg->capacity && n <= t->cfg->capacity - held;
}

/* Room for need more bytes under capacity=, of which reserve bytes are
 * held from now on, in one look under t->lock. Bytes are reserved as they
 * arrive, so a writer that stalls after its header holds only what it sent
 * (a batch record buffered whole reserves all of its bytes at once). A
 * full store first collects the versions that have expired. */
static int make_room(struct tree *t, struct publish *u, uint64_t need, uint64_t reserve)
{
	if (!t->warm_bytes)
		sizing_wait(t); /* capacity needs every stored byte counted */
	for (int attempt = 0;; attempt++) {
		pthread_mutex_lock(&t->lock);
		bool fits = fits_locked(t, need), counting = t->sizing;
		if (fits) {
			t->bytes_reserved += reserve;
			u->reserved += reserve;
			sizing_note_bound_locked(t);
		}
		pthread_mutex_unlock(&t->lock);
		if (fits)
			return 0;
		if (counting) { /* not within the bound: decided on the count */
			sizing_wait(t);
			attempt--;
			continue;
		}
		if (attempt || expiry_collect(t) == 0)
			return -ENOSPC;
	}
}


static int no_space(struct tree *t, struct publish *u)
{
	char what[160];

	snprintf(what, sizeof(what), "store full: %" PRIu64 " bytes would exceed capacity %" PRIu64,
		 u->total, t->cfg->capacity);
	return fail(t, u, -ENOSPC, what);
}

/* The whole header is in: check it, size the object, open its file.
 * parsed: the header as the caller parsed it already (a batch), or NULL
 * to parse it from u->head; avail: bytes of the envelope that this write
 * stores (the header and what follows it; a batch record's all, when it is
 * buffered whole), whose room is reserved here. */
static int accept_header(struct tree *t, struct publish *u, const struct envelope *parsed,
			 uint64_t avail)
{
	char detail[256];
	uint32_t hlen = u->env.header_len;

	if (parsed)
		u->env = *parsed;
	else {
		enum envelope_error why = envelope_parse_header(u->head + ENVELOPE_PREFIX_LEN, hlen,
								&u->env, detail, sizeof(detail));
		if (why)
			return reject(t, u, why, detail);
	}
	if (strcmp(u->env.key, u->key) != 0) {
		snprintf(detail, sizeof(detail), "key %s is not the key of this path (%s)",
			 u->env.key, u->key);
		return reject(t, u, ENVELOPE_KEY, detail);
	}
	u->total = envelope_total_len(&u->env);
	if (u->total > t->cfg->max_object) {
		if (u->total == UINT64_MAX)
			snprintf(detail, sizeof(detail), "declared size overflows 64 bits");
		else
			snprintf(detail, sizeof(detail), "object of %" PRIu64 " bytes exceeds max_object %" PRIu64,
				 u->total, t->cfg->max_object);
		return fail(t, u, -EFBIG, detail);
	}
	u->have_header = true;
	if (sha256_begin(&u->sha) < 0)
		return fail(t, u, -ENOMEM, "out of memory");
	sizing_wait_for_key(t, u->key_bin); /* the key goes into the filter at its link */
	struct object *old = existing(t, u);
	if (old && !adoptable(u, old)) {
		/* Decided now, against what is stored; the payload only has to
		 * hash to what the header says. Needs no room, stores nothing. */
		int rc = compare_existing(t, u, old);
		node_unref(&old->node, 1);
		if (rc != -ENOENT) { /* else removed meanwhile: a new object */
			u->onto_existing = true;
			u->existing_result = rc;
			return 0;
		}
	} else if (old)
		node_unref(&old->node, 1); /* its bytes are stored: it may go before commit */
	/* Refused at once when the whole object cannot fit now; a record whose
	 * bytes are all here holds its room from now on, else this write's. */
	bool whole = avail >= u->total;
	if (make_room(t, u, u->total, whole ? u->total : avail) < 0)
		return no_space(t, u);
	u->reserved_all = whole;
	int rc = store_tmp_open(&t->store, &u->tmp, u->total);
	if (rc < 0) {
		int res = resource_errno(rc);
		snprintf(detail, sizeof(detail), "cannot create a temporary file in the store: %s",
			 strerror(-rc));
		return fail(t, u, res ? res : rc == -ENOSPC ? rc : -EIO, detail);
	}
	return 0;
}

/* Writes head (when the header just completed) and payload bytes at their
 * envelope offset in one system call. */
static int store_bytes(struct tree *t, struct publish *u, const uint8_t *head, size_t head_len,
		       const uint8_t *payload, size_t payload_len, uint64_t off)
{
	struct iovec iov[2] = { { (void *)head, head_len }, { (void *)payload, payload_len } };
	size_t want = head_len + payload_len;
	int n = head_len ? 2 : 1;
	struct iovec *v = head_len ? iov : iov + 1;

	while (want) {
		ssize_t w = pwritev(u->tmp.fd, v, n, (off_t)off);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			char what[128];
			int e = errno;
			snprintf(what, sizeof(what), "writing to the store: %s", strerror(e));
			return fail(t, u, e == ENOSPC ? -ENOSPC : -EIO, what);
		}
		want -= (size_t)w;
		off += (uint64_t)w;
		while (n && (size_t)w >= v->iov_len) {
			w -= (ssize_t)v->iov_len;
			v++;
			n--;
		}
		if (n) {
			v->iov_base = (char *)v->iov_base + w;
			v->iov_len -= (size_t)w;
		}
	}
	return 0;
}

static int consume(struct tree *t, struct publish *u, uint64_t off, const uint8_t *p, size_t n,
		   const struct envelope *parsed)
{
	size_t head_len = 0;
	const uint8_t *head = NULL;
	uint64_t store_off = off;

	if (parsed && !u->have_header && u->received == 0 &&
	    n >= ENVELOPE_PREFIX_LEN + (uint64_t)parsed->header_len) {
		/* A batch parsed this header already: taken as it is, and stored
		 * with the payload from the caller's buffer. */
		u->env.header_len = parsed->header_len;
		head_len = ENVELOPE_PREFIX_LEN + (size_t)parsed->header_len;
		u->received = head_len;
		int rc = accept_header(t, u, parsed, n);
		if (rc < 0)
			return rc;
		head = p;
		p += head_len;
		n -= head_len;
		store_off = 0;
	}
	if (!u->have_header) {
		/* Gather the u32 length, then the JSON header, in u->head. */
		uint64_t need = u->received < ENVELOPE_PREFIX_LEN
					? ENVELOPE_PREFIX_LEN
					: ENVELOPE_PREFIX_LEN + (uint64_t)u->env.header_len;
		while (!u->have_header && n) {
			size_t take = (size_t)(need - u->received) < n ? (size_t)(need - u->received) : n;
			memcpy(u->head + u->received, p, take);
			u->received += take;
			p += take;
			n -= take;
			if (u->received < need)
				break;
			if (need == ENVELOPE_PREFIX_LEN) {
				uint32_t hlen;
				if (envelope_header_len(u->head, &hlen)) {
					char d[64];
					snprintf(d, sizeof(d), "header length %u outside 1..%u", hlen,
						 ARTFS_ENVELOPE_HEADER_MAX);
					return reject(t, u, ENVELOPE_HEADER_LENGTH, d);
				}
				u->env.header_len = hlen;
				need = ENVELOPE_PREFIX_LEN + (uint64_t)hlen;
			} else {
				int rc = accept_header(t, u, NULL, need + n);
				if (rc < 0)
					return rc;
				head = u->head;
				head_len = (size_t)need;
				store_off = 0;
			}
		}
		if (!u->have_header)
			return 0;
	}
	if (head) /* checked now: later reads of the envelope compare its digest */
		object_header_learn_unshared(u->obj, head + ENVELOPE_PREFIX_LEN,
					     head_len - ENVELOPE_PREFIX_LEN);
	if (n > u->total - u->received) {
		char d[128];
		snprintf(d, sizeof(d), "more than the %" PRIu64 " bytes the header declares", u->total);
		return reject(t, u, ENVELOPE_TRAILING, d);
	}
	if (n)
		sha256_update(&u->sha, p, n);
	if (!u->onto_existing) {
		/* the write that brought the header reserved in accept_header */
		if (!u->reserved_all && !head && make_room(t, u, n, n) < 0)
			return no_space(t, u);
		int rc = store_bytes(t, u, head, head_len, p, n, store_off);
		if (rc < 0)
			return rc;
	}
	u->received += n;
	return 0;
}

static int write_parsed(struct tree *t, struct handle *h, uint64_t off, const void *buf,
			size_t len, uint64_t owner, const struct envelope *parsed)
{
	struct publish *u = (struct publish *)h;
	int rc;

	pthread_mutex_lock(&u->mu);
	if (owner)
		u->owner = owner;
	if (u->finished)
		rc = -EPERM; /* published objects are immutable */
	else if (u->error)
		rc = u->error;
	else if (off != u->received) {
		char d[96];
		snprintf(d, sizeof(d), "write at offset %" PRIu64 ", expected %" PRIu64, off, u->received);
		rc = reject(t, u, ENVELOPE_OUT_OF_ORDER, d);
	} else {
		if (off == 0) /* from now on a daemon that takes over cannot go on with it */
			revive_note(t, h, REVIVE_BUSY);
		rc = consume(t, u, off, buf, len, parsed);
	}
	if (u->obj->state == OBJECT_PUBLISHING) /* what fstat of the writer shows */
		atomic_store(&u->obj->file_size, u->received);
	pthread_mutex_unlock(&u->mu);
	return rc < 0 ? rc : (int)len;
}

static int publish_write(struct tree *t, struct handle *h, uint64_t off, const void *buf,
			 size_t len, uint64_t owner)
{
	return write_parsed(t, h, off, buf, len, owner, NULL);
}

int publish_write_parsed(struct tree *t, struct handle *h, const struct envelope *env,
			 const void *buf, size_t len, uint64_t owner)
{
	return write_parsed(t, h, 0, buf, len, owner, env);
}

/* An identical publish by path of an object that had only a key: the
 * object moves to its name (one file, one charge), and is then reachable
 * under both. Under the key's commit lock. 1 when old went meanwhile (then this
 * publish's own bytes are committed instead). */
static int adopt(struct tree *t, struct publish *u, struct object *old)
{
	struct object *o = u->obj;
	char from[ARTFS_HASH_HEX_MAX + 1];
	uint64_t bytes = atomic_load(&old->file_size);
	int rc;

	object_name(old, from);
	if (bytes == OBJECT_SIZE_UNKNOWN && object_envelope_size(t, old, &bytes) < 0)
		return 1; /* gone from the store: commit this publish's own bytes */
	memcpy(o->key, old->key, 32);
	o->keyed = true;
	atomic_store(&o->file_size, bytes);
	atomic_store(&o->npy_size, atomic_load(&old->npy_size));
	pthread_mutex_lock(&t->lock);
	if (old->state != OBJECT_COMMITTED) {
		pthread_mutex_unlock(&t->lock);
		return 1; /* collected meanwhile */
	}
	if (atomic_load(&old->file_size) == OBJECT_SIZE_UNKNOWN) {
		/* found at a restart, not counted yet (as remove_object does) */
		atomic_store(&old->file_size, bytes);
		sizing_counted_locked(t, old->ver, bytes);
	}
	rc = store_object_move(old->ver->dirfd, old->ver->keyonly, from, u->ver->dirfd,
			       u->ver->keyonly, u->name);
	if (!atomic_load(&old->ver->listed))
		old->ver->unlisted_removals++;
	if (rc == 0) {
		/* o stands for old's file now: old's header, which may be laid
		 * out otherwise than this publish's (unknown: learned at a read) */
		memcpy(o->head_digest, old->head_digest, sizeof(o->head_digest));
		atomic_store(&o->sha_at, atomic_load(&old->sha_at));
		index_object_remove(&t->idx, old->ver, old);
		old->ver->bytes -= bytes;
		rc = index_object_insert(&t->idx, u->ver, o);
		if (rc == 0)
			u->ver->bytes += bytes;
		else { /* out of memory: the object is gone from the index */
			t->objects--;
			t->bytes_used -= bytes;
		}
	}
	pthread_mutex_unlock(&t->lock);
	if (rc < 0)
		return fail(t, u, rc == -ENOMEM ? rc : -EIO, "cannot give a key-only object its name");
	counter_inc(&t->metrics.republish_identical);
	log_debug("publish %s/%s: the key-only object %s now has this name", u->ver->name,
		  u->name, from);
	return 0;
}

/* The cluster said no: nothing is committed here either. */
static int remote_refused(struct tree *t, struct publish *u, int rc)
{
	if (rc == -EEXIST) {
		counter_inc(&t->metrics.collisions);
		log_warn("publish %s/%s: collision: the cluster holds different content for %s",
			 u->ver->name, u->name, u->key);
		drop_data(t, u);
		u->error = rc;
		return rc;
	}
	if (rc == -ENOSPC)
		return fail(t, u, rc, "the cluster is out of memory (maxmemory); nothing committed");
	return fail(t, u, -EIO, "the cluster did not take it in time; nothing committed");
}

/* The staged envelope, for the cluster: its bytes are in the temporary
 * file only, read back whole into *buf (malloc'd, u->total bytes) once per
 * publish. 0; -ENOMEM (nothing of u decided); or u's failure, -EIO. */
static int read_back(struct tree *t, struct publish *u, uint8_t **buf)
{
	*buf = malloc(u->total ? u->total : 1);
	if (!*buf)
		return -ENOMEM;
	if (store_pread_all(u->tmp.fd, *buf, u->total, 0) == 0)
		return 0;
	free(*buf);
	*buf = NULL;
	return fail(t, u, -EIO, "cannot read back its temporary file");
}

/* With remote=: the object goes to the cluster before the local commit, so
 * that close() == 0 means it is on this node and in the cluster. */
static int put_remote(struct tree *t, struct publish *u)
{
	uint8_t *buf;
	int rc = read_back(t, u, &buf);

	if (rc == -ENOMEM)
		return fail(t, u, rc, "out of memory");
	if (rc < 0)
		return rc;
	rc = remote_put(t->remote, u->key + sizeof(ARTFS_KEY_PREFIX) - 1, buf, u->total);
	free(buf);
	return rc < 0 ? remote_refused(t, u, rc) : 0;
}

static int commit_locked(struct tree *t, struct publish *u);

/* Links the verified file into place and indexes it (or finds the key
 * held: identical 0, different EEXIST). */
static int commit(struct tree *t, struct publish *u)
{
	if (u->onto_existing)
		return count_existing(t, u->existing_result);
	if (t->remote && !u->fetched) {
		int rc = put_remote(t, u);
		if (rc < 0)
			return rc;
	}
	/* One commit of this key at a time (and no removal between its check
	 * and its link): a key is held by one object, in one file. */
	pthread_mutex_t *commit_lock = commit_lock_of(t, u->key_bin);
	pthread_mutex_lock(commit_lock);
	int rc = commit_locked(t, u);
	pthread_mutex_unlock(commit_lock);
	return rc;
}

/* Links the verified file to its name (the link is what a restart finds). */
static int link_into_place(struct tree *t, struct publish *u)
{
	struct stat st;

	held_keys_add(&t->held, u->key_bin); /* before its object can be in the store */
	int rc = store_tmp_link(u->ver->dirfd, u->ver->keyonly, &u->tmp, u->name);

	if (rc == -EEXIST)
		return count_existing(t, -EEXIST);
	if (rc < 0 || fstat(u->tmp.fd, &st) < 0) {
		char what[128];
		snprintf(what, sizeof(what), "cannot link into the store: %s",
			 strerror(rc < 0 ? -rc : errno));
		return fail(t, u, -EIO, what);
	}
	struct object *o = u->obj; /* a fresh node from create, never indexed before */
	memcpy(o->key, u->key_bin, sizeof(o->key));
	o->keyed = true;
	o->file_size = u->total;
	atomic_store(&o->npy_size, u->npy_size);
	atomic_store(&o->ctime_ns, (uint64_t)st.st_ctim.tv_sec * 1000000000u + (uint64_t)st.st_ctim.tv_nsec);
	atomic_store(&o->verified, 1);
	return 0;
}

/* Under t->lock: the linked object indexed (visible from now on) and its
 * bytes moved from reserved to used. */
static int index_locked(struct tree *t, struct publish *u)
{
	/* While a takeover lists the store, the listing (or a lookup) may find
	 * the file this publish has just linked before it is indexed: ours
	 * takes its place, and what the count made of it is undone. */
	struct object *found = index_object_find(&t->idx, u->ver, u->obj->hash, u->obj->hash_len);
	if (found && found != u->obj) {
		uint64_t size = atomic_load(&found->file_size);
		if (size != OBJECT_SIZE_UNKNOWN) {
			t->bytes_used -= size;
			u->ver->bytes -= size;
			if (t->warm_bytes) /* it never stood for bytes found at the start */
				t->unsized_bound += size;
		}
		t->objects--;
		index_object_remove(&t->idx, u->ver, found);
	}
	int rc = index_object_insert(&t->idx, u->ver, u->obj);

	if (rc == 0) {
		t->bytes_reserved -= u->reserved;
		u->reserved = 0;
		t->bytes_used += u->total;
		t->objects++;
		u->ver->bytes += u->total;
	}
	return rc;
}

/* After index_locked: a failure undone (nothing stays in the store). */
static int indexed(struct tree *t, struct publish *u, int rc)
{
	if (rc < 0) {
		store_object_remove(u->ver->dirfd, u->ver->keyonly, u->name);
		return fail(t, u, rc, "out of memory while indexing");
	}
	counter_inc(&t->metrics.publishes);
	return 0;
}

static int commit_locked(struct tree *t, struct publish *u)
{
	int rc;

	struct object *old = existing(t, u);
	if (old) {
		rc = compare_existing(t, u, old);
		bool adopting = rc == 0 && adoptable(u, old);
		if (adopting)
			rc = adopt(t, u, old); /* counts itself; 1: old went, commit ours */
		node_unref(&old->node, 1);
		if (!adopting) /* in the index but not in the store: damaged */
			return count_existing(t, rc == -ENOENT ? -EIO : rc);
		if (rc <= 0)
			return rc;
	}
	rc = link_into_place(t, u);
	if (rc < 0)
		return rc;
	pthread_mutex_lock(&t->lock);
	rc = index_locked(t, u);
	pthread_mutex_unlock(&t->lock);
	return indexed(t, u, rc);
}

/* All bytes in and the payload hashing to what the header says: 0, or
 * the publish's errno (sticky). Under u->mu. */
static int payload_checked(struct tree *t, struct publish *u)
{
	uint8_t digest[32];

	if (u->error)
		return u->error;
	if (!u->have_header || u->received < u->total)
		return -EBADMSG; /* counted and logged if the last close leaves it so */
	if (u->checked)
		return 0;
	sha256_end(&u->sha, digest);
	if (memcmp(digest, u->env.payload_sha256, 32) != 0) {
		char a[65], d[128];
		key_hex(digest, 32, a);
		snprintf(d, sizeof(d), "payload hashes to %s, not to payload_sha256", a);
		return reject(t, u, ENVELOPE_CHECKSUM, d);
	}
	u->checked = true;
	npy_file_size(&u->env.array, &u->npy_size);
	/* A restart knows its size from this; marked here, before the commit
	 * and its key's commit lock. */
	if (u->tmp.fd >= 0)
		store_mark_npy_size(u->tmp.fd, u->npy_size);
	return 0;
}

/* Under u->mu, after its commit: the outcome is final. */
static void finished(struct tree *t, struct publish *u, int rc)
{
	u->finished = true;
	u->result = rc;
	unreserve(t, u);
	version_touch(u->ver);
	pthread_mutex_unlock(&u->mu);
}

static int publish_finish(struct tree *t, struct handle *h)
{
	struct publish *u = (struct publish *)h;
	int rc;

	pthread_mutex_lock(&u->mu);
	if (u->finished)
		rc = u->result;
	else if ((rc = payload_checked(t, u)) == 0) {
		/* Its temporary file is closed at release, after a batch's
		 * commits (put.c); the room it held is given back now. A daemon
		 * that takes over in between finds out from the store what the
		 * commit came to, and after it reads that. */
		revive_note_commit(t, h, u->key_bin, u->env.payload_sha256);
		rc = commit(t, u);
		revive_note_result(t, h, rc);
		finished(t, u, rc);
		return rc;
	}
	version_touch(u->ver);
	pthread_mutex_unlock(&u->mu);
	return rc;
}

int publish_prepare(struct tree *t, struct handle *h, uint8_t **buf, size_t *len)
{
	struct publish *u = (struct publish *)h;
	int rc;

	*buf = NULL;
	pthread_mutex_lock(&u->mu);
	if (u->finished)
		rc = u->result;
	else if ((rc = payload_checked(t, u)) == 0 && !u->onto_existing && !u->fetched &&
		 (rc = read_back(t, u, buf)) == 0)
		*len = u->total;
	pthread_mutex_unlock(&u->mu);
	return rc;
}

int publish_check(struct tree *t, struct handle *h, bool *to_cluster)
{
	struct publish *u = (struct publish *)h;
	int rc;

	pthread_mutex_lock(&u->mu);
	if (u->finished)
		rc = u->result;
	else
		rc = payload_checked(t, u);
	*to_cluster = rc == 0 && !u->finished && t->remote && !u->onto_existing && !u->fetched;
	pthread_mutex_unlock(&u->mu);
	return rc;
}

bool publish_room_for(struct tree *t, uint64_t n)
{
	if (!t->warm_bytes)
		sizing_wait(t);
	pthread_mutex_lock(&t->lock);
	bool fits = fits_locked(t, n), counting = t->sizing;
	pthread_mutex_unlock(&t->lock);
	if (fits || !counting)
		return fits;
	sizing_wait(t);
	pthread_mutex_lock(&t->lock);
	fits = fits_locked(t, n);
	pthread_mutex_unlock(&t->lock);
	return fits;
}

void publish_remote_result(struct tree *t, struct handle *h, int rc)
{
	struct publish *u = (struct publish *)h;

	pthread_mutex_lock(&u->mu);
	if (rc == 0)
		u->fetched = true; /* in the cluster already: commit here only */
	else if (!u->finished && !u->error)
		remote_refused(t, u, rc);
	pthread_mutex_unlock(&u->mu);
}

void publish_mark_fetched(struct handle *h)
{
	((struct publish *)h)->fetched = true;
}

static bool publish_busy(struct handle *h)
{
	struct publish *u = (struct publish *)h;

	if (pthread_mutex_trylock(&u->mu) != 0)
		return true;
	pthread_mutex_unlock(&u->mu);
	return false;
}

int publish_bytes(struct handle *h, uint8_t *dst, size_t len)
{
	struct publish *u = (struct publish *)h;

	if (len > u->received)
		return -EIO;
	if (!u->have_header) { /* still in the header's buffer */
		memcpy(dst, u->head, len);
		return 0;
	}
	return u->onto_existing || u->tmp.fd < 0 || store_pread_all(u->tmp.fd, dst, len, 0) < 0
	       ? -EIO : 0;
}

uint64_t publish_received(struct handle *h)
{
	return ((struct publish *)h)->received;
}

/* Drained for an upgrade: what was written goes to the handle's text in
 * the holder's memory, for the next daemon to go on with (publish_resume);
 * a decided outcome is in the record already. */
static void publish_hand_over(struct tree *t, struct handle *h)
{
	struct publish *u = (struct publish *)h;
	struct held_handle *rec = h->fh ? ids_handle_record(t, h->fh) : NULL;

	pthread_mutex_lock(&u->mu);
	if (!rec || u->finished || u->received == 0) {
		pthread_mutex_unlock(&u->mu);
		return;
	}
	if (u->error) /* what its close would say */
		revive_note_result(t, h, u->error);
	else if (held_text_reserve(&t->held, rec, u->received) < 0 ||
		 publish_bytes(h, held_text(&t->held, rec), u->received) < 0)
		log_warn("publish %s/%s: cannot hand its %" PRIu64 " bytes to the next daemon; its "
			 "writer's next call fails (EIO)", u->ver->name, u->name, u->received);
	else {
		rec->text_len = u->received;
		revive_note(t, h, REVIVE_HANDED);
	}
	pthread_mutex_unlock(&u->mu);
}

int publish_resume(struct tree *t, struct object *obj, const uint8_t *bytes, size_t len,
		   struct handle **h)
{
	int rc = publish_begin(t, obj, h);

	if (rc < 0) {
		node_unref(&obj->node, 1);
		return rc;
	}
	if (len) /* a refusal is sticky: the writer's close says it */
		write_parsed(t, *h, 0, bytes, len, 0, NULL);
	return 0;
}

void publish_discard(struct handle *h)
{
	struct publish *u = (struct publish *)h;

	pthread_mutex_lock(&u->mu);
	if (!u->finished && !u->error)
		u->error = -ECANCELED;
	pthread_mutex_unlock(&u->mu);
}

static int publish_close(struct tree *t, struct handle *h, uint64_t owner)
{
	struct publish *u = (struct publish *)h;

	pthread_mutex_lock(&u->mu);
	bool foreign = !u->finished && !u->error && owner && u->owner && owner != u->owner;
	pthread_mutex_unlock(&u->mu);
	return foreign ? 0 : publish_finish(t, h);
}

static void publish_release(struct tree *t, struct handle *h)
{
	struct publish *u = (struct publish *)h;

	/* Drained for an upgrade, its writer goes on with the next daemon. */
	if (!u->finished && !u->error && !t->handing_over) {
		char d[128];
		if (u->have_header)
			snprintf(d, sizeof(d), "closed after %" PRIu64 " of %" PRIu64
				 " bytes; nothing committed", u->received, u->total);
		else
			snprintf(d, sizeof(d), "closed after %" PRIu64
				 " bytes, before the header was complete; nothing committed", u->received);
		reject(t, u, ENVELOPE_TRUNCATED, d);
	}
	drop_data(t, u);
	pthread_mutex_lock(&t->lock);
	u->ver->publishing--;
	u->ver->open_files--;
	t->publishing--;
	pthread_mutex_unlock(&t->lock);
	version_touch(u->ver);
	node_unref(&u->obj->node, 1);
	pthread_mutex_destroy(&u->mu);
	free(u);
}


/* A publish may wait for the start-up count of the store's bytes, and a
 * commit for a write in progress. */
static bool publish_write_quick(struct tree *t, struct handle *h, size_t len)
{
	(void)h;
	return len <= HANDLE_QUICK_BYTES && !t->sizing; /* a key the filter may hold waits */
}

static bool publish_flush_quick(struct tree *t, struct handle *h)
{
	return !t->sizing && !t->remote && !publish_busy(h);
}

static const struct handle_ops publish_ops = {
	.kind = "publish",
	.held_kind = HANDLE_PUBLISH,
	.hand_over = publish_hand_over,
	.write = publish_write,
	.flush = publish_close,
	.fsync = publish_finish,
	.release = publish_release,
	.write_quick = publish_write_quick,
	.flush_quick = publish_flush_quick,
};
