/* SPDX-License-Identifier: Apache-2.0 */
/* The namespace core (src/ns/tree.h) driven as the FUSE layer drives it, by a
 * sequence of operations decoded from the input: lookup, mkdir, create,
 * write (raw bytes or a valid envelope for the file's own name), flush,
 * fsync, release, unlink, rmdir, forget, open, read, getattr, setattr,
 * readdir, xattrs, statfs, a materialize request, a control command,
 * making a version idle (as if ttl had passed) and a daemon restart over
 * the same store. Each run has its own tree over a fresh store in this
 * process's scratch directory (/dev/shm), with a small capacity and ttl
 * so that ENOSPC, collection and re-indexing are reached.
 *
 * Like the kernel, the driver only uses nodes it holds a lookup on, and
 * never forgets the last lookup of a node it has open.
 *
 * It found two uses after free (publish_begin and listing_open freed a
 * handle already linked into the list of open handles: a create in a
 * version removed meanwhile, an opendir of a file); the tree now registers
 * a handle only once its open succeeded, and the driver goes there freely.
 * ARTFS_FUZZ_TRACE=1 prints each operation. */
#include "autoconf.h"

#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/envelope.h"
#include "format/key.h"
#include "format/npy.h"
#include "fuzz.h"
#include "lib/sha256.h"
#include "ns/tree.h"
#include "r3/scan.h"
#include "state/expiry.h"

#define NODES_MAX 32
#define FILES_MAX 16
#define OPS_MAX 64
#define PUBLISHED_MAX 16

enum file_kind { F_FILE = 1, F_DIR };

struct looked {
	struct node *n;
	uint64_t lookups;
};

struct open_file {
	struct handle *h;
	enum file_kind kind;
	struct node *n;      /* the node it was opened on (held) */
	uint64_t off;        /* next sequential write */
};

struct ns {
	struct artfs_config cfg;
	struct tree t;
	char store[320];
	struct looked nodes[NODES_MAX];  /* nodes[0] is the root, never forgotten */
	size_t nnodes;
	struct open_file files[FILES_MAX];
	size_t nfiles;
	char published[PUBLISHED_MAX][ARTFS_HASH_HEX_MAX + 1];
	size_t npublished;
};

static bool trace; /* ARTFS_FUZZ_TRACE=1: each operation on stderr */

static const char *const names[] = {
	"v0", "v1", "default", "aa", "0a0b", "ff", "00112233",
	"3da2892d37823d9298e1d5011d7dcfaaf2d9d9a6d465e99be33af5be1d87c12b",
	ARTFS_MATERIALIZE_NAME, "weights", ARTFS_INFO_DIR, "metrics", "config", "control",
	"rank0", "manifest.json", "status", "AA", "a", "abc", ".", "..", "", "v0/aa", "-v",
	ARTFS_KEYS_DIR, ARTFS_PUT_NAME, ARTFS_GET_NAME,
	"35f11f5976d0a00dadd63d221a9fa3a564e26b19c2b91a1e85be26101d22cf14",
};
#define NNAMES (sizeof(names) / sizeof(names[0]))

static const char *const xattrs[] = {
	ARTFS_XATTR_KEY, ARTFS_XATTR_KIND, ARTFS_XATTR_DTYPE, ARTFS_XATTR_SHAPE,
	ARTFS_XATTR_TOKEN_START, ARTFS_XATTR_SHA256, "user.other", "",
};

static const char *const commands[] = {
	"unload v0\n", "load v0 /nonexistent\n", "load v0 /tmp gpus=0,1,\n", "load bad/name /x\n",
	"load v0 relative gpus=\n", "nonsense\n", "unload\n", "load v0 /x gpus=99999999999\n",
};

/* Every errno the core may answer with here; anything else is a bug. EIO
 * is not among them: nothing in these runs damages the store. */
