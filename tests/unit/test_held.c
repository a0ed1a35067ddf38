/* SPDX-License-Identifier: Apache-2.0 */
/* What the holder keeps for the daemons (src/restart/held.c) and the descriptors
 * it keeps for them (src/restart/keeper.c): tables that a second mapping (the next
 * daemon) finds as the first left them, free slots learnt again, texts
 * kept whole, descriptors that outlive the process that gave them. */
#include "autoconf.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "restart/held.h"
#include "restart/keeper.h"
#include "suites.h"

static const uint8_t init_bytes[] = "an INIT request, as the holder read it";

static struct held_node object_desc(const char *version, uint8_t first, uint64_t nlookup)
{
	struct held_node d;

	memset(&d, 0, sizeof(d));
	atomic_store(&d.type, 5);
	atomic_store(&d.nlookup, nlookup);
	d.name_len = (uint8_t)strlen(version);
	memcpy(d.name, version, d.name_len);
	d.hash_len = 32;
	memset(d.hash, first, 32);
	return d;
}

/* A second mapping of the holder's memfd: what the next daemon sees. */
static void remap(int *fd, struct held *h)
{
	int again = dup(*fd);

	ck_assert_int_ge(again, 0);
	held_unmap(h);
	ck_assert_int_eq(held_map(again, h), 0);
	held_take_over(h);
	*fd = again;
}

START_TEST(test_create_records_init_and_layout)
{
	int fd = held_create(init_bytes, sizeof(init_bytes), HELD_KERNEL_RESEND);
	struct held h;

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(fcntl(fd, F_GETFD) & FD_CLOEXEC, 0); /* for the daemons */
	ck_assert_int_eq(held_map(dup(fd), &h), 0);
	ck_assert_uint_eq(h.hdr->init_len, sizeof(init_bytes));
	ck_assert_mem_eq(h.hdr->init, init_bytes, sizeof(init_bytes));
	ck_assert_uint_eq(h.hdr->flags, HELD_KERNEL_RESEND);
	held_unmap(&h);
	/* Not this layout: refused. */
	uint32_t bad = HELD_LAYOUT + 1;
	ck_assert_int_eq(pwrite(fd, &bad, 4, offsetof(struct held_header, layout)), 4);
	ck_assert_int_eq(held_map(dup(fd), &h), -EINVAL);
	ck_assert_int_eq(held_create(init_bytes, HELD_INIT_MAX + 1, 0), -EINVAL);
	close(fd);
}
END_TEST

START_TEST(test_nodes_outlive_a_mapping)
{
	int fd = held_create(init_bytes, sizeof(init_bytes), 0);
	struct held h;
	uint64_t ids[100];

	ck_assert_int_eq(held_map(dup(fd), &h), 0);
	held_take_over(&h);
	for (int i = 0; i < 100; i++) {
		struct held_node d = object_desc("v1", (uint8_t)i, 2);
		ids[i] = held_node_alloc(&h, &d);
		ck_assert_uint_ge(ids[i], HELD_NODE_BASE);
		for (int j = 0; j < i; j++)
			ck_assert_uint_ne(ids[i], ids[j]);
	}
	ck_assert_ptr_null(held_node_get(&h, 1));
	ck_assert_ptr_null(held_node_get(&h, HELD_NODE_BASE + 100));
	/* Forgetting every second node (two lookups each: one, then the other). */
	for (int i = 0; i < 100; i += 2) {
		ck_assert(!held_node_forget(&h, ids[i], 1));
		ck_assert(held_node_forget(&h, ids[i], 1));
		ck_assert(!held_node_forget(&h, ids[i], 1)); /* freed: nothing to forget */
	}
	remap(&fd, &h);
	for (int i = 0; i < 100; i++) {
		struct held_node *r = held_node_get(&h, ids[i]);
		if (i % 2 == 0) {
			ck_assert_ptr_null(r);
			continue;
		}
		ck_assert_ptr_nonnull(r);
		ck_assert_uint_eq(atomic_load(&r->nlookup), 2);
		ck_assert_str_eq(r->name, "v1");
		ck_assert_uint_eq(r->hash[0], (uint8_t)i);
	}
	/* New slots come from above the mark until the scan lists the free ones. */
	struct held_node d = object_desc("v2", 0xee, 1);
	uint64_t above = held_node_alloc(&h, &d);
	ck_assert_uint_eq(above, HELD_NODE_BASE + 100);
	held_scan_nodes(&h);
	for (int i = 0; i < 50; i++) {
		uint64_t id = held_node_alloc(&h, &d);
		ck_assert_uint_lt(id, HELD_NODE_BASE + 100);
		ck_assert_uint_eq((id - HELD_NODE_BASE) % 2, 0); /* a slot forgotten before */
		ck_assert_uint_eq(held_node_get(&h, id)->gen, 2);  /* reused: a new generation */
	}
	ck_assert_uint_eq(held_node_alloc(&h, &d), HELD_NODE_BASE + 101);
	held_unmap(&h);
	close(fd);
}
END_TEST

