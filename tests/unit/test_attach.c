/* SPDX-License-Identifier: Apache-2.0 */
/* Attaching weights without CUDA: the tokens of ARTFS_IOC_ATTACH
 * (src/state/grant.c), the wire of .artfs/attach and the hand-over of slab
 * descriptors (src/weights/socket.c, here with memfds standing for the slabs:
 * the server passes any descriptor), and the record of ready weights that
 * the holder keeps (src/format/weights_record.c). */
#include "autoconf.h"

#include <errno.h>
#include <ftw.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "format/weights_record.h"
#include "ns/tree.h"
#include "state/base.h"
#include "state/config.h"
#include "state/grant.h"
#include "suites.h"
#include "weights/socket.h"

/* ---- tokens ---------------------------------------------------------------------------- */

static int note_owner(void *owner, void *ctx)
{
	*(void **)ctx = owner;
	return 7;
}

START_TEST(test_token_serves_once_for_its_owner)
{
	struct grants *g = malloc(sizeof(*g));
	uint8_t a[ARTFS_ATTACH_TOKEN_SIZE], b[ARTFS_ATTACH_TOKEN_SIZE];
	int owner_a, owner_b;
	void *seen = NULL;

	grants_init(g);
	ck_assert_int_eq(grants_issue(g, &owner_a, 1000, a), 0);
	ck_assert_int_eq(grants_issue(g, &owner_b, 1000, b), 0);
	ck_assert(memcmp(a, b, sizeof(a)) != 0);
	ck_assert_uint_eq(grants_live(g, 1000), 2);
	ck_assert_int_eq(grants_take(g, a, 2000, note_owner, &seen), 7);
	ck_assert_ptr_eq(seen, &owner_a);
	seen = NULL;
	ck_assert_int_eq(grants_take(g, a, 2000, note_owner, &seen), -ENOENT); /* once */
	ck_assert_ptr_null(seen);
	/* A token one bit off is no token. */
	b[5] ^= 1;
	ck_assert_int_eq(grants_take(g, b, 2000, note_owner, &seen), -ENOENT);
	b[5] ^= 1;
	/* Its owner released: gone. */
	grants_drop_owner(g, &owner_b);
	ck_assert_int_eq(grants_take(g, b, 2000, note_owner, &seen), -ENOENT);
	ck_assert_uint_eq(grants_live(g, 2000), 0);
	grants_destroy(g);
	free(g);
}
END_TEST

START_TEST(test_token_expires_and_the_table_is_bounded)
{
	struct grants *g = malloc(sizeof(*g));
	uint8_t tok[ARTFS_ATTACH_TOKEN_SIZE], first[ARTFS_ATTACH_TOKEN_SIZE];
	static char owners[GRANTS_MAX + 1]; /* one open file each */
	void *seen = NULL;

	grants_init(g);
	ck_assert_int_eq(grants_issue(g, &owners[0], 0, first), 0);
	ck_assert_int_eq(grants_take(g, first, GRANT_TTL_NS + 1, note_owner, &seen), -ENOENT);
	for (int i = 0; i < GRANTS_MAX; i++)
		ck_assert_int_eq(grants_issue(g, &owners[i], 10, tok), 0);
	ck_assert_int_eq(grants_issue(g, &owners[GRANTS_MAX], 10, tok), -EBUSY);
	/* Expired slots are used again. */
	ck_assert_int_eq(grants_issue(g, &owners[GRANTS_MAX], 10 + GRANT_TTL_NS, tok), 0);
	grants_destroy(g);
	free(g);
}
END_TEST

/* An open file that asks again and again holds its newest tokens only: it
 * neither fills the table nor loses the token it asked for last. */
START_TEST(test_one_owner_holds_a_few_tokens)
{
	struct grants *g = malloc(sizeof(*g));
	uint8_t tok[GRANTS_PER_OWNER + 8][ARTFS_ATTACH_TOKEN_SIZE];
	int owner, other;
	void *seen = NULL;

	grants_init(g);
	for (int i = 0; i < GRANTS_PER_OWNER + 8; i++)
		ck_assert_int_eq(grants_issue(g, &owner, 100 + i, tok[i]), 0);
	ck_assert_uint_eq(grants_live(g, 200), GRANTS_PER_OWNER);
	/* The oldest went; the newest serve. */
	ck_assert_int_eq(grants_take(g, tok[0], 200, note_owner, &seen), -ENOENT);
	ck_assert_int_eq(grants_take(g, tok[GRANTS_PER_OWNER + 7], 200, note_owner, &seen), 7);
	ck_assert_ptr_eq(seen, &owner);
	/* Another owner is not crowded out. */
	for (int i = 0; i < GRANTS_MAX - GRANTS_PER_OWNER; i++)
		ck_assert_int_eq(grants_issue(g, &other, 300, tok[0]), 0);
	ck_assert_uint_eq(grants_live(g, 400), GRANTS_PER_OWNER - 1 + GRANTS_PER_OWNER);
	grants_destroy(g);
	free(g);
}
END_TEST