static void check_rc(int rc)
{
	if (rc >= 0)
		return;
	switch (-rc) {
	case EINVAL: case ENOENT: case EEXIST: case EPERM: case EACCES: case EISDIR:
	case ENOTDIR: case ENOTEMPTY: case EBUSY: case EBADMSG: case ENOSPC: case EFBIG:
	case ENODATA: case ERANGE: case EBADF: case ENODEV: case ECANCELED: case ENOMEM:
	case ESTALE:
		return;
	default:
		fprintf(stderr, "unexpected errno %d (%s)\n", -rc, strerror(-rc));
		FZ_CHECK(!"an errno the namespace should not answer");
	}
}

static const char *pick_name(struct fuzz_in *in, char *buf, size_t cap)
{
	uint8_t sel = fz_u8(in);

	if (sel < 0xe0)
		return names[sel % NNAMES];
	fz_str(in, buf, cap - 1 < 200 ? cap - 1 : 200, 'x');
	return buf;
}

static bool version_removed(struct ns *s, struct version *v)
{
	pthread_mutex_lock(&s->t.lock);
	bool removed = v->removed;
	pthread_mutex_unlock(&s->t.lock);
	return removed;
}


/* ---- what the driver holds ------------------------------------------------- */

/* Takes over one lookup of n; false when the table is full and the
 * lookup was forgotten at once. */
static bool hold(struct ns *s, struct node *n)
{
	for (size_t i = 1; i < s->nnodes; i++)
		if (s->nodes[i].n == n) {
			s->nodes[i].lookups++;
			return true;
		}
	if (s->nnodes == NODES_MAX) {
		tree_forget(&s->t, n->id, 1);
		return false;
	}
	s->nodes[s->nnodes++] = (struct looked){ n, 1 };
	return true;
}

static bool is_open(struct ns *s, struct node *n)
{
	for (size_t i = 0; i < s->nfiles; i++)
		if (s->files[i].n == n)
			return true;
	return false;
}

static struct node *pick_node(struct ns *s, struct fuzz_in *in)
{
	return s->nodes[fz_u8(in) % s->nnodes].n;
}

static struct open_file *pick_file(struct ns *s, struct fuzz_in *in)
{
	return s->nfiles ? &s->files[fz_u8(in) % s->nfiles] : NULL;
}

static void add_file(struct ns *s, struct handle *h, enum file_kind kind, struct node *n)
{
	if (s->nfiles == FILES_MAX) {
		tree_release(&s->t, h);
		return;
	}
	s->files[s->nfiles++] = (struct open_file){ h, kind, n, 0 };
}

static void close_file(struct ns *s, struct open_file *f)
{
	if (f->kind == F_DIR)
		tree_releasedir(&s->t, f->h);
	else
		tree_release(&s->t, f->h);
	*f = s->files[--s->nfiles];
}

static void drop_all(struct ns *s)
{
	while (s->nfiles)
		close_file(s, &s->files[s->nfiles - 1]);
	for (size_t i = 1; i < s->nnodes; i++)
		tree_forget(&s->t, s->nodes[i].n->id, s->nodes[i].lookups);
	s->nnodes = 1;
}

/* ---- the tree's lifetime ------------------------------------------------------ */

static void start(struct ns *s, bool wait_sized)
{
	char err[256];

	int rc = tree_open(&s->t, &s->cfg, err, sizeof(err));
	if (rc < 0) {
		fprintf(stderr, "fuzz: tree_open %s: %s\n", s->store, err);
		abort();
	}
	FZ_CHECK(scan_size_start(&s->t) == 0);
	if (wait_sized)
		sizing_wait(&s->t);
	FZ_CHECK(expiry_start(&s->t) == 0);
	s->nodes[0] = (struct looked){ &s->t.root, 0 };
	s->nnodes = 1;
}

static void stop(struct ns *s)
{
	drop_all(s);
	expiry_stop(&s->t, -1);
	tree_close(&s->t);
}

/* ---- publishing ------------------------------------------------------------- */