/* A slot forgotten while the takeover's scan runs is listed once: two
 * allocations never share a slot. */
struct scan_race {
	struct held *h;
	uint64_t *ids;
	int n;
};

static void *forget_all(void *arg)
{
	struct scan_race *r = arg;

	for (int i = 0; i < r->n; i++)
		held_node_forget(r->h, r->ids[i], 1);
	return NULL;
}

START_TEST(test_forgets_during_the_scan_list_each_slot_once)
{
	const int n = 20000;
	int fd = held_create(init_bytes, sizeof(init_bytes), 0);
	struct held h;
	uint64_t *ids = malloc(sizeof(*ids) * n);

	ck_assert_int_eq(held_map(dup(fd), &h), 0);
	held_take_over(&h);
	for (int i = 0; i < n; i++) {
		struct held_node d = object_desc("v", (uint8_t)i, 1);
		ids[i] = held_node_alloc(&h, &d);
	}
	remap(&fd, &h);
	struct scan_race r = { &h, ids, n };
	pthread_t t;
	pthread_create(&t, NULL, forget_all, &r);
	held_scan_nodes(&h);
	pthread_join(t, NULL);
	uint8_t *seen = calloc((size_t)n + 2, 1);
	for (int i = 0; i < n; i++) {
		struct held_node d = object_desc("w", 1, 1);
		uint64_t id = held_node_alloc(&h, &d);
		ck_assert_uint_lt(id - HELD_NODE_BASE, (uint64_t)n);
		ck_assert_msg(!seen[id - HELD_NODE_BASE], "slot %llu handed out twice",
			      (unsigned long long)id);
		seen[id - HELD_NODE_BASE] = 1;
	}
	ck_assert_uint_eq(held_node_alloc(&h, &(struct held_node){ .type = 5 }),
			  HELD_NODE_BASE + (uint64_t)n);
	free(seen);
	free(ids);
	held_unmap(&h);
	close(fd);
}
END_TEST

