/* SPDX-License-Identifier: Apache-2.0 */
/* Checkpoint discovery (checkpoint_open) over a directory whose file names,
 * kinds (files, directories, symlinks), safetensors headers,
 * model.safetensors.index.json and config.json all come from the input.
 * The directory is this process's own, in /dev/shm, emptied every run. */
#include "autoconf.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "format/checkpoint.h"
#include "fuzz.h"

#define ENTRIES_MAX 12
#define CONTENT_MAX 2048

static const char *const tensor_names[] = {
	"w0", "w1", "lm_head.weight", "model.embed_tokens.weight", "a", "b", "__metadata__x", "w0 ",
};
#define NTENSOR_NAMES (sizeof(tensor_names) / sizeof(tensor_names[0]))

struct entry {
	char name[96];
};

static void file_name(struct fuzz_in *in, uint8_t how, char *name, size_t cap)
{
	char raw[48];

	switch (how & 7) {
	case 0:
		fz_str(in, raw, 40, '_');
		snprintf(name, cap, "%s.safetensors", raw);
		break;
	case 1: {
		uint8_t r = fz_u8(in), p = fz_u8(in);
		if (r & 0x80)
			snprintf(name, cap, "model-rank-%u-part-%u.safetensors", fz_u32(in), p);
		else
			snprintf(name, cap, "model-rank-%u-part-%u.safetensors", r % 4, p % 3);
		break;
	}
	case 2:
		snprintf(name, cap, "model-%05u-of-%05u.safetensors", fz_u8(in) % 4, 3);
		break;
	case 3:
		snprintf(name, cap, "model.safetensors.index.json");
		break;
	case 4:
		snprintf(name, cap, "config.json");
		break;
	case 5:
		fz_str(in, name, 40, '_');
		break;
	case 6:
		fz_str(in, raw, 40, '_');
		snprintf(name, cap, "model-rank-%s.safetensors", raw);
		break;
	default:
		snprintf(name, cap, ".hidden%u.safetensors", fz_u8(in) % 2);
		break;
	}
	for (char *p = name; *p; p++)
		if (*p == '/')
			*p = '_';
	if (!name[0] || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
		snprintf(name, cap, "empty.safetensors");
}

static const char *const st_dtypes[] = { "BF16", "F32", "U8", "F8_E4M3", "F4", "I64", "BOOL", "X" };

/* A safetensors file as the reference writes it, from the input: tensors
 * from the name pool, small shapes, zero data; sometimes slightly off. */
static char *synth_safetensors(struct fuzz_in *in, size_t *len)
{
	json_t *hdr = json_object();
	uint64_t off = 0;
	unsigned n = fz_u8(in) % 5;

	for (unsigned i = 0; i < n; i++) {
		uint8_t sel = fz_u8(in);
		const char *dt = st_dtypes[sel % 8];
		unsigned ndim = (sel >> 3) % 3, elems = 1;
		json_t *shape = json_array();
		for (unsigned d = 0; d < ndim; d++) {
			unsigned v = fz_u8(in) % 5;
			elems *= v;
			json_array_append_new(shape, json_integer(v));
		}
		unsigned bits = !strcmp(dt, "BF16") ? 16 : !strcmp(dt, "F32") ? 32 : !strcmp(dt, "I64") ? 64
			      : !strcmp(dt, "F4") ? 4 : 8;
		uint64_t size = (uint64_t)elems * bits / 8;
		if (sel & 0x20)
			size += 1; /* wrong span */
		json_object_set_new(hdr, tensor_names[fz_u8(in) % NTENSOR_NAMES],
				    json_pack("{s:s, s:o, s:[I,I]}", "dtype", dt, "shape", shape,
					      "data_offsets", (json_int_t)off, (json_int_t)(off + size)));
		if (!(sel & 0x40))
			off += size; /* else the next one overlaps */
	}
	if (fz_u8(in) & 1)
		json_object_set_new(hdr, "__metadata__", json_pack("{s:s}", "format", "pt"));
	char *text = json_dumps(hdr, JSON_SORT_KEYS | JSON_COMPACT);
	json_decref(hdr);
	size_t h = strlen(text), pad = (8 - h % 8) % 8, data = (size_t)off + (fz_u8(in) == 7);
	*len = 8 + h + pad + data;
	char *buf = calloc(1, *len);
	uint64_t n8 = h + pad;
	for (int i = 0; i < 8; i++)
		buf[i] = (char)(n8 >> (8 * i));
	memcpy(buf + 8, text, h);
	memset(buf + 8 + h, ' ', pad);
	free(text);
	return buf;
}

static char *synth_index(struct fuzz_in *in, const struct entry *e, size_t ne, size_t *len)
{
	json_t *map = json_object();
	unsigned n = fz_u8(in) % 6;

	for (unsigned i = 0; i < n; i++) {
		uint8_t k = fz_u8(in), f = fz_u8(in);
		json_object_set_new(map, tensor_names[k % NTENSOR_NAMES],
				    f == 0xff ? json_integer(1)
				    : json_string(ne ? e[f % ne].name : "missing.safetensors"));
	}
	json_t *root = json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)0, "weight_map", map);
	char *text = json_dumps(root, JSON_INDENT(2));
	json_decref(root);
	*len = strlen(text);
	return text;
}

static const char *const quant[] = { "fp8", "awq", "", "gptq", "compressed-tensors" };

