/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>


#include <jansson.h>

#include "format/checkpoint.h"
#include "lib/sha256.h"
#include "suites.h"

static char root[64];

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	return remove(path);
}

static void setup(void)
{
	strcpy(root, "/tmp/artfs-ckpt-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(root));
}

static void teardown(void)
{
	nftw(root, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* root/<rel>, formatted. */
static const char *at(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static const char *at(const char *fmt, ...)
{
	static char paths[4][512];
	static int next;
	char rel[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(rel, sizeof(rel), fmt, ap);
	va_end(ap);
	char *p = paths[next++ % 4];
	snprintf(p, sizeof(paths[0]), "%s/%s", root, rel);
	return p;
}

static void write_bytes(const char *path, const void *data, size_t len)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	ck_assert_msg(fd >= 0, "%s: %s", path, strerror(errno));
	ck_assert_int_eq(write(fd, data, len), (ssize_t)len);
	close(fd);
}

static void write_text(const char *path, const char *text)
{
	write_bytes(path, text, strlen(text));
}

/* A safetensors file as the reference writes it (sorted compact JSON,
 * padded with spaces to 8): one tensor of shape [elems] per comma-separated
 * name, all of dtype, data bytes all fill. */
static void write_st(const char *path, const char *names, const char *dtype, unsigned elems,
		     uint8_t fill)
{
	json_t *hdr = json_object();
	char *copy = strdup(names), *save = NULL;
	uint64_t off = 0;
	enum safetensors_dtype dt;

	ck_assert_int_eq(safetensors_dtype_from_name(dtype, &dt), 0);
	uint64_t size = (uint64_t)elems * safetensors_dtype_bits(dt) / 8;
	for (char *n = strtok_r(copy, ",", &save); n; n = strtok_r(NULL, ",", &save)) {
		json_object_set_new(hdr, n, json_pack("{s:s, s:[I], s:[I,I]}", "dtype", dtype,
						      "shape", (json_int_t)elems, "data_offsets",
						      (json_int_t)off, (json_int_t)(off + size)));
		off += size;
	}
	free(copy);
	char *text = json_dumps(hdr, JSON_SORT_KEYS | JSON_COMPACT);
	json_decref(hdr);
	size_t n = strlen(text), padded = (n + 7) / 8 * 8;
	size_t len = 8 + padded + off;
	uint8_t *buf = malloc(len);
	for (int i = 0; i < 8; i++)
		buf[i] = (uint8_t)((uint64_t)padded >> (8 * i));
	memset(buf + 8, ' ', padded);
	memcpy(buf + 8, text, n);
	memset(buf + 8 + padded, fill, off);
	write_bytes(path, buf, len);
	free(buf);
	free(text);
}

static int open_root(struct checkpoint *c, char *err, size_t errlen)
{
	return checkpoint_open(root, c, err, errlen);
}

static void expect_fail(int want, const char *why)
{
	struct checkpoint c;
	char err[512] = "";
	int rc = open_root(&c, err, sizeof(err));
	ck_assert_msg(rc == want, "got %d (%s), want %d", rc, err, want);
	ck_assert_msg(strstr(err, why), "\"%s\" lacks \"%s\"", err, why);
	ck_assert_ptr_null(c.files);
	ck_assert_ptr_null(c.dir);
}

START_TEST(hf_without_index)
{
	struct checkpoint c;
	char err[512] = "";

	write_st(at("model-00002-of-00002.safetensors"), "lm_head.weight", "BF16", 8, 1);
	write_st(at("model-00001-of-00002.safetensors"), "embed.weight,norm.weight", "F32", 4, 2);
	write_text(at(".model-00003-of-00002.safetensors"), "hidden: ignored, as by a glob");
	write_text(at("README.md"), "not a checkpoint file");
	write_text(at("tokenizer.json"), "{}");
	ck_assert_msg(open_root(&c, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(c.layout, CHECKPOINT_HF);
	ck_assert_int_eq(c.ranks, 0);
	ck_assert_str_eq(c.dir, root);
	ck_assert_uint_eq(c.nfiles, 2);
	ck_assert_str_eq(c.files[0].name, "model-00001-of-00002.safetensors");
	ck_assert_str_eq(c.files[0].path, at("model-00001-of-00002.safetensors"));
	ck_assert_str_eq(c.files[1].name, "model-00002-of-00002.safetensors");
	ck_assert_int_eq(c.files[0].rank, -1);
	ck_assert_int_eq(c.files[1].part, -1);
	ck_assert_uint_eq(c.files[0].st.count, 2);
	ck_assert_ptr_null(c.files[0].st.raw);
	ck_assert_uint_eq(c.ntensors, 3);
	ck_assert_str_eq(c.dtypes, "BF16,F32");
	ck_assert_uint_eq(checkpoint_rank_bytes(&c, 0), 16 + 32);
	ck_assert_uint_eq(checkpoint_rank_bytes(&c, 7), 16 + 32);
	ck_assert_str_eq(c.architecture, "");
	ck_assert_str_eq(c.quant_method, "");
	ck_assert(!c.quant_block_fp8);
	static const uint8_t zero[32];
	ck_assert_int_eq(memcmp(c.quant_config_sha256, zero, 32), 0);
	ck_assert_int_ne(memcmp(c.revision, zero, 32), 0);
	checkpoint_close(&c);
	checkpoint_close(&c); /* twice is fine */
}
END_TEST

START_TEST(hf_with_index)
{
	struct checkpoint c;
	char err[512] = "";

	write_st(at("model-00001-of-00002.safetensors"), "a,b", "BF16", 4, 1);
	write_st(at("model-00002-of-00002.safetensors"), "c", "BF16", 4, 1);
	/* The same tensors again, in a file the index does not name. */
	write_st(at("consolidated.safetensors"), "a,b,c", "F32", 4, 1);
	write_text(at("model.safetensors.index.json"),
		   "{\"metadata\":{\"total_size\":24},\"weight_map\":{"
		   "\"a\":\"model-00001-of-00002.safetensors\","
		   "\"c\":\"model-00002-of-00002.safetensors\","
		   "\"b\":\"model-00001-of-00002.safetensors\"}}");
	ck_assert_msg(open_root(&c, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(c.nfiles, 2);
	ck_assert_str_eq(c.files[0].name, "model-00001-of-00002.safetensors");
	ck_assert_str_eq(c.files[1].name, "model-00002-of-00002.safetensors");
	ck_assert_str_eq(c.dtypes, "BF16");
	ck_assert_uint_eq(checkpoint_rank_bytes(&c, 0), 24);
	checkpoint_close(&c);
}
END_TEST

START_TEST(hf_bad_index)
{
	write_st(at("model-00001-of-00002.safetensors"), "a,b", "BF16", 4, 1);
	write_st(at("model-00002-of-00002.safetensors"), "c", "BF16", 4, 1);
	const char *index = at("model.safetensors.index.json");

	write_text(index, "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
		   "\"b\":\"model-00001-of-00002.safetensors\",\"c\":\"model-00003-of-00002.safetensors\"}}");
	expect_fail(-EINVAL, "model-00003-of-00002.safetensors, which is not in the directory");
	/* A tensor mapped to the wrong file. */
	write_text(index, "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
		   "\"b\":\"model-00002-of-00002.safetensors\",\"c\":\"model-00002-of-00002.safetensors\"}}");
	expect_fail(-EINVAL, "model-00001-of-00002.safetensors: tensor \"b\" is mapped to "
		    "model-00002-of-00002.safetensors");
	/* A tensor of a used file missing from the map. */
	write_text(index, "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
		   "\"c\":\"model-00002-of-00002.safetensors\"}}");
	expect_fail(-EINVAL, "model-00001-of-00002.safetensors: tensor \"b\" is not in");
	/* Malformed indexes. */
	write_text(index, "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\",\"a\":\"x\"}}");
	expect_fail(-EINVAL, "model.safetensors.index.json: JSON");
	write_text(index, "{\"weight_map\":{\"a\":1}}");
	expect_fail(-EINVAL, "is not a string");
	write_text(index, "{\"weight_map\":{}}");
	expect_fail(-EINVAL, "weight_map is empty");
	write_text(index, "{\"metadata\":{}}");
	expect_fail(-EINVAL, "no weight_map");
	write_text(index, "[]");
	expect_fail(-EINVAL, "not a JSON object");
	write_text(index, "{\"weight_map\":{\"a\":\"../model-00001-of-00002.safetensors\"}}");
	expect_fail(-EINVAL, "not in the directory");
}
END_TEST

START_TEST(duplicate_names)
{
	write_st(at("a.safetensors"), "x,y", "F16", 2, 0);
	write_st(at("b.safetensors"), "z,y", "F16", 2, 0);
	expect_fail(-EINVAL, "b.safetensors: tensor \"y\" is also in a.safetensors");
}
END_TEST

START_TEST(vllm_sharded)
{
	struct checkpoint c;
	char err[512] = "";

	/* The same names on both ranks, split over parts differently. */
	write_st(at("model-rank-0-part-0.safetensors"), "w1,w2", "BF16", 8, 0);
	write_st(at("model-rank-0-part-1.safetensors"), "w3", "BF16", 8, 0);
	write_st(at("model-rank-1-part-0.safetensors"), "w1", "BF16", 8, 0);
	write_st(at("model-rank-1-part-1.safetensors"), "w2", "F8_E4M3", 8, 0);
	write_st(at("model-rank-1-part-10.safetensors"), "w3", "BF16", 4, 0);
	/* save_sharded_state.py copies the original index along: ignored. */
	write_text(at("model.safetensors.index.json"),
		   "{\"weight_map\":{\"w1\":\"model-00001-of-00001.safetensors\"}}");
	write_text(at("config.json"), "{\"architectures\":[\"LlamaForCausalLM\"]}");
	ck_assert_msg(open_root(&c, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(c.layout, CHECKPOINT_VLLM_SHARDED);
	ck_assert_int_eq(c.ranks, 2);
	ck_assert_uint_eq(c.nfiles, 5);
	static const struct { const char *name; int rank, part; } want[] = {
		{ "model-rank-0-part-0.safetensors", 0, 0 },
		{ "model-rank-0-part-1.safetensors", 0, 1 },
		{ "model-rank-1-part-0.safetensors", 1, 0 },
		{ "model-rank-1-part-1.safetensors", 1, 1 },
		{ "model-rank-1-part-10.safetensors", 1, 10 },
	};
	for (size_t i = 0; i < 5; i++) {
		ck_assert_str_eq(c.files[i].name, want[i].name);
		ck_assert_int_eq(c.files[i].rank, want[i].rank);
		ck_assert_int_eq(c.files[i].part, want[i].part);
	}
	ck_assert_uint_eq(c.ntensors, 6);
	ck_assert_str_eq(c.dtypes, "BF16,F8_E4M3");
	ck_assert_uint_eq(checkpoint_rank_bytes(&c, 0), 48);
	ck_assert_uint_eq(checkpoint_rank_bytes(&c, 1), 16 + 8 + 8);
	ck_assert_uint_eq(checkpoint_rank_bytes(&c, 2), 0);
	ck_assert_uint_eq(checkpoint_rank_bytes(&c, -1), 0);
	ck_assert_str_eq(c.architecture, "LlamaForCausalLM");
	checkpoint_close(&c);

	/* A name twice on one rank. */
	write_st(at("model-rank-1-part-2.safetensors"), "w1", "BF16", 8, 0);
	expect_fail(-EINVAL, "model-rank-1-part-2.safetensors: tensor \"w1\" is also in "
		    "model-rank-1-part-0.safetensors");
}
END_TEST

START_TEST(vllm_rank_missing)
{
	write_st(at("model-rank-0-part-0.safetensors"), "w", "BF16", 8, 0);
	write_st(at("model-rank-2-part-0.safetensors"), "w", "BF16", 8, 0);
	expect_fail(-EINVAL, "rank 1 has no files");
	unlink(at("model-rank-0-part-0.safetensors"));
	expect_fail(-EINVAL, "rank 0 has no files");
}
END_TEST

START_TEST(vllm_bad_names)
{
	static const char *const bad[] = {
		"model-rank-01-part-0.safetensors",   /* rank 1 would open model-rank-1-part-* */
		"model-rank--part-0.safetensors",
		"model-rank-0-part-.safetensors",
		"model-rank-0-part-x.safetensors",
		"model-rank-0_part-0.safetensors",
		"model-rank-0-part-0.x.safetensors",
		"model-rank-+1-part-0.safetensors",
		"model-rank-1234567890-part-0.safetensors",
		"model-rank-0-part-1234567890.safetensors",
		"model-rank-4096-part-0.safetensors",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		write_st(at("%s", bad[i]), "w", "BF16", 8, 0);
		expect_fail(-EINVAL, bad[i]);
		unlink(at("%s", bad[i]));
	}
	/* Leading zeros in the part number are fine: vLLM globs part-*. */
	struct checkpoint c;
	char err[512] = "";
	write_st(at("model-rank-0-part-007.safetensors"), "w", "BF16", 8, 0);
	ck_assert_msg(open_root(&c, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(c.files[0].part, 7);
	checkpoint_close(&c);
}
END_TEST

START_TEST(mixed_layouts)
{
	write_st(at("model-rank-0-part-0.safetensors"), "w", "BF16", 8, 0);
	write_st(at("model.safetensors"), "w", "BF16", 8, 0);
	expect_fail(-EINVAL, "both sharded-state");
}
END_TEST

START_TEST(not_found)
{
	struct checkpoint c;
	char err[512] = "";

	ck_assert_int_eq(checkpoint_open("/nonexistent/artfs/checkpoint", &c, err, sizeof(err)), -ENOENT);
	ck_assert_ptr_nonnull(strstr(err, "/nonexistent/artfs/checkpoint"));
	expect_fail(-ENOENT, "no safetensors files");
	write_text(at("config.json"), "{}");
	write_text(at("model.safetensors.index.json"), "{\"weight_map\":{\"a\":\"x.safetensors\"}}");
	expect_fail(-ENOENT, "no safetensors files");
	/* A file, not a directory. */
	ck_assert_int_eq(checkpoint_open(at("config.json"), &c, err, sizeof(err)), -ENOENT);
}
END_TEST

START_TEST(bad_files)
{
	write_st(at("a.safetensors"), "x", "F16", 2, 0);
	write_text(at("b.safetensors"), "garbage!");
	expect_fail(-EINVAL, "b.safetensors: header");
	unlink(at("b.safetensors"));
	ck_assert_int_eq(mkdir(at("b.safetensors"), 0755), 0);
	expect_fail(-EINVAL, "b.safetensors: not a regular file");
	rmdir(at("b.safetensors"));
	ck_assert_int_eq(mkfifo(at("b.safetensors"), 0644), 0);
	expect_fail(-EINVAL, "b.safetensors: not a regular file");
	unlink(at("b.safetensors"));
	ck_assert_int_eq(symlink("nowhere", at("b.safetensors")), 0);
	expect_fail(-EINVAL, "b.safetensors: No such file");
}
END_TEST

/* Hugging Face caches: snapshots/<rev>/<file> -> ../../blobs/<hash>. */
START_TEST(symlinks_followed)
{
	struct checkpoint c;
	char err[512] = "";

	ck_assert_int_eq(mkdir(at("blobs"), 0755), 0);
	ck_assert_int_eq(mkdir(at("snap"), 0755), 0);
	write_st(at("blobs/1234abcd"), "w", "BF16", 8, 0);
	write_text(at("blobs/5678ef00"), "{\"architectures\":[\"Qwen2ForCausalLM\"]}");
	ck_assert_int_eq(symlink("../blobs/1234abcd", at("snap/model.safetensors")), 0);
	ck_assert_int_eq(symlink("../blobs/5678ef00", at("snap/config.json")), 0);
	ck_assert_msg(checkpoint_open(at("snap"), &c, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(c.nfiles, 1);
	ck_assert_str_eq(c.files[0].path, at("snap/model.safetensors"));
	ck_assert_str_eq(c.architecture, "Qwen2ForCausalLM");
	checkpoint_close(&c);
}
END_TEST

static void open_config(const char *config, struct checkpoint *c)
{
	char err[512] = "";

	write_text(at("config.json"), config);
	ck_assert_msg(open_root(c, err, sizeof(err)) == 0, "%s: %s", config, err);
}

START_TEST(config_and_quantization)
{
	struct checkpoint c;
	static const uint8_t zero[32];
	uint8_t fp8_hash[32];

	write_st(at("model.safetensors"), "w", "F8_E4M3", 8, 0);
	open_config("{\"architectures\":[\"LlamaForCausalLM\",\"Other\"],\"hidden_size\":8}", &c);
	ck_assert_str_eq(c.architecture, "LlamaForCausalLM");
	ck_assert_str_eq(c.quant_method, "");
	ck_assert(!c.quant_block_fp8);
	ck_assert_int_eq(memcmp(c.quant_config_sha256, zero, 32), 0);
	checkpoint_close(&c);
	open_config("{\"quantization_config\":null,\"architectures\":[]}", &c);
	ck_assert_str_eq(c.architecture, "");
	ck_assert_str_eq(c.quant_method, "");
	checkpoint_close(&c);

	/* DeepSeek-V3 style block-wise FP8. */
	open_config("{\"architectures\":[\"DeepseekV3ForCausalLM\"],\"quantization_config\":"
		    "{\"activation_scheme\":\"dynamic\",\"fmt\":\"e4m3\",\"quant_method\":\"fp8\","
		    "\"weight_block_size\":[128,128]}}", &c);
	ck_assert_str_eq(c.architecture, "DeepseekV3ForCausalLM");
	ck_assert_str_eq(c.quant_method, "fp8");
	ck_assert(c.quant_block_fp8);
	/* The hash is of the canonical (sorted, compact) text. */
	static const char canonical[] = "{\"activation_scheme\":\"dynamic\",\"fmt\":\"e4m3\","
					"\"quant_method\":\"fp8\",\"weight_block_size\":[128,128]}";
	sha256_once(canonical, strlen(canonical), fp8_hash);
	ck_assert_int_eq(memcmp(c.quant_config_sha256, fp8_hash, 32), 0);
	checkpoint_close(&c);

	/* Reordered keys and other spacing: the same hash. */
	open_config("{ \"quantization_config\" : {\n  \"weight_block_size\": [ 128, 128 ],\n"
		    "  \"quant_method\": \"fp8\",\n  \"fmt\": \"e4m3\",\n  \"activation_scheme\": \"dynamic\"\n},"
		    " \"architectures\": [\"DeepseekV3ForCausalLM\"] }", &c);
	ck_assert(c.quant_block_fp8);
	ck_assert_int_eq(memcmp(c.quant_config_sha256, fp8_hash, 32), 0);
	checkpoint_close(&c);

	/* Per-tensor FP8: not block-wise, and a different hash. */
	open_config("{\"quantization_config\":{\"quant_method\":\"fp8\",\"activation_scheme\":\"dynamic\"}}", &c);
	ck_assert_str_eq(c.quant_method, "fp8");
	ck_assert(!c.quant_block_fp8);
	ck_assert_int_ne(memcmp(c.quant_config_sha256, fp8_hash, 32), 0);
	ck_assert_int_ne(memcmp(c.quant_config_sha256, zero, 32), 0);
	checkpoint_close(&c);
	open_config("{\"quantization_config\":{\"quant_method\":\"fp8\",\"weight_block_size\":null}}", &c);
	ck_assert(!c.quant_block_fp8);
	checkpoint_close(&c);
	open_config("{\"quantization_config\":{\"quant_method\":\"awq\",\"bits\":4,\"weight_block_size\":[1,1]}}", &c);
	ck_assert_str_eq(c.quant_method, "awq");
	ck_assert(!c.quant_block_fp8);
	checkpoint_close(&c);

	static const struct { const char *config, *why; } bad[] = {
		{ "{\"quantization_config\":{\"bits\":4}}", "quant_method is not a string" },
		{ "{\"quantization_config\":{\"quant_method\":4}}", "quant_method is not a string" },
		{ "{\"quantization_config\":\"fp8\"}", "quantization_config is not an object" },
		{ "{\"architectures\":\"Llama\"}", "architectures is not a list" },
		{ "{\"architectures\":[1]}", "architectures[0] is not a string" },
		{ "{\"a\":1,\"a\":2}", "config.json: JSON" },
		{ "{\"architectures\":", "config.json: JSON" },
		{ "[]", "config.json: not a JSON object" },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		write_text(at("config.json"), bad[i].config);
		expect_fail(-EINVAL, bad[i].why);
	}
	char long_arch[300];
	snprintf(long_arch, sizeof(long_arch), "{\"architectures\":[\"%0128d\"]}", 0);
	write_text(at("config.json"), long_arch);
	expect_fail(-EINVAL, "longer than 127 bytes");
	snprintf(long_arch, sizeof(long_arch), "{\"architectures\":[\"%0127d\"]}", 0);
	open_config(long_arch, &c);
	ck_assert_uint_eq(strlen(c.architecture), 127);
	checkpoint_close(&c);
}
END_TEST

static void revision_of(uint8_t out[32])
{
	struct checkpoint c;
	char err[512] = "";

	ck_assert_msg(open_root(&c, err, sizeof(err)) == 0, "%s", err);
	memcpy(out, c.revision, 32);
	checkpoint_close(&c);
}

static uint8_t *slurp(const char *path, size_t *len)
{
	struct stat st;
	int fd = open(path, O_RDONLY);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(fstat(fd, &st), 0);
	*len = (size_t)st.st_size;
	uint8_t *buf = malloc(*len);
	ck_assert_int_eq(read(fd, buf, *len), (ssize_t)*len);
	close(fd);
	return buf;
}

static void put_be64(struct sha256 *s, uint64_t v)
{
	uint8_t b[8];
	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)(v >> (56 - 8 * i));
	sha256_update(s, b, 8);
}

START_TEST(revision)
{
	uint8_t r0[32], r1[32], want[32];
	static const char *const names[] = { "a.safetensors", "b.safetensors" };

	write_st(at("b.safetensors"), "y", "BF16", 4, 1);
	write_st(at("a.safetensors"), "x,z", "F32", 2, 1);
	revision_of(r0);

	/* By the definition: per file in name order, name, 0, be64 size,
	 * be64 N, the header. */
	struct sha256 s;
	ck_assert_int_eq(sha256_begin(&s), 0);
	for (int i = 0; i < 2; i++) {
		size_t len;
		uint8_t *buf = slurp(at("%s", names[i]), &len);
		uint64_t n = 0;
		for (int b = 7; b >= 0; b--)
			n = n << 8 | buf[b];
		sha256_update(&s, names[i], strlen(names[i]) + 1);
		put_be64(&s, len);
		put_be64(&s, n);
		sha256_update(&s, buf + 8, n);
		free(buf);
	}
	sha256_end(&s, want);
	ck_assert_int_eq(memcmp(r0, want, 32), 0);

	/* Tensor data bytes: no change. */
	write_st(at("b.safetensors"), "y", "BF16", 4, 0xee);
	revision_of(r1);
	ck_assert_int_eq(memcmp(r0, r1, 32), 0);
	/* Config and index files: no change. */
	write_text(at("config.json"), "{\"architectures\":[\"X\"]}");
	revision_of(r1);
	ck_assert_int_eq(memcmp(r0, r1, 32), 0);

	/* One header byte (a name of the same length). */
	write_st(at("b.safetensors"), "q", "BF16", 4, 1);
	revision_of(r1);
	ck_assert_int_ne(memcmp(r0, r1, 32), 0);
	/* The file size (and with it data_offsets). */
	write_st(at("b.safetensors"), "y", "BF16", 6, 1);
	revision_of(r1);
	ck_assert_int_ne(memcmp(r0, r1, 32), 0);
	/* Back as it was: the same revision again. */
	write_st(at("b.safetensors"), "y", "BF16", 4, 1);
	revision_of(r1);
	ck_assert_int_eq(memcmp(r0, r1, 32), 0);
	/* A file's name. */
	ck_assert_int_eq(rename(at("b.safetensors"), at("c.safetensors")), 0);
	revision_of(r1);
	ck_assert_int_ne(memcmp(r0, r1, 32), 0);
}
END_TEST

Suite *checkpoint_suite(void)
{
	Suite *s = suite_create("checkpoint");
	TCase *tc = tcase_create("checkpoint");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, hf_without_index);
	tcase_add_test(tc, hf_with_index);
	tcase_add_test(tc, hf_bad_index);
	tcase_add_test(tc, duplicate_names);
	tcase_add_test(tc, vllm_sharded);
	tcase_add_test(tc, vllm_rank_missing);
	tcase_add_test(tc, vllm_bad_names);
	tcase_add_test(tc, mixed_layouts);
	tcase_add_test(tc, not_found);
	tcase_add_test(tc, bad_files);
	tcase_add_test(tc, symlinks_followed);
	tcase_add_test(tc, config_and_quantization);
	tcase_add_test(tc, revision);
	suite_add_tcase(s, tc);
	return s;
}