static const char *const dtypes[] = { "|u1", "<u2", "<i4", "|b1" };

/* The object of a node the tree answered a create or lookup with: an
 * object, or its key view under .keys. */
static struct object *object_of(struct node *n)
{
	return n->type == NODE_KEY ? (struct object *)((char *)n - offsetof(struct object, keynode))
				   : (struct object *)n;
}

/* A valid envelope for object o (its version's name and its hash), with
 * a small payload from the input. */
static uint8_t *make_envelope(struct fuzz_in *in, struct object *o, size_t *len,
			      struct envelope *env, const uint8_t **payload)
{
	uint8_t sel = fz_u8(in);
	uint8_t *out;

	memset(env, 0, sizeof(*env));
	array_dtype_set(&env->array, dtypes[sel % 4]);
	env->array.ndim = (uint8_t)(1 + ((sel >> 2) & 3) % 3);
	for (unsigned d = 0; d < env->array.ndim; d++)
		env->array.shape[d] = 1 + fz_u8(in) % 4;
	env->kind = sel & 0x20 ? ENVELOPE_TAIL : ENVELOPE_BLOCK;
	env->source_token_start = fz_u8(in) % 8;
	version_object_key(o->ver, o->hash, o->hash_len, env->key);
	uint64_t plen;
	FZ_CHECK(array_payload_len(&env->array, &plen) == 0);
	uint8_t *data = calloc(1, (size_t)plen);
	for (size_t i = 0; i < plen && in->n; i++)
		data[i] = fz_u8(in);
	sha256_once(data, (size_t)plen, env->payload_sha256);
	FZ_CHECK(envelope_encode(env, data, plen, &out, len) == 0);
	env->payload_len = plen;
	*payload = out + *len - plen;
	free(data);
	return out;
}

static int write_all(struct ns *s, struct open_file *f, struct fuzz_in *in, const uint8_t *buf,
		     size_t len)
{
	size_t chunk = 1 + fz_u8(in) % 64;
	int rc = 0;

	if (fz_u8(in) & 1)
		chunk = len ? len : 1;
	for (size_t off = 0; off < len && rc >= 0;) {
		size_t n = len - off < chunk ? len - off : chunk;
		rc = tree_write(&s->t, f->h, f->off, buf + off, n, 7);
		check_rc(rc);
		if (rc >= 0) {
			FZ_CHECK((size_t)rc == n);
			f->off += n;
			off += n;
		}
	}
	return rc;
}

/* Reads the whole file from offset 0 into a malloc'd buffer. */
static int read_all(struct ns *s, struct handle *h, uint8_t **out, size_t *out_len)
{
	size_t cap = 4096, len = 0;
	uint8_t *buf = malloc(cap);
	int rc;

	for (;;) {
		const void *data;
		size_t n;
		rc = tree_read(&s->t, h, len, 4096, &data, &n);
		check_rc(rc);
		if (rc < 0)
			break;
		if (n && len + n > cap) {
			cap = 2 * (len + n);
			buf = realloc(buf, cap);
		}
		if (n)
			memcpy(buf + len, data, n);
		tree_read_done(&s->t, h);
		len += n;
		if (n == 0 || len > (64u << 20))
			break;
	}
	if (rc < 0) {
		free(buf);
		return rc;
	}
	*out = buf;
	*out_len = len;
	return 0;
}

/* A whole publish of parent/name, then, when it committed, a read of it
 * by name: the .npy of exactly what was published. */