START_TEST(test_handles_and_texts_outlive_a_mapping)
{
	int fd = held_create(init_bytes, sizeof(init_bytes), 0);
	struct held h;
	uint64_t fh[8];
	char line[80];

	ck_assert_int_eq(held_map(dup(fd), &h), 0);
	held_take_over(&h);
	for (int i = 0; i < 8; i++) {
		fh[i] = held_handle_alloc(&h, (uint8_t)(i + 1), 1000 + (uint64_t)i, 2);
		ck_assert_uint_ge(fh[i], 1);
		struct held_handle *r = held_handle_get(&h, fh[i]);
		/* Texts grow by pieces, moving when they outgrow their room. */
		for (int k = 0; k < 200 * (i + 1); k++) {
			int len = snprintf(line, sizeof(line), "%d:%064d\n", i, k);
			ck_assert_int_eq(held_text_reserve(&h, r, r->text_len + (size_t)len), 0);
			memcpy(held_text(&h, r) + r->text_len, line, (size_t)len);
			r->text_len += (size_t)len;
		}
	}
	held_handle_free(&h, fh[3]);
	remap(&fd, &h);
	ck_assert_ptr_null(held_handle_get(&h, fh[3]));
	for (int i = 0; i < 8; i++) {
		if (i == 3)
			continue;
		struct held_handle *r = held_handle_get(&h, fh[i]);
		ck_assert_ptr_nonnull(r);
		ck_assert_uint_eq(atomic_load(&r->kind), (uint8_t)(i + 1));
		ck_assert_uint_eq(r->node, 1000 + (uint64_t)i);
		const uint8_t *text = held_text(&h, r);
		size_t at = 0;
		for (int k = 0; k < 200 * (i + 1); k++) {
			int len = snprintf(line, sizeof(line), "%d:%064d\n", i, k);
			ck_assert_mem_eq(text + at, line, (size_t)len);
			at += (size_t)len;
		}
		ck_assert_uint_eq(r->text_len, at);
	}
	/* The next daemon's texts never land on a live one's pages. */
	uint64_t more = held_handle_alloc(&h, 9, 1, 0);
	/* The freed slot, learnt at the mapping, under another number: the
	 * closed file's number (a RELEASE the kernel sends again) names
	 * nothing. */
	ck_assert_uint_eq(held_handle_slot(more), held_handle_slot(fh[3]));
	ck_assert_uint_ne(more, fh[3]);
	ck_assert_ptr_null(held_handle_get(&h, fh[3]));
	held_handle_free(&h, fh[3]);
	struct held_handle *m = held_handle_get(&h, more);
	ck_assert_ptr_nonnull(m);
	ck_assert_uint_eq(atomic_load(&m->kind), 9);
	ck_assert_int_eq(held_text_reserve(&h, m, 1 << 20), 0);
	memset(held_text(&h, m), 'x', 1 << 20);
	struct held_handle *r7 = held_handle_get(&h, fh[7]);
	int len = snprintf(line, sizeof(line), "%d:%064d\n", 7, 0);
	ck_assert_mem_eq(held_text(&h, r7), line, (size_t)len);
	/* A text larger than the region: no room. */
	ck_assert_int_eq(held_text_reserve(&h, m, HELD_TEXT_BYTES + 1), -ENOMEM);
	held_unmap(&h);
	close(fd);
}
END_TEST

/* The key filter: a key added is held for ever (across mappings, as a
 * daemon that takes over maps it), and few keys never added read as held
 * (SHA-256 keys: the filter's bits are slices of them). */
START_TEST(test_the_key_filter_forgets_no_key_and_holds_few_others)
{
	int fd = held_create(init_bytes, sizeof(init_bytes), 0);
	struct held h;
	uint8_t key[32];
	unsigned seed = 7, held_wrongly = 0;
	const unsigned added = 200000, others = 200000;

	ck_assert_int_eq(held_map(dup(fd), &h), 0);
	held_take_over(&h);
	ck_assert_uint_eq(atomic_load(&h.hdr->warm), 0); /* nothing to trust at a new mount */
	for (unsigned i = 0; i < added; i++) {
		for (int b = 0; b < 32; b++)
			key[b] = (uint8_t)rand_r(&seed);
		held_keys_add(&h, key);
	}
	atomic_store(&h.hdr->bytes_bound, 12345);
	atomic_store(&h.hdr->warm, HELD_WARM_BYTES | HELD_WARM_KEYS);
	remap(&fd, &h);
	ck_assert_uint_eq(atomic_load(&h.hdr->bytes_bound), 12345);
	ck_assert_uint_eq(atomic_load(&h.hdr->warm), HELD_WARM_BYTES | HELD_WARM_KEYS);
	seed = 7;
	for (unsigned i = 0; i < added; i++) {
		for (int b = 0; b < 32; b++)
			key[b] = (uint8_t)rand_r(&seed);
		ck_assert(held_keys_may_hold(&h, key));
	}
	for (unsigned i = 0; i < others; i++) {
		for (int b = 0; b < 32; b++)
			key[b] = (uint8_t)rand_r(&seed);
		held_wrongly += held_keys_may_hold(&h, key);
	}
	/* 7 bits of 2^27 a key, 200,000 keys: about 1 in 10^13 by the book */
	ck_assert_uint_le(held_wrongly, 2);
	held_unmap(&h);
	close(fd);
}
END_TEST