/* Engines attach and close their rank files on many threads at once: a
 * token serves once, for its own owner, never after its owner dropped it. */
#define GRANT_THREADS 8
#define GRANT_ROUNDS 2000

struct grant_worker {
	struct grants *g;
	int owner;       /* its address is the owner */
	int ok;
};

static int owner_is(void *owner, void *ctx)
{
	return owner == ctx ? 0 : -EPROTO;
}

static void *grant_worker_main(void *arg)
{
	struct grant_worker *w = arg;
	uint8_t tok[ARTFS_ATTACH_TOKEN_SIZE];

	w->ok = 1;
	for (int i = 0; i < GRANT_ROUNDS; i++) {
		w->ok &= grants_issue(w->g, &w->owner, 1000 + i, tok) == 0;
		if (i % 5 == 4) { /* its file closes: the token is gone */
			grants_drop_owner(w->g, &w->owner);
			w->ok &= grants_take(w->g, tok, 1000 + i, owner_is, &w->owner) == -ENOENT;
			continue;
		}
		w->ok &= grants_take(w->g, tok, 1000 + i, owner_is, &w->owner) == 0;
		w->ok &= grants_take(w->g, tok, 1000 + i, owner_is, &w->owner) == -ENOENT;
	}
	return NULL;
}

START_TEST(test_tokens_on_many_threads_at_once)
{
	struct grants *g = malloc(sizeof(*g));
	struct grant_worker w[GRANT_THREADS];
	pthread_t th[GRANT_THREADS];

	grants_init(g);
	for (int i = 0; i < GRANT_THREADS; i++) {
		w[i] = (struct grant_worker){ .g = g };
		ck_assert_int_eq(pthread_create(&th[i], NULL, grant_worker_main, &w[i]), 0);
	}
	for (int i = 0; i < GRANT_THREADS; i++) {
		pthread_join(th[i], NULL);
		ck_assert_msg(w[i].ok, "thread %d", i);
	}
	ck_assert_uint_eq(grants_live(g, 1000), 0);
	grants_destroy(g);
	free(g);
}
END_TEST

/* ---- the socket and the hand-over ---------------------------------------------------- */

static int memfd_text(const char *text)
{
	int fd = memfd_create("slab", MFD_CLOEXEC);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	return fd;
}

struct fake_slabs {
	uint8_t token[ARTFS_ATTACH_TOKEN_SIZE];
	int fds[3];
	int asked;
};

/* The resolver: its token gives three "slabs" (dups of memfds). */
static int resolve(void *ctx, const uint8_t token[ARTFS_ATTACH_TOKEN_SIZE], struct attach_slabs *out)
{
	struct fake_slabs *f = ctx;

	f->asked++;
	if (memcmp(token, f->token, sizeof(f->token)) != 0)
		return -ENOENT;
	out->count = 3;
	for (int i = 0; i < 3; i++) {
		out->fd[i] = dup(f->fds[i]);
		out->size[i] = (uint64_t)(i + 1) << 21;
	}
	return 0;
}

/* Sends len bytes as the request on a fresh connection to the server at
 * path, reads the reply and its descriptors. */
static ssize_t ask(const char *path, const void *req, size_t len, struct artfs_slabs_reply *r,
		   int *fds, int *nfds)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	union {
		char buf[CMSG_SPACE(sizeof(int) * ARTFS_SLABS_MAX)];
		struct cmsghdr align;
	} u;
	struct iovec iov = { .iov_base = r, .iov_len = sizeof(*r) };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
			      .msg_controllen = sizeof(u.buf) };

	snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
	int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	ck_assert_int_ge(s, 0);
	ck_assert_int_eq(connect(s, (struct sockaddr *)&a, sizeof(a)), 0);
	if (len)
		ck_assert_int_eq(send(s, req, len, 0), (ssize_t)len);
	ssize_t n = recvmsg(s, &msg, MSG_CMSG_CLOEXEC);
	*nfds = 0;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
		size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		memcpy(fds + *nfds, CMSG_DATA(c), k * sizeof(int));
		*nfds += (int)k;
	}
	close(s);
	return n;
}