static void publish_whole(struct ns *s, struct fuzz_in *in)
{
	struct node *parent = pick_node(s, in);
	char buf[256];
	const char *name = pick_name(in, buf, sizeof(buf));
	struct tree_entry e;
	struct open_reply r = { 0 };
	struct handle *h;

	int rc = tree_create(&s->t, parent, name, O_CREAT | O_WRONLY, &e, &h, &r);
	check_rc(rc);
	if (rc < 0)
		return;
	struct open_file f = { h, F_FILE, e.node, 0 };
	struct envelope env;
	const uint8_t *payload;
	size_t len;
	uint8_t *envelope = make_envelope(in, object_of(e.node), &len, &env, &payload);
	write_all(s, &f, in, envelope, len);
	rc = tree_flush(&s->t, h, 7);
	check_rc(rc);
	tree_release(&s->t, h);
	hold(s, e.node);

	if (rc == 0 && parent->type == NODE_VERSION && !version_removed(s, (struct version *)parent)) {
		struct tree_entry got;
		int lrc = tree_lookup(&s->t, parent, name, &got);
		FZ_CHECK(lrc == 0);
		uint64_t npy_size;
		FZ_CHECK(npy_file_size(&env.array, &npy_size) == 0);
		FZ_CHECK((uint64_t)got.st.st_size == npy_size);
		struct handle *rh;
		int orc = tree_open_file(&s->t, got.node, O_RDONLY, &rh, &r);
		FZ_CHECK(orc == 0);
		uint8_t *data;
		size_t dlen;
		FZ_CHECK(read_all(s, rh, &data, &dlen) == 0);
		uint8_t hdr[NPY_HEADER_MAX];
		ssize_t hl = npy_header(&env.array, hdr, sizeof(hdr));
		FZ_CHECK(hl > 0 && dlen == (size_t)hl + env.payload_len);
		FZ_CHECK(memcmp(data, hdr, (size_t)hl) == 0);
		FZ_CHECK(memcmp(data + hl, payload, (size_t)env.payload_len) == 0);
		free(data);
		tree_release(&s->t, rh);
		hold(s, got.node);
		if (s->npublished < PUBLISHED_MAX)
			snprintf(s->published[s->npublished++], sizeof(s->published[0]), "%s", name);
	}
	free(envelope);
}

/* Bytes for an open file: an envelope for an upload, a request for a
 * .materialize, a command for the control file. */
static void write_meaningful(struct ns *s, struct fuzz_in *in, struct open_file *f)
{
	struct node *n = f->n;
	char text[2048];
	size_t len = 0;

	if (f->kind != F_FILE)
		return;
	if (n->type == NODE_OBJECT) {
		struct envelope env;
		const uint8_t *payload;
		size_t elen;
		uint8_t *envelope = make_envelope(in, object_of(n), &elen, &env, &payload);
		uint8_t flip = fz_u8(in);
		if (flip & 1) /* damaged somewhere */
			envelope[fz_u16(in) % elen] ^= (uint8_t)(flip | 1);
		write_all(s, f, in, envelope, elen);
		free(envelope);
	} else if (n->type == NODE_MATERIALIZE) {
		uint8_t sel = fz_u8(in);
		if (sel & 1)
			len += (size_t)snprintf(text + len, sizeof(text) - len, "token_end %u\n", fz_u8(in) % 16);
		if (sel & 2)
			len += (size_t)snprintf(text + len, sizeof(text) - len, "block_size %u\n", 1 + fz_u8(in) % 4);
		for (unsigned k = fz_u8(in) % 5; k && s->npublished && len < sizeof(text) - 200; k--)
			len += (size_t)snprintf(text + len, sizeof(text) - len, "%s\n",
						s->published[fz_u8(in) % s->npublished]);
		write_all(s, f, in, (const uint8_t *)text, len);
	} else if (n->type == NODE_INFO_FILE) {
		const char *c = commands[fz_u8(in) % (sizeof(commands) / sizeof(commands[0]))];
		write_all(s, f, in, (const uint8_t *)c, strlen(c));
	}
}

/* ---- one operation ------------------------------------------------------------ */