START_TEST(test_private_layout_serves_without_a_holder)
{
	struct held h;

	ck_assert_int_eq(held_map_private(&h), 0);
	ck_assert(h.fresh);
	struct held_node d = object_desc("v", 1, 1);
	uint64_t id = held_node_alloc(&h, &d);
	ck_assert_ptr_nonnull(held_node_get(&h, id));
	ck_assert(held_node_forget(&h, id, 1));
	ck_assert_uint_eq(held_node_alloc(&h, &d), id); /* reused at once */
	uint64_t fh = held_handle_alloc(&h, 1, id, 0);
	struct held_handle *r = held_handle_get(&h, fh);
	ck_assert_int_eq(held_text_reserve(&h, r, 100), 0);
	ck_assert_uint_eq(r->text_cap, HELD_TEXT_PAGE);
	held_handle_free(&h, fh);
	ck_assert_ptr_null(held_handle_get(&h, fh));
	ck_assert_ptr_nonnull(held_inflight(&h, HELD_INFLIGHT - 1));
	ck_assert_ptr_null(held_inflight(&h, HELD_INFLIGHT));
	held_unmap(&h);
}
END_TEST

/* ---- the keeper ---------------------------------------------------------------------- */

static int file_with(const char *text)
{
	int fd = memfd_create("kept", 0);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	return fd;
}

static void expect_file(int fd, const char *text)
{
	char buf[64] = "";

	ck_assert_int_eq(pread(fd, buf, sizeof(buf) - 1, 0), (ssize_t)strlen(text));
	ck_assert_str_eq(buf, text);
}