START_TEST(test_socket_hands_over_the_slabs_of_a_token)
{
	char dir[] = "/tmp/artfs-attach-XXXXXX", path[64], err[256];
	struct fake_slabs f = { .asked = 0 };
	struct artfs_slabs_request req = { .magic = ARTFS_SLABS_MAGIC, .abi = ARTFS_ABI_VERSION };
	struct artfs_slabs_reply r;
	int fds[ARTFS_SLABS_MAX], n;

	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/attach", dir);
	memset(f.token, 0xab, sizeof(f.token));
	f.fds[0] = memfd_text("slab zero");
	f.fds[1] = memfd_text("slab one");
	f.fds[2] = memfd_text("slab two");
	int lfd = attach_socket_make(path, err, sizeof(err));
	ck_assert_msg(lfd >= 0, "%s", err);
	struct attach_server *s = attach_server_start(lfd, resolve, &f);
	ck_assert_ptr_nonnull(s);

	memcpy(req.token, f.token, sizeof(req.token));
	ck_assert_int_eq(ask(path, &req, sizeof(req), &r, fds, &n), (ssize_t)sizeof(r));
	ck_assert_uint_eq(r.magic, ARTFS_SLABS_MAGIC);
	ck_assert_int_eq(r.error, 0);
	ck_assert_uint_eq(r.slab_count, 3);
	ck_assert_int_eq(n, 3);
	const char *want[] = { "slab zero", "slab one", "slab two" };
	for (int i = 0; i < 3; i++) {
		char buf[16] = "";
		ck_assert_int_eq(pread(fds[i], buf, sizeof(buf) - 1, 0), (ssize_t)strlen(want[i]));
		ck_assert_str_eq(buf, want[i]); /* the same object, in slab order */
		ck_assert_uint_eq(r.slab_size[i], (uint64_t)(i + 1) << 21);
		close(fds[i]);
	}

	/* A wrong token: the resolver's errno, no descriptor. */
	req.token[0] ^= 1;
	ck_assert_int_eq(ask(path, &req, sizeof(req), &r, fds, &n), (ssize_t)sizeof(r));
	ck_assert_int_eq(r.error, -ENOENT);
	ck_assert_int_eq(n, 0);
	req.token[0] ^= 1;
	/* Not this wire: short, long, another magic or abi; never resolved. */
	int asked = f.asked;
	uint8_t longer[sizeof(req) + 8];
	memcpy(longer, &req, sizeof(req));
	memset(longer + sizeof(req), 0, 8);
	struct artfs_slabs_request bad = req;
	ck_assert_int_eq(ask(path, &req, sizeof(req) - 1, &r, fds, &n), (ssize_t)sizeof(r));
	ck_assert_int_eq(r.error, -EPROTO);
	ck_assert_int_eq(ask(path, longer, sizeof(longer), &r, fds, &n), (ssize_t)sizeof(r));
	ck_assert_int_eq(r.error, -EPROTO);
	bad.magic ^= 1;
	ck_assert_int_eq(ask(path, &bad, sizeof(bad), &r, fds, &n), (ssize_t)sizeof(r));
	ck_assert_int_eq(r.error, -EPROTO);
	bad = req;
	bad.abi = 1;
	ck_assert_int_eq(ask(path, &bad, sizeof(bad), &r, fds, &n), (ssize_t)sizeof(r));
	ck_assert_int_eq(r.error, -EPROTO);
	ck_assert_int_eq(f.asked, asked);
	ck_assert_int_eq(n, 0);

	/* A client that sends nothing is cut off; the server goes on. */
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
	int mute = socket(AF_UNIX, SOCK_SEQPACKET, 0);
	ck_assert_int_eq(connect(mute, (struct sockaddr *)&a, sizeof(a)), 0);
	char one;
	ck_assert_int_eq(recv(mute, &one, 1, 0), 0); /* closed within a second */
	close(mute);
	ck_assert_int_eq(ask(path, &req, sizeof(req), &r, fds, &n), (ssize_t)sizeof(r));
	ck_assert_int_eq(r.error, 0);
	for (int i = 0; i < n; i++)
		close(fds[i]);
	/* Many that send nothing, more than wait at once: a client with its
	 * request is served beside them, not after their second each (one
	 * at a time, 100 s; the bound is loose for a loaded machine). */
	int mutes[100];
	for (int i = 0; i < 100; i++) {
		mutes[i] = socket(AF_UNIX, SOCK_SEQPACKET, 0);
		ck_assert_int_eq(connect(mutes[i], (struct sockaddr *)&a, sizeof(a)), 0);
	}
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	ck_assert_int_eq(ask(path, &req, sizeof(req), &r, fds, &n), (ssize_t)sizeof(r));
	clock_gettime(CLOCK_MONOTONIC, &t1);
	ck_assert_int_eq(r.error, 0);
	for (int i = 0; i < n; i++)
		close(fds[i]);
	double waited = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
	ck_assert_msg(waited < 20, "served after %.3f s: the silent clients held it up", waited);
	for (int i = 0; i < 100; i++)
		close(mutes[i]);

	/* Another server on the same listening socket (the next daemon's,
	 * from the holder's copy) serves what is queued. */
	attach_server_stop(s);
	s = attach_server_start(lfd, resolve, &f);
	ck_assert_int_eq(ask(path, &req, sizeof(req), &r, fds, &n), (ssize_t)sizeof(r));
	ck_assert_int_eq(r.error, 0);
	ck_assert_int_eq(n, 3);
	for (int i = 0; i < n; i++)
		close(fds[i]);
	attach_server_stop(s);
	close(lfd);
	for (int i = 0; i < 3; i++)
		close(f.fds[i]);
	unlink(path);
	rmdir(dir);
}
END_TEST

