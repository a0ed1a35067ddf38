/* SPDX-License-Identifier: Apache-2.0 */
/* The layout of a rank's slab (src/weights/layout.c) and where the attach
 * reply carries its digest (include/artfs/artfs.h): the same tensors give
 * the same offsets and digest in any order, any difference another digest. */
#include "autoconf.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "artfs/artfs.h"
#include "suites.h"
#include "weights/weights.h"

#define N 5

struct set {
	struct safetensors_tensor t[N];
	const struct safetensors_tensor *p[N];
	size_t alias[N];
	uint64_t off[N];
	uint64_t slab;
	uint8_t digest[32];
	size_t n;
};

static void add(struct set *s, const char *name, enum safetensors_dtype dt, uint64_t a, uint64_t b)
{
	struct safetensors_tensor *t = &s->t[s->n];

	memset(t, 0, sizeof(*t));
	t->name = (char *)name;
	t->dtype = dt;
	t->ndim = 2;
	t->shape[0] = a;
	t->shape[1] = b;
	t->size = a * b * (dt == SAFETENSORS_F32 ? 4 : 2);
	s->p[s->n] = t;
	s->alias[s->n] = SIZE_MAX;
	s->n++;
}

static void place(struct set *s)
{
	ck_assert_int_eq(weights_layout_place(s->p, s->alias, s->n, s->off, &s->slab), 0);
	ck_assert_int_eq(weights_layout_digest(s->p, s->off, s->n, s->slab, s->digest), 0);
}

static uint64_t offset_of(const struct set *s, const char *name)
{
	for (size_t i = 0; i < s->n; i++)
		if (strcmp(s->t[i].name, name) == 0)
			return s->off[i];
	ck_abort_msg("no tensor %s", name);
	return 0;
}

/* A small model's tensors, in an order that starts at `first`. */
static void model(struct set *s, size_t first)
{
	static const char *names[] = { "model.layers.10.w", "lm_head.weight", "model.embed.weight",
				       "model.layers.2.w", "model.norm.weight" };
	static const uint64_t rows[] = { 64, 1000, 1000, 64, 1 };
	memset(s, 0, sizeof(*s));
	for (size_t k = 0; k < 4; k++) {
		size_t i = (first + k) % 4;
		add(s, names[i], SAFETENSORS_BF16, rows[i], 300);
	}
	add(s, names[4], SAFETENSORS_F32, 1, 300);
}

START_TEST(test_same_tensors_same_offsets_any_order)
{
	static struct set a, b;

	model(&a, 0);
	model(&b, 3);
	place(&a);
	place(&b);
	ck_assert_uint_eq(a.slab, b.slab);
	ck_assert_uint_eq(a.slab % ARTFS_SLAB_ALIGN, 0);
	for (size_t i = 0; i < a.n; i++) {
		ck_assert_uint_eq(a.off[i] % ARTFS_TENSOR_ALIGN, 0);
		ck_assert_uint_eq(a.off[i], offset_of(&b, a.t[i].name));
		ck_assert_uint_le(a.off[i] + a.t[i].size, a.slab);
		for (size_t j = 0; j < a.n; j++) /* no two overlap */
			if (i != j)
				ck_assert(a.off[i] + a.t[i].size <= a.off[j] || a.off[j] + a.t[j].size <= a.off[i]);
	}
	ck_assert_mem_eq(a.digest, b.digest, 32);
	/* By name: "lm_head" first, "model.layers.10" before "model.layers.2". */
	ck_assert_uint_eq(offset_of(&a, "lm_head.weight"), 0);
	ck_assert_uint_lt(offset_of(&a, "model.layers.10.w"), offset_of(&a, "model.layers.2.w"));
}
END_TEST

START_TEST(test_any_difference_another_digest)
{
	static struct set base, x;

	model(&base, 0);
	place(&base);
	for (int change = 0; change < 5; change++) {
		model(&x, 1);
		switch (change) {
		case 0: x.t[0].name = "model.layers.11.w"; break;     /* a name */
		case 1: x.t[4].dtype = SAFETENSORS_I32; break;         /* a dtype of the same size */
		case 2: x.t[0].shape[0] = 300, x.t[0].shape[1] = 64; break; /* a shape of the same size */
		case 3: x.n--; break;                                  /* a tensor less */
		case 4: x.alias[1] = 0, x.t[1].shape[0] = x.t[0].shape[0],
			x.t[1].size = x.t[0].size; break;              /* tied */
		}
		place(&x);
		ck_assert_msg(memcmp(base.digest, x.digest, 32) != 0, "change %d kept the digest", change);
	}
}
END_TEST

START_TEST(test_tied_tensors_share_the_place_of_their_first_name)
{
	static struct set s, u;

	model(&s, 0);
	/* lm_head.weight (index 1) ties to model.embed.weight (index 2): one place, at "lm_head". */
	s.alias[2] = 1;
	place(&s);
	ck_assert_uint_eq(offset_of(&s, "lm_head.weight"), offset_of(&s, "model.embed.weight"));
	ck_assert_uint_eq(offset_of(&s, "lm_head.weight"), 0);
	/* The same tie named from the other side: the same layout. */
	model(&u, 0);
	u.alias[1] = 2;
	place(&u);
	ck_assert_mem_eq(s.digest, u.digest, 32);
	for (size_t i = 0; i < s.n; i++)
		ck_assert_uint_eq(s.off[i], u.off[i]);
	/* Tied takes less room than untied. */
	static struct set apart;
	model(&apart, 0);
	place(&apart);
	ck_assert_uint_lt(offset_of(&s, "model.norm.weight"), offset_of(&apart, "model.norm.weight"));
}
END_TEST

START_TEST(test_the_attach_reply_carries_the_layout)
{
	/* ABI 2 unchanged in size: layout took the place of reserved[4]. */
	ck_assert_uint_eq(sizeof(struct artfs_attach), 768);
	ck_assert_uint_eq(offsetof(struct artfs_attach, layout), 768 - ARTFS_LAYOUT_SIZE);
	ck_assert_uint_eq(offsetof(struct artfs_attach, layout),
			  offsetof(struct artfs_attach, token) + ARTFS_ATTACH_TOKEN_SIZE);
}
END_TEST

Suite *layout_suite(void)
{
	Suite *s = suite_create("layout");
	TCase *tc = tcase_create("layout");

	tcase_add_test(tc, test_same_tensors_same_offsets_any_order);
	tcase_add_test(tc, test_any_difference_another_digest);
	tcase_add_test(tc, test_tied_tensors_share_the_place_of_their_first_name);
	tcase_add_test(tc, test_the_attach_reply_carries_the_layout);
	suite_add_tcase(s, tc);
	return s;
}