START_TEST(test_keeper_keeps_descriptors_across_daemons)
{
	struct keeper_store *s = keeper_store_new();

	/* Two daemons in turn, each a child process with a link of its own: the
	 * first keeps two descriptors and dies; the second fetches them. */
	for (int round = 0; round < 2; round++) {
		int sv[2];
		ck_assert_int_eq(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
		pid_t pid = fork();
		if (pid == 0) {
			close(sv[0]);
			int ok = 1;
			if (round == 0) {
				int a = file_with("slab 0"), b = file_with("slab 1");
				ok &= keeper_keep(sv[1], "gpu/v1/0", a) == 0;
				ok &= keeper_keep(sv[1], "gpu/v1/1", b) == 0;
				ok &= keeper_keep(sv[1], "", a) == -EINVAL;
			} else {
				int fd = -1;
				char buf[16] = "";
				ok &= keeper_fetch(sv[1], "gpu/v1/1", &fd) == 0;
				ok &= pread(fd, buf, 15, 0) == 6 && strcmp(buf, "slab 1") == 0;
				ok &= keeper_fetch(sv[1], "gpu/v2/0", &fd) == -ENOENT && fd == -1;
				close(fd);
				/* What is kept, enumerated by a next daemon. */
				char tag[KEEPER_TAG_MAX];
				int seen = 0;
				for (uint32_t i = 0;; i++) {
					int rc = keeper_next(sv[1], "gpu/v1/", i, tag, &fd);
					if (rc == -ENOENT) {
						ok &= fd == -1;
						break;
					}
					ok &= rc == 0 && fd >= 0 && pread(fd, buf, 15, 0) == 6;
					ok &= strncmp(tag, "gpu/v1/", 7) == 0 && buf[5] == tag[7];
					seen |= 1 << (tag[7] - '0');
					close(fd);
				}
				ok &= seen == 3;
				ok &= keeper_next(sv[1], "gpu/v2/", 0, tag, &fd) == -ENOENT;
				ok &= keeper_drop(sv[1], "gpu/v1/", true) == 0;
			}
			_exit(ok ? 0 : 1);
		}
		close(sv[1]);
		for (;;) {
			struct keeper_msg m;
			int fd;
			int rc = keeper_recv(sv[0], &m, &fd, 5000);
			if (rc == -ECONNRESET)
				break;
			ck_assert_int_eq(rc, 0);
			ck_assert(keeper_store_serve(s, sv[0], &m, fd));
		}
		int status;
		ck_assert_int_eq(waitpid(pid, &status, 0), pid);
		ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
		close(sv[0]);
		if (round == 0) {
			ck_assert_uint_eq(keeper_store_count(s), 2);
			expect_file(keeper_store_get(s, "gpu/v1/0"), "slab 0");
		}
	}
	ck_assert_uint_eq(keeper_store_count(s), 0);
	keeper_store_free(s);
}
END_TEST

/* The daemon's link is shared by its threads (load threads keep slabs, a
 * takeover fetches, unloads drop): many at once, each keeping, fetching
 * back and dropping descriptors of its own, every byte compared, while the
 * holder's side serves them in turn. */
struct link_worker {
	struct keeper_link *k;
	int id;
	int ok;
};

static void *link_worker_main(void *arg)
{
	struct link_worker *w = arg;
	char tag[KEEPER_TAG_MAX], text[32], buf[32];

	w->ok = 1;
	for (int round = 0; round < 42; round++) { /* ends with a drop */
		snprintf(tag, sizeof(tag), "w/%02d/s%d", w->id, round % 3);
		snprintf(text, sizeof(text), "thread %02d round %02d", w->id, round);
		int fd = file_with(text), got = -1;
		w->ok &= keeper_link_keep(w->k, tag, fd) == 0;
		close(fd);
		memset(buf, 0, sizeof(buf));
		w->ok &= keeper_link_fetch(w->k, tag, &got) == 0 &&
			 pread(got, buf, sizeof(buf) - 1, 0) == (ssize_t)strlen(text) &&
			 strcmp(buf, text) == 0;
		if (got >= 0)
			close(got);
		if (round % 3 == 2) {
			snprintf(tag, sizeof(tag), "w/%02d/", w->id);
			uint32_t n = 0;
			char seen[KEEPER_TAG_MAX];
			for (int rc; (rc = keeper_link_next(w->k, tag, n, seen, &got)) == 0; n++) {
				w->ok &= strncmp(seen, tag, strlen(tag)) == 0;
				close(got);
			}
			w->ok &= n == 3 && keeper_link_drop(w->k, tag, true) == 0;
		}
	}
	return NULL;
}

START_TEST(test_keeper_link_serves_many_threads_at_once)
{
	struct keeper_store *s = keeper_store_new();
	int sv[2];

	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
	pid_t pid = fork();
	if (pid == 0) { /* the daemon: 12 threads on one link */
		close(sv[0]);
		struct keeper_link k;
		struct link_worker w[12];
		pthread_t th[12];
		int ok = 1;
		keeper_link_init(&k, sv[1]);
		for (int i = 0; i < 12; i++) {
			w[i] = (struct link_worker){ .k = &k, .id = i };
			ok &= pthread_create(&th[i], NULL, link_worker_main, &w[i]) == 0;
		}
		for (int i = 0; i < 12; i++) {
			pthread_join(th[i], NULL);
			ok &= w[i].ok;
		}
		keeper_link_destroy(&k);
		_exit(ok ? 0 : 1);
	}
	close(sv[1]);
	for (;;) {
		struct keeper_msg m;
		int fd;
		int rc = keeper_recv(sv[0], &m, &fd, 20000);
		if (rc == -ECONNRESET)
			break;
		ck_assert_int_eq(rc, 0);
		ck_assert(keeper_store_serve(s, sv[0], &m, fd));
	}
	int status;
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "daemon side: %d", status);
	ck_assert_uint_eq(keeper_store_count(s), 0); /* every thread dropped what it kept */
	close(sv[0]);
	keeper_store_free(s);
}
END_TEST