START_TEST(test_many_clients_at_once_each_get_their_slabs)
{
	char dir[] = "/tmp/artfs-attach-XXXXXX", path[64], err[256];
	struct fake_slabs f = { .asked = 0 };

	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/attach", dir);
	memset(f.token, 0x5a, sizeof(f.token));
	for (int i = 0; i < 3; i++)
		f.fds[i] = memfd_text(i == 0 ? "a" : i == 1 ? "bb" : "ccc");
	int lfd = attach_socket_make(path, err, sizeof(err));
	ck_assert_int_ge(lfd, 0);
	struct attach_server *s = attach_server_start(lfd, resolve, &f);
	/* 16 processes at once; every fourth also keeps connections that say
	 * nothing and sends requests of another wire, beside its own. */
	pid_t kids[16];
	for (int k = 0; k < 16; k++) {
		kids[k] = fork();
		if (kids[k] == 0) {
			struct artfs_slabs_request req = { .magic = ARTFS_SLABS_MAGIC,
							   .abi = ARTFS_ABI_VERSION }, bad;
			struct artfs_slabs_reply r;
			int fds[ARTFS_SLABS_MAX], n, mutes[8], nmutes = 0;
			struct sockaddr_un a = { .sun_family = AF_UNIX };
			snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
			memcpy(req.token, f.token, sizeof(req.token));
			bad = req;
			bad.magic ^= 1;
			for (int round = 0; round < 50; round++) {
				if (k % 4 == 0 && nmutes < 8 && round % 6 == 0) {
					mutes[nmutes] = socket(AF_UNIX, SOCK_SEQPACKET, 0);
					if (connect(mutes[nmutes], (struct sockaddr *)&a, sizeof(a)) == 0)
						nmutes++;
					else
						close(mutes[nmutes]);
				}
				if (k % 4 == 0 && (ask(path, &bad, sizeof(bad), &r, fds, &n) !=
						   (ssize_t)sizeof(r) || r.error != -EPROTO || n != 0))
					_exit(3);
				if (ask(path, &req, sizeof(req), &r, fds, &n) != (ssize_t)sizeof(r) ||
				    r.error != 0 || n != 3)
					_exit(1);
				for (int i = 0; i < 3; i++) { /* every byte of each slab */
					char buf[8] = "";
					const char *want = i == 0 ? "a" : i == 1 ? "bb" : "ccc";
					if (pread(fds[i], buf, sizeof(buf) - 1, 0) != i + 1 ||
					    strcmp(buf, want) != 0 || r.slab_size[i] != (uint64_t)(i + 1) << 21)
						_exit(2);
					close(fds[i]);
				}
			}
			for (int i = 0; i < nmutes; i++)
				close(mutes[i]);
			_exit(0);
		}
	}
	for (int k = 0; k < 16; k++) {
		int status;
		ck_assert_int_eq(waitpid(kids[k], &status, 0), kids[k]);
		ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "client %d: %d", k, status);
	}
	attach_server_stop(s);
	close(lfd);
	for (int i = 0; i < 3; i++)
		close(f.fds[i]);
	unlink(path);
	rmdir(dir);
}
END_TEST

