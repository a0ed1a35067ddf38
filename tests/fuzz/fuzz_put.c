/* SPDX-License-Identifier: Apache-2.0 */
/* Batch publishing (src/r3/put.c, DESIGN.md §3.7) against a model: each
 * input is a few batches through .keys/.put or v0/.put, of records drawn
 * from six keys with two contents each, some with a damaged payload, the
 * last one maybe cut short, written in pieces of 1 byte to 200 KB (large
 * writes stage their records while the rest is read; a record may go on
 * into the next write). Records are a few hundred bytes to ~40 KB, and
 * now and then over 1 MiB (streamed to its publish, not buffered).
 *
 * The model commits records one at a time, in order, as single publishes
 * would: the first good content of a key commits (0), the same again is 0,
 * another is EEXIST, a damaged one EBADMSG, a cut one EBADMSG. The batch
 * ends with fsync or with a read of its lines; fsync (or the close after
 * such a read) must answer the first failing record's errno, the result lines must be the
 * model's, and after each batch every key reads back through .keys/ as
 * exactly the envelope the model committed (or is absent). */
#include "autoconf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/envelope.h"
#include "format/key.h"
#include "fuzz.h"
#include "lib/sha256.h"
#include "ns/tree.h"
#include "r3/scan.h"
#include "state/base.h"
#include "state/expiry.h"

#define KEYS 6
#define RECORDS_MAX 40
#define BATCHES_MAX 4

struct run {
	struct artfs_config cfg;
	struct tree t;
	char store[320];
	uint8_t hash[KEYS][8];
	char key_hex[KEYS][65];
	uint8_t *env[KEYS][2];      /* the two contents of each key */
	size_t env_len[KEYS][2];
	int committed[KEYS];        /* -1, or which content */
};

static const char WV[] = "v0";

/* Content c of key k: rows of 48 x 8 bytes, a few or many. */
static void make_content(struct run *s, int k, int c, unsigned rows)
{
	struct envelope e;
	uint64_t plen;

	memset(&e, 0, sizeof(e));
	array_dtype_set(&e.array, "|u1");
	e.array.ndim = 3;
	e.array.shape[0] = rows;
	e.array.shape[1] = 48;
	e.array.shape[2] = 8;
	e.kind = ENVELOPE_BLOCK;
	e.source_token_start = 16u * (unsigned)k;
	key_derive(WV, s->hash[k], sizeof(s->hash[k]), e.key);
	FZ_CHECK(array_payload_len(&e.array, &plen) == 0);
	uint8_t *data = malloc((size_t)plen);
	for (uint64_t i = 0; i < plen; i++)
		data[i] = (uint8_t)(i * 31 + (unsigned)k * 7 + (unsigned)c * 101 + rows);
	sha256_once(data, (size_t)plen, e.payload_sha256);
	FZ_CHECK(envelope_encode(&e, data, plen, &s->env[k][c], &s->env_len[k][c]) == 0);
	free(data);
}

static struct node *lookup(struct run *s, struct node *parent, const char *name)
{
	struct tree_entry e;
	int rc = tree_lookup(&s->t, parent, name, &e);

	return rc == 0 ? e.node : NULL;
}

/* The whole file from offset 0 (at most cap bytes) into buf; its length. */
static size_t read_whole(struct run *s, struct handle *h, uint8_t *buf, size_t cap)
{
	size_t len = 0;

	for (;;) {
		const void *data;
		size_t n;
		int rc = tree_read(&s->t, h, len, 65536, &data, &n);
		FZ_CHECK(rc == 0);
		FZ_CHECK(len + n <= cap);
		memcpy(buf + len, data, n);
		tree_read_done(&s->t, h);
		len += n;
		if (n == 0)
			return len;
	}
}

/* After a batch: each key is what the model committed, or absent. */
static void check_store(struct run *s, struct node *keys)
{
	static uint8_t got[3u << 20];

	for (int k = 0; k < KEYS; k++) {
		struct node *n = lookup(s, keys, s->key_hex[k]);
		if (s->committed[k] < 0) {
			FZ_CHECK(n == NULL);
			continue;
		}
		FZ_CHECK(n != NULL);
		struct open_reply r = { 0 };
		struct handle *h;
		FZ_CHECK(tree_open_file(&s->t, n, O_RDONLY, &h, &r) == 0);
		size_t len = read_whole(s, h, got, sizeof(got));
		int c = s->committed[k];
		FZ_CHECK(len == s->env_len[k][c] && memcmp(got, s->env[k][c], len) == 0);
		tree_release(&s->t, h);
		tree_forget(&s->t, n->id, 1);
	}
}