static char *synth_config(struct fuzz_in *in, size_t *len)
{
	uint8_t sel = fz_u8(in);
	json_t *root = json_object();

	if (sel & 1)
		json_object_set_new(root, "architectures", json_pack("[s]", "LlamaForCausalLM"));
	if (sel & 2)
		json_object_set_new(root, "architectures", json_string("nope"));
	if (sel & 4) {
		json_t *qc = json_object();
		if (sel & 8)
			json_object_set_new(qc, "quant_method", json_string(quant[(sel >> 4) % 5]));
		if (sel & 0x80)
			json_object_set_new(qc, "weight_block_size", json_pack("[i,i]", 128, 128));
		json_object_set_new(root, "quantization_config", qc);
	}
	char *text = json_dumps(root, 0);
	json_decref(root);
	*len = strlen(text);
	return text;
}

static void check_checkpoint(const struct checkpoint *c, const char *dir)
{
	size_t tensors = 0;

	FZ_CHECK(c->nfiles >= 1 && c->files);
	FZ_CHECK(strcmp(c->dir, dir) == 0);
	FZ_CHECK(c->layout == CHECKPOINT_HF || c->layout == CHECKPOINT_VLLM_SHARDED);
	FZ_CHECK(c->layout == CHECKPOINT_HF ? c->ranks == 0 : c->ranks >= 1);
	for (size_t i = 0; i < c->nfiles; i++) {
		const struct checkpoint_file *f = &c->files[i];
		char path[512];
		snprintf(path, sizeof(path), "%s/%s", dir, f->name);
		FZ_CHECK(strcmp(f->path, path) == 0);
		FZ_CHECK(f->name[0] != '.');
		if (i)
			FZ_CHECK(strcmp(c->files[i - 1].name, f->name) < 0);
		if (c->layout == CHECKPOINT_HF)
			FZ_CHECK(f->rank == -1 && f->part == -1);
		else
			FZ_CHECK(f->rank >= 0 && f->rank < c->ranks && f->part >= 0);
		FZ_CHECK(f->st.raw == NULL);
		FZ_CHECK(f->st.data_start <= f->st.file_size);
		tensors += f->st.count;
	}
	FZ_CHECK(tensors == c->ntensors);
	for (int r = 0; r < c->ranks; r++) {
		bool has = false;
		for (size_t i = 0; i < c->nfiles; i++)
			has |= c->files[i].rank == r;
		FZ_CHECK(has);
	}
	/* dtypes: sorted, known, comma separated */
	char copy[sizeof(c->dtypes)], *save, *prev = NULL;
	FZ_CHECK(memchr(c->dtypes, '\0', sizeof(c->dtypes)));
	strcpy(copy, c->dtypes);
	for (char *d = strtok_r(copy, ",", &save); d; d = strtok_r(NULL, ",", &save)) {
		enum safetensors_dtype dt;
		FZ_CHECK(safetensors_dtype_from_name(d, &dt) == 0);
		FZ_CHECK(!prev || strcmp(prev, d) < 0);
		prev = d;
	}
	FZ_CHECK(memchr(c->architecture, '\0', sizeof(c->architecture)));
	FZ_CHECK(memchr(c->quant_method, '\0', sizeof(c->quant_method)));
	for (int r = -1; r <= c->ranks; r++) {
		uint64_t sum = 0;
		for (size_t i = 0; i < c->nfiles; i++)
			if (c->files[i].rank == -1 || c->files[i].rank == r)
				sum += c->files[i].st.file_size - c->files[i].st.data_start;
		FZ_CHECK(checkpoint_rank_bytes(c, r) == sum);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static char dir[300];
	struct fuzz_in in = { data, size };
	struct entry e[ENTRIES_MAX];
	size_t ne = 0;
	char path[512], err[256];

	if (!dir[0]) {
		snprintf(dir, sizeof(dir), "%s/ckpt", fz_scratch());
		FZ_CHECK(mkdir(dir, 0700) == 0);
	}
	fz_empty_dir(dir);

	unsigned count = 1 + fz_u8(&in) % ENTRIES_MAX;
	for (unsigned i = 0; i < count && in.n; i++) {
		uint8_t how = fz_u8(&in);
		file_name(&in, how, e[ne].name, sizeof(e[ne].name));
		snprintf(path, sizeof(path), "%s/%s", dir, e[ne].name);
		unsigned kind = (how >> 3) & 3, content = how >> 5;
		if (kind == 2) {
			mkdir(path, 0700);
		} else if (kind == 3) {
			uint8_t k = fz_u8(&in);
			const char *target = ne && k < 200 ? e[k % ne].name : "dangling";
			symlink(target, path);
		} else {
			char *buf = NULL;
			const uint8_t *raw;
			size_t len;
			bool json = strcmp(e[ne].name, "config.json") == 0 ||
				    strcmp(e[ne].name, "model.safetensors.index.json") == 0;
			if (content < 4) {
				len = fz_bytes(&in, CONTENT_MAX, &raw);
			} else if (!json) {
				buf = synth_safetensors(&in, &len);
				raw = (const uint8_t *)buf;
			} else if (e[ne].name[0] == 'c') {
				buf = synth_config(&in, &len);
				raw = (const uint8_t *)buf;
			} else {
				buf = synth_index(&in, e, ne, &len);
				raw = (const uint8_t *)buf;
			}
			fz_write_file(path, raw, len);
			free(buf);
		}
		ne++;
	}

	struct checkpoint c;
	memset(&c, 0x5a, sizeof(c)); /* checkpoint_open must not rely on a zeroed one */
	err[0] = '\0';
	int rc = checkpoint_open(dir, &c, err, sizeof(err));
	FZ_CHECK(rc == 0 || rc == -ENOENT || rc == -EINVAL || rc == -ENOMEM || rc == -EACCES ||
		 rc == -ELOOP || rc == -EIO);
	if (rc == 0)
		check_checkpoint(&c, dir);
	else
		FZ_CHECK(err[0] != '\0' && c.nfiles == 0 && c.files == NULL && c.dir == NULL);
	checkpoint_close(&c);
	checkpoint_close(&c);
	return 0;
}