/* ---- the record the holder keeps ------------------------------------------------------ */

static struct wrecord *sample_record(void)
{
	struct wrecord *r = calloc(1, sizeof(*r));

	snprintf(r->version, sizeof(r->version), "rl-step-42");
	snprintf(r->quant_method, sizeof(r->quant_method), "fp8");
	r->quant_block_fp8 = true;
	r->status = strdup("state = ready\nsource = checkpoint\nbytes_total = 123\n");
	r->manifest = strdup("{\n \"weight_version\": \"rl-step-42\"\n}");
	r->manifest_len = strlen(r->manifest);
	r->nranks = 2;
	for (int i = 0; i < 2; i++) {
		struct wrecord_rank *k = &r->ranks[i];
		k->device = i;
		memset(k->uuid, 0x10 + i, 16);
		k->slab_size = (uint64_t)(i + 3) << 21;
		k->bytes = k->slab_size - 100;
		snprintf(k->fp.architecture, sizeof(k->fp.architecture), "LlamaForCausalLM");
		snprintf(k->fp.dtypes, sizeof(k->fp.dtypes), "BF16,F32");
		memset(k->fp.revision, 0xc0 + i, 32);
		memset(k->fp.quant_config_sha256, 0x33, 32);
		k->fp.tp_size = 2;
		k->fp.tp_rank = (uint32_t)i;
		k->fp.cc_major = 9;
		k->fp.driver_version = 13000;
	}
	return r;
}

START_TEST(test_record_decodes_to_what_was_encoded)
{
	struct wrecord *r = sample_record(), *back = calloc(1, sizeof(*back));
	char err[256];
	size_t len;

	char *bytes = wrecord_encode(r, &len);
	ck_assert_ptr_nonnull(bytes);
	ck_assert_int_eq(wrecord_decode(bytes, len, back, err, sizeof(err)), 0);
	ck_assert_str_eq(back->version, r->version);
	ck_assert_str_eq(back->quant_method, "fp8");
	ck_assert(back->quant_block_fp8);
	ck_assert_str_eq(back->status, r->status);
	ck_assert_str_eq(back->manifest, r->manifest);
	ck_assert_uint_eq(back->manifest_len, r->manifest_len);
	ck_assert_int_eq(back->nranks, 2);
	for (int i = 0; i < 2; i++) {
		ck_assert_int_eq(back->ranks[i].device, r->ranks[i].device);
		ck_assert_mem_eq(back->ranks[i].uuid, r->ranks[i].uuid, 16);
		ck_assert_uint_eq(back->ranks[i].slab_size, r->ranks[i].slab_size);
		ck_assert_uint_eq(back->ranks[i].bytes, r->ranks[i].bytes);
		ck_assert_mem_eq(&back->ranks[i].fp, &r->ranks[i].fp, sizeof(struct artfs_fingerprint));
	}
	/* Every cut and every flipped byte of the header fails or decodes to
	 * something within bounds; a cut inside the manifest keeps a shorter
	 * manifest, never more. */
	for (size_t cut = 0; cut < len; cut++) {
		struct wrecord *x = calloc(1, sizeof(*x));
		if (wrecord_decode(bytes, cut, x, err, sizeof(err)) == 0) {
			ck_assert_uint_lt(x->manifest_len, r->manifest_len);
			ck_assert(x->nranks >= 1 && x->nranks <= WRECORD_RANKS_MAX);
		}
		wrecord_free(x);
		free(x);
	}
	size_t head_end = (size_t)((char *)memchr(bytes + 16, '\n', len - 16) - bytes);
	for (size_t at = 0; at < head_end; at++) {
		struct wrecord *x = calloc(1, sizeof(*x));
		char keep = bytes[at];
		bytes[at] = (char)(keep ^ 0x5a);
		if (wrecord_decode(bytes, len, x, err, sizeof(err)) == 0)
			for (int i = 0; i < x->nranks; i++)
				ck_assert(x->ranks[i].slab_size % ARTFS_SLAB_ALIGN == 0 &&
					  x->ranks[i].bytes <= x->ranks[i].slab_size);
		bytes[at] = keep;
		wrecord_free(x);
		free(x);
	}
	free(bytes);
	wrecord_free(back);
	free(back);
	wrecord_free(r);
	free(r);
}
END_TEST