START_TEST(test_keeper_store_replaces_drops_and_bounds)
{
	struct keeper_store *s = keeper_store_new();
	char tag[KEEPER_TAG_MAX + 8];

	ck_assert_int_eq(keeper_store_keep(s, "a", file_with("1")), 0);
	ck_assert_int_eq(keeper_store_keep(s, "a", file_with("2")), 0); /* replaces */
	expect_file(keeper_store_get(s, "a"), "2");
	ck_assert_uint_eq(keeper_store_count(s), 1);
	memset(tag, 'x', sizeof(tag));
	tag[KEEPER_TAG_MAX] = '\0';
	int fd = file_with("3");
	ck_assert_int_eq(keeper_store_keep(s, tag, fd), -EINVAL);
	close(fd);
	ck_assert_int_eq(keeper_store_keep(s, "ab", file_with("4")), 0);
	ck_assert_int_eq(keeper_store_keep(s, "b", file_with("5")), 0);
	char found[KEEPER_TAG_MAX];
	ck_assert_int_eq(keeper_store_nth(s, "a", 0, found), keeper_store_get(s, "a"));
	ck_assert_str_eq(found, "a");
	ck_assert_int_eq(keeper_store_nth(s, "a", 1, found), keeper_store_get(s, "ab"));
	ck_assert_str_eq(found, "ab");
	ck_assert_int_eq(keeper_store_nth(s, "a", 2, found), -ENOENT);
	ck_assert_int_eq(keeper_store_nth(s, "", 2, found), keeper_store_get(s, "b"));
	ck_assert_int_eq(keeper_store_drop(s, "a", true), 2);
	ck_assert_int_eq(keeper_store_get(s, "a"), -ENOENT);
	expect_file(keeper_store_get(s, "b"), "5");
	ck_assert_int_eq(keeper_store_drop(s, "b", false), 1);
	ck_assert_uint_eq(keeper_store_count(s), 0);
	keeper_store_free(s);
}
END_TEST

START_TEST(test_keeper_refuses_what_is_not_its_wire)
{
	int sv[2];
	struct keeper_msg m;
	int fd;

	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
	ck_assert_int_eq(write(sv[1], "short", 5), 5);
	ck_assert_int_eq(keeper_recv(sv[0], &m, &fd, 1000), -EPROTO);
	ck_assert_int_eq(fd, -1);
	struct keeper_msg unterminated;
	memset(&unterminated, 'z', sizeof(unterminated));
	ck_assert_int_eq(write(sv[1], &unterminated, sizeof(unterminated)),
			 (ssize_t)sizeof(unterminated));
	ck_assert_int_eq(keeper_recv(sv[0], &m, &fd, 1000), -EPROTO);
	ck_assert_int_eq(keeper_recv(sv[0], &m, &fd, 10), -ETIMEDOUT);
	close(sv[1]);
	ck_assert_int_eq(keeper_recv(sv[0], &m, &fd, 1000), -ECONNRESET);
	close(sv[0]);
}
END_TEST

Suite *held_suite(void)
{
	Suite *s = suite_create("held");
	TCase *tc = tcase_create("held");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_create_records_init_and_layout);
	tcase_add_test(tc, test_nodes_outlive_a_mapping);
	tcase_add_test(tc, test_forgets_during_the_scan_list_each_slot_once);
	tcase_add_test(tc, test_handles_and_texts_outlive_a_mapping);
	tcase_add_test(tc, test_private_layout_serves_without_a_holder);
	tcase_add_test(tc, test_the_key_filter_forgets_no_key_and_holds_few_others);
	tcase_add_test(tc, test_keeper_keeps_descriptors_across_daemons);
	tcase_add_test(tc, test_keeper_store_replaces_drops_and_bounds);
	tcase_add_test(tc, test_keeper_link_serves_many_threads_at_once);
	tcase_add_test(tc, test_keeper_refuses_what_is_not_its_wire);
	suite_add_tcase(s, tc);
	return s;
}