static void op(struct ns *s, struct fuzz_in *in)
{
	char buf[256];
	struct tree_entry e;
	struct open_reply r = { 0 };
	struct handle *h;
	struct open_file *f;
	struct node *n;
	const char *name;
	int rc;

	uint8_t code = fz_u8(in) % 20;
	if (trace)
		fprintf(stderr, "op %u (%zu nodes, %zu files)\n", code, s->nnodes, s->nfiles);
	switch (code) {
	case 0:
		n = pick_node(s, in);
		rc = tree_lookup(&s->t, n, pick_name(in, buf, sizeof(buf)), &e);
		check_rc(rc);
		if (rc == 0)
			hold(s, e.node);
		else
			FZ_CHECK(e.node == NULL);
		break;
	case 1:
		n = pick_node(s, in);
		rc = tree_mkdir(&s->t, n, pick_name(in, buf, sizeof(buf)), &e);
		check_rc(rc);
		if (rc == 0)
			hold(s, e.node);
		break;
	case 2: {
		n = pick_node(s, in);
		name = pick_name(in, buf, sizeof(buf));
		int flags = O_CREAT | (fz_u8(in) & 1 ? O_EXCL : 0) | O_WRONLY;
		rc = tree_create(&s->t, n, name, flags, &e, &h, &r);
		check_rc(rc);
		if (rc == 0) {
			if (hold(s, e.node))
				add_file(s, h, F_FILE, e.node);
			else
				tree_release(&s->t, h);
		}
		break;
	}
	case 3:
		if ((f = pick_file(s, in)) && f->kind == F_FILE) {
			const uint8_t *p;
			size_t len = fz_bytes(in, 512, &p);
			uint64_t off = fz_u8(in) & 1 ? fz_num(in) : f->off;
			rc = tree_write(&s->t, f->h, off, p, len, fz_u8(in) % 3);
			check_rc(rc);
			if (rc >= 0 && off == f->off)
				f->off += len;
		}
		break;
	case 4:
		if ((f = pick_file(s, in)))
			write_meaningful(s, in, f);
		break;
	case 5:
		if ((f = pick_file(s, in)) && f->kind == F_FILE)
			check_rc(tree_flush(&s->t, f->h, fz_u8(in) % 3));
		break;
	case 6:
		if ((f = pick_file(s, in)) && f->kind == F_FILE)
			check_rc(tree_fsync(&s->t, f->h));
		break;
	case 7:
		if ((f = pick_file(s, in)))
			close_file(s, f);
		break;
	case 8:
		n = pick_node(s, in);
		check_rc(tree_unlink(&s->t, n, pick_name(in, buf, sizeof(buf)), fz_u8(in) & 1));
		break;
	case 9:
		n = pick_node(s, in);
		check_rc(tree_rmdir(&s->t, n, pick_name(in, buf, sizeof(buf))));
		break;
	case 10: {
		if (s->nnodes < 2)
			break;
		struct looked *held = &s->nodes[1 + fz_u8(in) % (s->nnodes - 1)];
		uint64_t count = 1 + fz_u8(in) % held->lookups;
		if (count == held->lookups && is_open(s, held->n))
			count--; /* the kernel keeps an open file's inode */
		if (!count)
			break;
		tree_forget(&s->t, held->n->id, count);
		held->lookups -= count;
		if (!held->lookups)
			*held = s->nodes[--s->nnodes];
		break;
	}
	case 11: {
		static const int modes[] = { O_RDONLY, O_WRONLY, O_RDWR, O_RDONLY | O_TRUNC };
		n = pick_node(s, in);
		int flags = modes[fz_u8(in) % 4];
		rc = tree_open_file(&s->t, n, flags, &h, &r);
		check_rc(rc);
		if (rc == 0)
			add_file(s, h, F_FILE, n);
		break;
	}
	case 12:
		if ((f = pick_file(s, in)) && f->kind == F_FILE) {
			const void *data;
			size_t len;
			uint64_t off = fz_u8(in) & 1 ? fz_num(in) : 0;
			size_t size = (size_t)(fz_num(in) % (1u << 20));
			rc = tree_read(&s->t, f->h, off, size, &data, &len);
			check_rc(rc);
			if (rc == 0) {
				FZ_CHECK(len <= size);
				if (len) { /* every byte handed out is readable */
					volatile uint8_t sum = 0;
					for (size_t i = 0; i < len; i++)
						sum ^= ((const uint8_t *)data)[i];
					(void)sum;
				}
				tree_read_done(&s->t, f->h);
			}
		}
		break;
	case 13: {
		struct stat st, in_st;
		double timeout;
		n = pick_node(s, in);
		uint8_t sel = fz_u8(in);
		if (sel & 1) {
			rc = tree_getattr(&s->t, n, &st, &timeout);
		} else {
			memset(&in_st, 0, sizeof(in_st));
			in_st.st_size = (off_t)(fz_num(in) & INT64_MAX);
			in_st.st_mode = 0644;
			rc = tree_setattr(&s->t, n, sel >> 1, &in_st, &st, &timeout);
		}
		check_rc(rc);
		break;
	}
	case 14:
		n = pick_node(s, in);
		rc = tree_opendir(&s->t, n, &h);
		check_rc(rc);
		if (rc == 0) {
			struct dir_entry de;
			size_t i = 0;
			while (i < 100000 && tree_readdir(&s->t, h, i, &de) == 0) {
				FZ_CHECK(de.name && de.name[0]);
				i++;
			}
			FZ_CHECK(i >= 2); /* . and .. */
			if (fz_u8(in) & 1)
				add_file(s, h, F_DIR, n);
			else
				tree_releasedir(&s->t, h);
		}
		break;
	case 15: {
		n = pick_node(s, in);
		size_t cap = fz_u8(in) % 128, len = 0;
		char *xb = malloc(cap ? cap : 1);
		if (fz_u8(in) & 1)
			rc = tree_getxattr(&s->t, n, xattrs[fz_u8(in) % 8], xb, cap, &len);
		else
			rc = tree_listxattr(&s->t, n, xb, cap, &len);
		check_rc(rc);
		FZ_CHECK(rc < 0 || cap == 0 || len <= cap);
		free(xb);
		break;
	}
	case 16:
		/* ttl seconds go by for one version, as far as expiry can tell */
		n = pick_node(s, in);
		if (n->type == NODE_VERSION)
			atomic_fetch_sub(&((struct version *)n)->last_active, (int64_t)s->cfg.ttl + 1);
		break;
	case 17:
		stop(s);
		start(s, fz_u8(in) & 1);
		break;
	case 18: {
		struct statvfs sv;
		FZ_CHECK(tree_statfs(&s->t, &sv) == 0);
		FZ_CHECK(sv.f_bfree <= sv.f_blocks);
		break;
	}
	default:
		publish_whole(s, in);
		break;
	}
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	const char *v = getenv("ARTFS_FUZZ_TRACE");
	trace = v && *v == '1';
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct ns s;
	static unsigned run;
	struct fuzz_in in = { data, size };

	memset(&s, 0, sizeof(s));
	snprintf(s.store, sizeof(s.store), "%s/store.%u", fz_scratch(), run++);
	config_init(&s.cfg);
	free(s.cfg.store);
	s.cfg.store = strdup(s.store);
	uint8_t sel = fz_u8(&in);
	s.cfg.capacity = sel & 0x80 ? 8ull << 30 : 512ull * (1 + (sel & 0x3f));
	s.cfg.max_object = sel & 0x40 ? 64ull << 20 : 256 + 64ull * (sel & 0x3f);
	/* At least 2: within a run (milliseconds) nothing becomes idle for ttl
	 * by itself, only through the aging operation. */
	s.cfg.ttl = 2 + fz_u8(&in) % 3;
	if (fz_u8(&in) & 1)
		s.cfg.umask = 0;

	start(&s, true);
	for (unsigned i = 0; i < OPS_MAX && in.n; i++)
		op(&s, &in);
	stop(&s);
	config_free(&s.cfg);
	fz_rmtree(s.store);
	return 0;
}