START_TEST(test_record_refuses_what_is_out_of_bounds)
{
	struct wrecord *r = sample_record(), *back = calloc(1, sizeof(*back));
	char err[256];
	size_t len;

	r->ranks[1].slab_size += 1; /* not a multiple of 2 MiB */
	char *bytes = wrecord_encode(r, &len);
	ck_assert_int_eq(wrecord_decode(bytes, len, back, err, sizeof(err)), -EINVAL);
	free(bytes);
	r->ranks[1].slab_size -= 1;
	r->ranks[1].bytes = r->ranks[1].slab_size + 1; /* more tensor bytes than slab */
	bytes = wrecord_encode(r, &len);
	ck_assert_int_eq(wrecord_decode(bytes, len, back, err, sizeof(err)), -EINVAL);
	free(bytes);
	ck_assert_int_eq(wrecord_decode("artfs-weights 2\n{}\n{}", 21, back, err, sizeof(err)), -EINVAL);
	ck_assert_int_eq(wrecord_decode("", 0, back, err, sizeof(err)), -EINVAL);
	r->nranks = 0;
	ck_assert_ptr_null(wrecord_encode(r, &len));
	wrecord_free(back);
	free(back);
	wrecord_free(r);
	free(r);
}
END_TEST

/* ---- lookups while a takeover lists a version (base.c) ------------------------------- */

/* A lookup that misses while the version is listed in the background, the
 * listing ending (its object indexed) before the lookup's answer: the
 * object is committed, so the answer is the object, never "not there". */
static uint8_t late_hash[32];

static void listing_ends_now(struct tree *t, struct version *v)
{
	if (atomic_load(&v->listed))
		return;
	struct object *o = object_new_found(v, late_hash, sizeof(late_hash));
	ck_assert_ptr_nonnull(o);
	pthread_mutex_lock(&t->lock);
	ck_assert_int_eq(index_object_insert(&t->idx, v, o), 0);
	t->objects++;
	atomic_store(&v->listed, true);
	pthread_mutex_unlock(&t->lock);
	node_unref(&o->node, 1);
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st; (void)flag; (void)ftw;
	return remove(path);
}

START_TEST(test_object_indexed_while_looked_up_is_found)
{
	char base[64] = "/tmp/artfs-unit-XXXXXX", store[128], err[256];
	struct artfs_config cfg;
	struct tree t;
	struct version *v;

	ck_assert_ptr_nonnull(mkdtemp(base));
	snprintf(store, sizeof(store), "%s/store", base);
	config_init(&cfg);
	free(cfg.store);
	cfg.store = strdup(store);
	ck_assert_msg(tree_open(&t, &cfg, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(version_make(&t, "late-listing", &v), 0);
	memset(late_hash, 0x5a, sizeof(late_hash));
	atomic_store(&v->listed, false); /* as a daemon that took over sees it */
	version_object_find_hook = listing_ends_now;
	struct object *o = version_object_find(&t, v, late_hash, sizeof(late_hash));
	version_object_find_hook = NULL;
	ck_assert_ptr_nonnull(o);
	node_unref(&o->node, 1);
	/* listed before the lookup: a miss is final */
	uint8_t other[32];
	memset(other, 0xa5, sizeof(other));
	ck_assert_ptr_null(version_object_find(&t, v, other, sizeof(other)));
	node_unref(&v->node, 1);
	tree_close(&t);
	config_free(&cfg);
	nftw(base, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}
END_TEST

Suite *attach_suite(void)
{
	Suite *s = suite_create("attach");
	TCase *tc = tcase_create("attach");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_token_serves_once_for_its_owner);
	tcase_add_test(tc, test_token_expires_and_the_table_is_bounded);
	tcase_add_test(tc, test_one_owner_holds_a_few_tokens);
	tcase_add_test(tc, test_tokens_on_many_threads_at_once);
	tcase_add_test(tc, test_socket_hands_over_the_slabs_of_a_token);
	tcase_add_test(tc, test_many_clients_at_once_each_get_their_slabs);
	tcase_add_test(tc, test_record_decodes_to_what_was_encoded);
	tcase_add_test(tc, test_record_refuses_what_is_out_of_bounds);
	tcase_add_test(tc, test_object_indexed_while_looked_up_is_found);
	suite_add_tcase(s, tc);
	return s;
}
