/* SPDX-License-Identifier: Apache-2.0 */
/* The namespace core driven directly, without FUSE: what the mount tests
 * check through the kernel, checked here at the API the daemon uses. */
#include "autoconf.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "format/envelope.h"
#include "format/key.h"
#include "lib/sha256.h"
#include "ns/tree.h"
#include "r3/scan.h"
#include "restart/held.h"
#include "state/ids.h"
#include "state/transaction.h"
#include "suites.h"

static char base[64];
static char store[128];
static struct artfs_config cfg;
static struct tree t;

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st; (void)flag; (void)ftw;
	return remove(path);
}

static void start(uint64_t capacity)
{
	char err[256];
	strcpy(base, "/tmp/artfs-unit-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(base));
	snprintf(store, sizeof(store), "%s/store", base);
	config_init(&cfg);
	free(cfg.store);
	cfg.store = strdup(store);
	cfg.capacity = capacity;
	ck_assert_msg(tree_open(&t, &cfg, err, sizeof(err)) == 0, "%s", err);
}

static void reopen(void)
{
	char err[256];
	tree_close(&t);
	ck_assert_msg(tree_open(&t, &cfg, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(scan_size_start(&t), 0); /* as the daemon does once mounted */
	sizing_wait(&t);
}

static void stop(void)
{
	tree_close(&t);
	config_free(&cfg);
	nftw(base, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static struct node *version(const char *name)
{
	struct tree_entry e;
	int rc = tree_lookup(&t, &t.root, name, &e);
	if (rc == -ENOENT)
		rc = tree_mkdir(&t, &t.root, name, &e);
	ck_assert_int_eq(rc, 0);
	return e.node; /* one lookup reference, dropped by the caller's forget */
}

static int publish_as(struct node *ver, const char *name, const uint8_t *data, size_t len,
		      uint64_t owner, uint64_t closer)
{
	struct tree_entry e;
	struct open_reply r = { 0 };
	struct handle *h;
	int rc = tree_create(&t, ver, name, O_CREAT | O_WRONLY, &e, &h, &r);
	if (rc < 0)
		return rc;
	ck_assert(r.direct_io);
	for (size_t off = 0; off < len;) {
		size_t n = len - off < 1000 ? len - off : 1000;
		int w = tree_write(&t, h, off, data + off, n, owner);
		if (w < 0)
			break;
		off += n;
	}
	rc = tree_flush(&t, h, closer);
	if (closer != owner)
		rc = tree_flush(&t, h, owner) * 1000 + rc; /* encodes both results */
	tree_release(&t, h);
	tree_forget(&t, e.id, 1);
	return rc;
}

static int publish(struct node *ver, const char *name, const uint8_t *data, size_t len)
{
	return publish_as(ver, name, data, len, 7, 7);
}

static int read_all(struct node *ver, const char *name, uint8_t **out, size_t *out_len)
{
	struct tree_entry e;
	struct open_reply r = { 0 };
	struct handle *h;
	int rc = tree_lookup(&t, ver, name, &e);
	if (rc < 0)
		return rc;
	rc = tree_open_file(&t, e.node, O_RDONLY, &h, &r);
	if (rc < 0) {
		tree_forget(&t, e.id, 1);
		return rc;
	}
	size_t cap = (size_t)e.st.st_size + 1, len = 0;
	uint8_t *buf = malloc(cap);
	for (;;) {
		const void *data;
		size_t n;
		rc = tree_read(&t, h, len, 4096, &data, &n);
		if (rc < 0)
			break;
		ck_assert_uint_le(len + n, cap);
		memcpy(buf + len, data, n);
		len += n;
		tree_read_done(&t, h);
		if (n == 0)
			break;
	}
	tree_release(&t, h);
	tree_forget(&t, e.id, 1);
	if (rc < 0) {
		free(buf);
		return rc;
	}
	ck_assert_uint_eq(len, (size_t)e.st.st_size);
	*out = buf;
	*out_len = len;
	return 0;
}

/* An envelope for <wv>/<name> of rows x 4 x 2 u8 filled with fill. */
static uint8_t *make_envelope(const char *wv, const char *name, uint64_t rows, uint8_t fill,
			      size_t *len)
{
	struct envelope env = { .kind = ENVELOPE_BLOCK };
	uint8_t hash[ARTFS_HASH_BYTES_MAX], *payload, *out;
	size_t hlen;
	array_dtype_set(&env.array, "|u1");
	env.array.ndim = 3;
	env.array.shape[0] = rows;
	env.array.shape[1] = 4;
	env.array.shape[2] = 2;
	ck_assert_int_eq(key_hash_decode(name, hash, &hlen), 0);
	key_derive(wv, hash, hlen, env.key);
	payload = malloc(rows * 8);
	memset(payload, fill, rows * 8);
	sha256_once(payload, rows * 8, env.payload_sha256);
	ck_assert_int_eq(envelope_encode(&env, payload, rows * 8, &out, len), 0);
	free(payload);
	return out;
}

START_TEST(publish_and_read_vectors)
{
	static const struct { const char *wv, *hash, *name; } v[] = {
		{ "default", "3da2892d37823d9298e1d5011d7dcfaaf2d9d9a6d465e99be33af5be1d87c12b", "req-block0" },
		{ "default", "6d0b07ee773591f2a1b492d3ca65afdefc90e1cadfcc542a74048bb0ae7daa27", "req-tail" },
		{ "rl-step-0042", "0123456789abcdef", "u16-block" },
	};
	start(1 << 30);
	for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
		char file[64];
		size_t elen, nlen, got_len;
		uint8_t *got;
		snprintf(file, sizeof(file), "%s.envelope", v[i].name);
		uint8_t *env = read_vector(file, &elen);
		snprintf(file, sizeof(file), "%s.npy", v[i].name);
		uint8_t *npy = read_vector(file, &nlen);
		struct node *ver = version(v[i].wv);
		ck_assert_int_eq(publish(ver, v[i].hash, env, elen), 0);
		ck_assert_int_eq(read_all(ver, v[i].hash, &got, &got_len), 0);
		ck_assert_uint_eq(got_len, nlen);
		ck_assert_int_eq(memcmp(got, npy, nlen), 0);
		/* The same bytes again: idempotent. */
		ck_assert_int_eq(publish(ver, v[i].hash, env, elen), 0);
		tree_forget(&t, ver->id, 1);
		free(got);
		free(env);
		free(npy);
	}
	ck_assert_uint_eq(t.objects, 3);
	ck_assert_uint_eq(t.metrics.republish_identical, 3);
	stop();
}
END_TEST

START_TEST(collision_capacity_and_accounting)
{
	size_t len;
	start(600);
	struct node *ver = version("v");
	uint8_t *a = make_envelope("v", "aa", 16, 1, &len);
	uint8_t *b = make_envelope("v", "aa", 16, 2, &len);
	ck_assert_uint_lt(len, 600);
	ck_assert_uint_gt(2 * len, 600);
	ck_assert_int_eq(publish(ver, "aa", a, len), 0);
	ck_assert_int_eq(publish(ver, "aa", b, len), -EEXIST);
	uint8_t *c = make_envelope("v", "bb", 16, 3, &len);
	ck_assert_int_eq(publish(ver, "bb", c, len), -ENOSPC);
	ck_assert_uint_eq(t.bytes_used, len);
	ck_assert_uint_eq(t.bytes_reserved, 0);
	ck_assert_int_eq(tree_unlink(&t, ver, "aa", false), 0);
	ck_assert_uint_eq(t.bytes_used, 0);
	ck_assert_int_eq(publish(ver, "bb", c, len), 0);
	ck_assert_int_eq(tree_rmdir(&t, &t.root, "v"), -ENOTEMPTY);
	ck_assert_int_eq(tree_unlink(&t, ver, "bb", false), 0);
	ck_assert_int_eq(tree_unlink(&t, ver, "bb", false), -ENOENT);
	tree_forget(&t, ver->id, 1);
	ck_assert_int_eq(tree_rmdir(&t, &t.root, "v"), 0);
	ck_assert_uint_eq(t.objects, 0);
	free(a);
	free(b);
	free(c);
	stop();
}
END_TEST

START_TEST(a_forked_child_closing_does_not_commit)
{
	size_t len;
	start(1 << 20);
	struct node *ver = version("v");
	uint8_t *a = make_envelope("v", "aa", 4, 1, &len);
	/* The other file table's close says 0 and commits nothing; the
	 * writer's own close then commits. */
	ck_assert_int_eq(publish_as(ver, "aa", a, len, 7, 8), 0);
	ck_assert_uint_eq(t.metrics.publishes, 1);
	/* A truncated object: the writer's close says EBADMSG. */
	ck_assert_int_eq(publish_as(ver, "bb", a, len / 2, 7, 7), -EBADMSG);
	tree_forget(&t, ver->id, 1);
	free(a);
	stop();
}
END_TEST

START_TEST(restart_reindexes_and_refuses_a_second_daemon)
{
	size_t len, got_len;
	uint8_t *got;
	char err[256];
	start(1 << 20);
	struct node *ver = version("v");
	uint8_t *a = make_envelope("v", "aa", 4, 1, &len);
	ck_assert_int_eq(publish(ver, "aa", a, len), 0);
	tree_forget(&t, ver->id, 1);

	struct tree other;
	ck_assert_int_eq(tree_open(&other, &cfg, err, sizeof(err)), -EBUSY);
	ck_assert_ptr_nonnull(strstr(err, "in use by another artfs daemon"));

	/* A leftover named temporary file is dropped at start. */
	char tmp[256];
	snprintf(tmp, sizeof(tmp), "%s/v/v/.tmp.1.2", store);
	close(open(tmp, O_CREAT | O_WRONLY, 0600));
	reopen();
	ck_assert_int_eq(access(tmp, F_OK), -1);
	ck_assert_uint_eq(t.objects, 1);
	ck_assert_uint_eq(t.bytes_used, len);
	ver = version("v");
	ck_assert_int_eq(read_all(ver, "aa", &got, &got_len), 0);
	free(got);

	/* A byte flipped in the store: EIO, and counted. */
	char obj[256];
	snprintf(obj, sizeof(obj), "%s/v/v/aa", store);
	int fd = open(obj, O_RDWR);
	uint8_t byte;
	pread(fd, &byte, 1, (off_t)len - 1);
	byte ^= 1;
	pwrite(fd, &byte, 1, (off_t)len - 1);
	close(fd);
	ck_assert_int_eq(read_all(ver, "aa", &got, &got_len), -EIO);
	ck_assert_uint_eq(t.metrics.checksum_failures, 1);
	tree_forget(&t, ver->id, 1);
	free(a);
	stop();
}
END_TEST

START_TEST(names_and_listing)
{
	size_t len;
	struct tree_entry e;
	struct handle *h;
	struct open_reply r = { 0 };
	start(1 << 20);
	ck_assert_int_eq(tree_mkdir(&t, &t.root, ".bad", &e), -EINVAL);
	ck_assert_int_eq(tree_lookup(&t, &t.root, ".bad", &e), -ENOENT);
	ck_assert(e.entry_timeout > 0); /* an impossible name: cached absence */
	ck_assert_int_eq(tree_lookup(&t, &t.root, "absent", &e), -ENOENT);
	ck_assert(e.entry_timeout == 0); /* a version mkdir'd later must show */
	struct node *ver = version("v");
	/* The absence of a valid object name is never cached: a batch may
	 * name it behind the kernel's back. Not before, during or after a
	 * publish of it. */
	ck_assert_int_eq(tree_lookup(&t, ver, "00aa", &e), -ENOENT);
	ck_assert(e.entry_timeout == 0);
	struct tree_entry ce;
	ck_assert_int_eq(tree_create(&t, ver, "00aa", O_CREAT | O_WRONLY, &ce, &h, &r), 0);
	ck_assert_int_eq(tree_lookup(&t, ver, "00aa", &e), -ENOENT);
	ck_assert(e.entry_timeout == 0);
	tree_release(&t, h);
	tree_forget(&t, ce.id, 1);
	ck_assert_int_eq(tree_lookup(&t, ver, "00aa", &e), -ENOENT);
	ck_assert(e.entry_timeout == 0);
	ck_assert_int_eq(tree_create(&t, ver, "xyz", O_CREAT | O_WRONLY, &e, &h, &r), -EINVAL);
	for (int i = 0; i < 100; i++) {
		char name[8];
		snprintf(name, sizeof(name), "%04x", i);
		uint8_t *a = make_envelope("v", name, 1, (uint8_t)i, &len);
		ck_assert_int_eq(publish(ver, name, a, len), 0);
		free(a);
	}
	ck_assert_int_eq(tree_opendir(&t, ver, &h), 0);
	struct dir_entry de;
	size_t n = 0;
	for (size_t i = 0; tree_readdir(&t, h, i, &de) == 0; i++)
		n++;
	ck_assert_uint_eq(n, 102); /* . and .. */
	tree_releasedir(&t, h);
	tree_forget(&t, ver->id, 1);
	stop();
}
END_TEST

START_TEST(create_in_a_removed_version_registers_nothing)
{
	/* A version removed while the kernel still holds it (rmdir, or ttl=
	 * collection): a create there is ENOENT, and no half-made handle may
	 * stay in the list of open handles (it did: the next open wrote
	 * through a freed pointer). */
	struct tree_entry e;
	struct handle *h = NULL;
	struct open_reply r = { 0 };
	size_t len;
	start(1 << 20);
	struct node *gone = version("gone");
	ck_assert_int_eq(tree_rmdir(&t, &t.root, "gone"), 0);
	for (int i = 0; i < 3; i++)
		ck_assert_int_eq(tree_create(&t, gone, "00aa", O_CREAT | O_WRONLY, &e, &h, &r),
				 -ENOENT);
	/* Opens and releases after it walk the list of open handles. */
	struct node *ver = version("v");
	uint8_t *a = make_envelope("v", "00bb", 1, 3, &len);
	for (int i = 0; i < 3; i++)
		ck_assert_int_eq(publish(ver, "00bb", a, len), 0);
	free(a);
	tree_forget(&t, ver->id, 1);
	tree_forget(&t, gone->id, 1);
	stop();
}
END_TEST

START_TEST(a_committed_object_is_never_opened_for_writing)
{
	/* Writes through the readers' inode would change the size the kernel
	 * serves them: a committed object is read-only for every user, and a
	 * create that meets a committed key writes to a node of its own. */
	struct tree_entry e, ce;
	struct handle *h;
	struct open_reply r = { 0 };
	size_t len;
	start(1 << 20);
	struct node *ver = version("v");
	uint8_t *a = make_envelope("v", "00aa", 1, 3, &len);
	ck_assert_int_eq(publish(ver, "00aa", a, len), 0);
	ck_assert_int_eq(tree_lookup(&t, ver, "00aa", &e), 0);
	ck_assert_int_eq(tree_open_file(&t, e.node, O_WRONLY, &h, &r), -EACCES);
	ck_assert_int_eq(tree_open_file(&t, e.node, O_RDWR, &h, &r), -EACCES);
	ck_assert_int_eq(tree_create(&t, ver, "00aa", O_CREAT | O_WRONLY, &ce, &h, &r), 0);
	ck_assert_ptr_ne(ce.node, e.node);
	for (size_t off = 0; off < len; off += 100)
		ck_assert_int_ge(tree_write(&t, h, off, a + off, len - off < 100 ? len - off : 100, 7), 0);
	ck_assert_int_eq(tree_flush(&t, h, 7), 0); /* identical */
	tree_release(&t, h);
	tree_forget(&t, ce.id, 1);
	ck_assert_uint_eq(t.metrics.republish_identical, 1);
	ck_assert_uint_eq(t.objects, 1);
	/* Unlinked while held: the kernel is told to look the name up again. */
	ck_assert_int_eq(tree_unlink(&t, ver, "00aa", false), 0);
	ck_assert_int_eq(tree_open_file(&t, e.node, O_RDONLY, &h, &r), -ESTALE);
	tree_forget(&t, e.id, 1);
	tree_forget(&t, ver->id, 1);
	free(a);
	stop();
}
END_TEST

START_TEST(a_stalled_writer_holds_only_what_it_sent)
{
	/* Capacity is reserved as bytes arrive: a writer that sent a header
	 * declaring a large payload and then nothing holds only its header. */
	struct tree_entry e;
	struct handle *h;
	struct open_reply r = { 0 };
	size_t len;
	start(1 << 20);
	struct node *ver = version("v");
	uint8_t *big = make_envelope("v", "00aa", 2000, 1, &len); /* 2000 rows of 48x8 */
	ck_assert_int_eq(tree_create(&t, ver, "00aa", O_CREAT | O_WRONLY, &e, &h, &r), 0);
	uint32_t hl;
	memcpy(&hl, big, 4);
	size_t head = 4 + hl;
	ck_assert_int_eq(tree_write(&t, h, 0, big, head, 7), (int)head);
	ck_assert_uint_le(t.bytes_reserved, head);
	ck_assert_int_eq(tree_write(&t, h, head, big + head, 1000, 7), 1000);
	ck_assert_uint_eq(t.bytes_reserved, head + 1000);
	tree_release(&t, h); /* closed early: nothing committed, nothing held */
	tree_forget(&t, e.id, 1);
	ck_assert_uint_eq(t.bytes_reserved, 0);
	ck_assert_uint_eq(t.objects, 0);
	free(big);
	tree_forget(&t, ver->id, 1);
	stop();
}
END_TEST

/* A result buffer is kept for the next transaction (a .get batch faulted
 * in ~100 fresh pages each time): the next result of any size that fits
 * it starts zeroed, as a fresh mapping does, and what the open ones hold
 * is counted as before (materialize_max). */
static int tmp_files(void)
{
	char path[256];
	int n = 0;
	snprintf(path, sizeof(path), "%s/cache-tmp", store);
	DIR *d = opendir(path);
	ck_assert_ptr_nonnull(d);
	for (struct dirent *e; (e = readdir(d));)
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

START_TEST(a_create_sent_again_drops_what_its_first_answer_left)
{
	/* A daemon made a .cache/ file and recorded its handle, then died
	 * before its answer reached the kernel, which sends the create again
	 * (same unique, bit 63 set): the first file and its record go. */
	struct tree_entry root, e1, e2;
	struct open_reply r = { 0 };
	struct handle *h1, *h2;
	const uint64_t unique = 4242;
	start(1 << 20);
	ck_assert_int_eq(tree_lookup(&t, &t.root, ".cache", &root), 0);
	ids_request_note(unique, false);
	ck_assert_int_eq(tree_create(&t, root.node, "f", O_CREAT | O_WRONLY, &e1, &h1, &r), 0);
	uint64_t fh1 = h1->fh;
	ck_assert_ptr_nonnull(held_handle_get(&t.held, fh1));
	ck_assert_int_eq(tmp_files(), 1);
	/* Another create (another unique) is not touched by it. */
	ids_request_note(unique + 1, true);
	ck_assert_int_eq(tree_create(&t, root.node, "g", O_CREAT | O_WRONLY, &e2, &h2, &r), 0);
	ck_assert_ptr_nonnull(held_handle_get(&t.held, fh1));
	ck_assert_int_eq(tmp_files(), 2);
	tree_release(&t, h2);
	tree_forget(&t, e2.id, 1);
	/* The create sent again. */
	ids_request_note(unique | 1ull << 63, true);
	ck_assert_int_eq(tree_create(&t, root.node, "f", O_CREAT | O_WRONLY, &e2, &h2, &r), 0);
	ids_request_note(0, false);
	ck_assert_ptr_null(held_handle_get(&t.held, fh1));
	ck_assert_ptr_nonnull(held_handle_get(&t.held, h2->fh));
	ck_assert_int_eq(tmp_files(), 1);
	ck_assert_int_eq(tree_write(&t, h2, 0, "abc", 3, 7), 3);
	ck_assert_int_eq(tree_flush(&t, h2, 7), 0);
	tree_release(&t, h2);
	tree_release(&t, h1); /* as the kernel never would: it never had it */
	tree_forget(&t, e1.id, 1);
	tree_forget(&t, e2.id, 1);
	tree_forget(&t, root.id, 1);
	ck_assert_int_eq(tmp_files(), 0);
	stop();
}
END_TEST

/* A result buffer is kept for the next (not mapped again, not cleared:
 * its callers write every byte) and counted while it is held. */
START_TEST(a_kept_result_buffer_is_reused_and_counted)
{
	struct transaction a, b;

	start(1 << 20);
	memset(&a, 0, sizeof(a));
	memset(&b, 0, sizeof(b));
	ck_assert_int_eq(transaction_result_make(&t, &a, 100000), 0);
	void *first = a.out.bytes;
	memset(a.out.bytes, 0xab, 100000);
	ck_assert_uint_ge(atomic_load(&t.materialize_held), 100000);
	transaction_result_free(&t, &a.out);
	ck_assert_uint_eq(atomic_load(&t.materialize_held), 0);
	ck_assert_int_eq(transaction_result_make(&t, &b, 60000), 0);
	ck_assert_ptr_eq(b.out.bytes, first); /* kept, not mapped again */
	ck_assert_uint_eq(atomic_load(&t.materialize_held), b.out.map);
	transaction_result_free(&t, &b.out);
	ck_assert_uint_eq(atomic_load(&t.materialize_held), 0);
	stop();
}
END_TEST

Suite *tree_suite(void)
{
	Suite *s = suite_create("tree");
	TCase *tc = tcase_create("tree");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, publish_and_read_vectors);
	tcase_add_test(tc, collision_capacity_and_accounting);
	tcase_add_test(tc, a_forked_child_closing_does_not_commit);
	tcase_add_test(tc, restart_reindexes_and_refuses_a_second_daemon);
	tcase_add_test(tc, names_and_listing);
	tcase_add_test(tc, create_in_a_removed_version_registers_nothing);
	tcase_add_test(tc, a_committed_object_is_never_opened_for_writing);
	tcase_add_test(tc, a_stalled_writer_holds_only_what_it_sent);
	tcase_add_test(tc, a_kept_result_buffer_is_reused_and_counted);
	tcase_add_test(tc, a_create_sent_again_drops_what_its_first_answer_left);
	suite_add_tcase(s, tc);
	return s;
}