static void batch(struct run *s, struct fuzz_in *in, struct node *keys, struct node *ver)
{
	static uint8_t data[RECORDS_MAX * (1u << 20) / 8 + (4u << 20)];
	/* 0 (also when the input has run out): all that is left */
	static const size_t pieces[] = { SIZE_MAX, 1, 7, 100, 4096, 33000, 70000, 200003 };
	char want[RECORDS_MAX * 96 + 96];
	size_t len = 0, wlen = 0;
	int first = 0;
	bool by_path = ver && (fz_u8(in) & 1);
	unsigned n = 1 + fz_u8(in) % RECORDS_MAX;

	for (unsigned i = 0; i < n; i++) {
		uint8_t sel = fz_u8(in);
		int k = sel % KEYS, c = (sel >> 3) & 1;
		bool damaged = (sel & 0xf0) == 0xf0;
		size_t elen = s->env_len[k][c];
		if (len + elen + 32 > sizeof(data))
			break;
		if (by_path) {
			char hex[17];
			key_hex(s->hash[k], sizeof(s->hash[k]), hex);
			len += (size_t)sprintf((char *)data + len, "%s\n", hex);
		}
		memcpy(data + len, s->env[k][c], elen);
		if (damaged)
			data[len + elen - 1] ^= 0x5a;
		len += elen;
		int rc = 0;
		if (damaged)
			rc = -EBADMSG;
		else if (s->committed[k] < 0)
			s->committed[k] = c;
		else if (s->committed[k] != c)
			rc = -EEXIST;
		if (rc && !first)
			first = rc;
		wlen += (size_t)snprintf(want + wlen, sizeof(want) - wlen, "%s %s\n", s->key_hex[k],
					 errno_name(-rc));
	}
	size_t cut = 0;
	int cut_key = 0;
	if (fz_u8(in) % 8 == 0) { /* a last record cut short */
		int k = cut_key = fz_u8(in) % KEYS;
		cut = 1 + fz_u32(in) % (s->env_len[k][0] - 1);
		if (len + 32 + cut > sizeof(data))
			cut = 0; /* no room: no cut record */
	}
	if (cut) {
		int k = cut_key;
		if (by_path) {
			char hex[17];
			key_hex(s->hash[k], sizeof(s->hash[k]), hex);
			len += (size_t)sprintf((char *)data + len, "%s\n", hex);
		}
		memcpy(data + len, s->env[k][0], cut);
		len += cut;
		if (!first)
			first = -EBADMSG;
		wlen += (size_t)snprintf(want + wlen, sizeof(want) - wlen, "? EBADMSG\n");
	}

	struct node *n_put = lookup(s, by_path ? ver : keys, ARTFS_PUT_NAME);
	FZ_CHECK(n_put != NULL);
	struct open_reply r = { 0 };
	struct handle *h;
	FZ_CHECK(tree_open_file(&s->t, n_put, O_RDWR, &h, &r) == 0);
	for (size_t off = 0; off < len;) {
		size_t piece = pieces[fz_u8(in) % 8];
		size_t m = len - off < piece ? len - off : piece;
		FZ_CHECK(tree_write(&s->t, h, off, data + off, m, 7) == (int)m);
		off += m;
	}
	/* The batch ends with fsync, or with the read of its lines (then the
	 * writer's close says what fsync would have). */
	bool by_read = fz_u8(in) & 1;
	if (!by_read)
		FZ_CHECK(tree_fsync(&s->t, h) == first);
	static char got[sizeof(want)];
	size_t glen = read_whole(s, h, (uint8_t *)got, sizeof(got) - 1);
	if (by_read)
		FZ_CHECK(tree_flush(&s->t, h, 7) == first);
	got[glen] = '\0';
	want[wlen] = '\0';
	/* A cut record's key is in its line once its header was in; "?"
	 * stands for either. */
	char *q = strstr(want, "? EBADMSG\n");
	if (q) {
		size_t head = (size_t)(q - want);
		FZ_CHECK(glen >= head && memcmp(got, want, head) == 0);
		FZ_CHECK(strcmp(got + glen - 8, "EBADMSG\n") == 0);
	} else {
		if (glen != wlen || memcmp(got, want, wlen) != 0)
			fprintf(stderr, "want:\n%s\ngot:\n%s\n", want, got);
		FZ_CHECK(glen == wlen && memcmp(got, want, wlen) == 0);
	}
	tree_release(&s->t, h);
	tree_forget(&s->t, n_put->id, 1);
	check_store(s, keys);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct run s;
	static unsigned run;
	struct fuzz_in in = { data, size };
	char err[256];

	memset(&s, 0, sizeof(s));
	snprintf(s.store, sizeof(s.store), "%s/store.%u", fz_scratch(), run++);
	config_init(&s.cfg);
	free(s.cfg.store);
	s.cfg.store = strdup(s.store);
	s.cfg.capacity = 1ull << 30;
	for (int k = 0; k < KEYS; k++) {
		memset(s.hash[k], 0, sizeof(s.hash[k]));
		s.hash[k][0] = (uint8_t)(0x10 + k);
		char key[ARTFS_KEY_LEN + 1];
		key_derive(WV, s.hash[k], sizeof(s.hash[k]), key);
		memcpy(s.key_hex[k], key + sizeof(ARTFS_KEY_PREFIX) - 1, 65);
		uint8_t sel = fz_u8(&in);
		unsigned rows = sel < 0xf8 ? 1 + sel % 100 : 2800 + sel % 8; /* ~0.4-38 KB, or > 1 MiB */
		make_content(&s, k, 0, rows);
		make_content(&s, k, 1, rows + 1 + (fz_u8(&in) & 1));
		s.committed[k] = -1;
	}
	FZ_CHECK(tree_open(&s.t, &s.cfg, err, sizeof(err)) == 0);
	FZ_CHECK(scan_size_start(&s.t) == 0);
	sizing_wait(&s.t);
	FZ_CHECK(expiry_start(&s.t) == 0);
	struct tree_entry e;
	FZ_CHECK(tree_mkdir(&s.t, &s.t.root, WV, &e) == 0);
	struct node *ver = e.node;
	struct node *keys = lookup(&s, &s.t.root, ARTFS_KEYS_DIR);
	FZ_CHECK(keys != NULL);
	for (unsigned b = 0; b < BATCHES_MAX && in.n; b++)
		batch(&s, &in, keys, ver);
	tree_forget(&s.t, keys->id, 1);
	tree_forget(&s.t, ver->id, 1);
	expiry_stop(&s.t, -1);
	tree_close(&s.t);
	for (int k = 0; k < KEYS; k++)
		for (int c = 0; c < 2; c++)
			free(s.env[k][c]);
	config_free(&s.cfg);
	fz_rmtree(s.store);
	return 0;
}
