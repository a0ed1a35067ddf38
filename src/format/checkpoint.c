/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>


#include <jansson.h>

#include "format/checkpoint.h"
#include "lib/reason.h"
#include "lib/sha256.h"

#define SUFFIX ".safetensors"
#define SHARD_PREFIX "model-rank-"
#define INDEX_NAME "model.safetensors.index.json"
#define CONFIG_NAME "config.json"

static bool has_suffix(const char *name, size_t len)
{
	size_t n = sizeof(SUFFIX) - 1;

	return len > n && memcmp(name + len - n, SUFFIX, n) == 0;
}

/* 1..9 decimal digits ending at stop; canonical: no leading zero unless
 * "0". Returns the value or -1. */
static int decimal(const char *s, char stop, bool canonical, const char **end)
{
	int v = 0, n = 0;

	while (n < 9 && s[n] >= '0' && s[n] <= '9')
		v = v * 10 + (s[n++] - '0');
	/* A tenth digit is not stop, so too long a number fails here too. */
	if (n < 1 || s[n] != stop || (canonical && s[0] == '0' && n > 1))
		return -1;
	*end = s + n;
	return v;
}

/* model-rank-<k>-part-<p>.safetensors. k is canonical because vLLM's rank
 * k opens exactly "model-rank-{k}-part-*". Returns 0 or -1. */
static int parse_shard_name(const char *name, int *rank, int *part)
{
	const char *s = name + sizeof(SHARD_PREFIX) - 1;

	*rank = decimal(s, '-', true, &s);
	if (*rank < 0 || strncmp(s, "-part-", 6) != 0)
		return -1;
	*part = decimal(s + 6, '.', false, &s);
	if (*part < 0 || strcmp(s, SUFFIX) != 0)
		return -1;
	return 0;
}

static int by_name(const void *a, const void *b)
{
	return strcmp(((const struct checkpoint_file *)a)->name,
		      ((const struct checkpoint_file *)b)->name);
}

static int by_int(const void *a, const void *b)
{
	int x = *(const int *)a, y = *(const int *)b;

	return (x > y) - (x < y);
}

static void free_file(struct checkpoint_file *f)
{
	free(f->name);
	free(f->path);
	safetensors_free(&f->st);
	memset(f, 0, sizeof(*f));
}

/* Adds the directory entry name to c->files, classified; counts it as a
 * Hugging Face or a sharded-state file. */
static int add_file(struct checkpoint *c, size_t *cap, const char *name, size_t *hf, size_t *sharded,
		    char *err, size_t errlen)
{
	if (c->nfiles == CHECKPOINT_FILES_MAX)
		return reason(-EINVAL, err, errlen, "%s: more than %d safetensors files", c->dir,
			      CHECKPOINT_FILES_MAX);
	if (c->nfiles == *cap) {
		size_t ncap = *cap ? 2 * *cap : 16;
		struct checkpoint_file *nf = realloc(c->files, ncap * sizeof(*nf));
		if (!nf)
			return reason(-ENOMEM, err, errlen, "%s: out of memory", c->dir);
		c->files = nf;
		*cap = ncap;
	}
	struct checkpoint_file *f = &c->files[c->nfiles];
	memset(f, 0, sizeof(*f));
	f->rank = f->part = -1;
	if (strncmp(name, SHARD_PREFIX, sizeof(SHARD_PREFIX) - 1) == 0) {
		if (parse_shard_name(name, &f->rank, &f->part) < 0)
			return reason(-EINVAL, err, errlen,
				      "%.256s: not a sharded-state name model-rank-<k>-part-<p>.safetensors",
				      name);
		if (f->rank >= CHECKPOINT_RANKS_MAX)
			return reason(-EINVAL, err, errlen, "%.256s: rank %d, more than %d ranks", name,
				      f->rank, CHECKPOINT_RANKS_MAX);
		(*sharded)++;
	} else {
		(*hf)++;
	}
	f->name = strdup(name);
	if (!f->name)
		return reason(-ENOMEM, err, errlen, "%s: out of memory", c->dir);
	c->nfiles++;
	return 0;
}

/* Layout B: ranks 0..R-1, each with a file; sets c->ranks to R. */
static int count_ranks(struct checkpoint *c, char *err, size_t errlen)
{
	int *ranks = malloc(c->nfiles * sizeof(*ranks));
	int rc = 0;

	if (!ranks)
		return reason(-ENOMEM, err, errlen, "%s: out of memory", c->dir);
	for (size_t i = 0; i < c->nfiles; i++)
		ranks[i] = c->files[i].rank;
	qsort(ranks, c->nfiles, sizeof(*ranks), by_int);
	int next = 0;
	for (size_t i = 0; i < c->nfiles && rc == 0; i++) {
		if (ranks[i] == next - 1)
			continue;
		if (ranks[i] != next)
			rc = reason(-EINVAL, err, errlen, "%s: rank %d has no files, rank %d has", c->dir,
				    next, ranks[i]);
		next++;
	}
	free(ranks);
	c->ranks = next;
	return rc;
}

/* Every candidate file name, classified, sorted by name; sets layout and,
 * for layout B, ranks. */
static int list_files(int dfd, struct checkpoint *c, char *err, size_t errlen)
{
	int fd = dup(dfd);
	DIR *d = fd < 0 ? NULL : fdopendir(fd);
	size_t cap = 0, hf = 0, sharded = 0;
	struct dirent *de;
	int rc = 0;

	if (!d) {
		rc = -errno;
		if (fd >= 0)
			close(fd);
		return reason(rc, err, errlen, "%s: %s", c->dir, strerror(-rc));
	}
	for (errno = 0; rc == 0 && (de = readdir(d)) != NULL; errno = 0)
		if (de->d_name[0] != '.' && has_suffix(de->d_name, strlen(de->d_name)))
			rc = add_file(c, &cap, de->d_name, &hf, &sharded, err, errlen);
	if (rc == 0 && errno)
		rc = reason(-errno, err, errlen, "%s: %s", c->dir, strerror(errno));
	else if (rc == 0 && c->nfiles == 0)
		rc = reason(-ENOENT, err, errlen, "%s: no safetensors files", c->dir);
	else if (rc == 0 && hf && sharded)
		rc = reason(-EINVAL, err, errlen,
			    "%s: both sharded-state (model-rank-*) and other safetensors files", c->dir);
	if (rc == 0) {
		qsort(c->files, c->nfiles, sizeof(*c->files), by_name);
		c->layout = sharded ? CHECKPOINT_VLLM_SHARDED : CHECKPOINT_HF;
		if (sharded)
			rc = count_ranks(c, err, errlen);
	}
	closedir(d);
	return rc;
}

/* Reads a small optional file of the directory: *buf is NULL when it does
 * not exist. */
static int read_small(int dfd, const char *name, size_t max, char **buf, size_t *len,
		      char *err, size_t errlen)
{
	struct stat st;
	int rc = 0;

	*buf = NULL;
	int fd = openat(dfd, name, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
	if (fd < 0) {
		if (errno == ENOENT)
			return 0;
		return reason(-errno, err, errlen, "%s: %s", name, strerror(errno));
	}
	if (fstat(fd, &st) < 0) {
		rc = reason(-errno, err, errlen, "%s: %s", name, strerror(errno));
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		rc = reason(-EINVAL, err, errlen, "%s: not a regular file", name);
		goto out;
	}
	if ((uint64_t)st.st_size > max) {
		rc = reason(-EINVAL, err, errlen, "%s: %lld bytes, more than %zu", name,
			  (long long)st.st_size, max);
		goto out;
	}
	*len = (size_t)st.st_size;
	*buf = malloc(*len ? *len : 1);
	if (!*buf) {
		rc = reason(-ENOMEM, err, errlen, "%s: out of memory", name);
		goto out;
	}
	for (size_t done = 0; done < *len;) {
		ssize_t r = pread(fd, *buf + done, *len - done, (off_t)done);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			rc = r < 0 ? -errno : -EIO;
			reason(rc, err, errlen, "%s: read: %s", name, strerror(-rc));
			free(*buf);
			*buf = NULL;
			goto out;
		}
		done += (size_t)r;
	}
out:
	close(fd);
	return rc;
}

/* A JSON object file, or *root NULL when it does not exist. */
static int load_json(int dfd, const char *name, size_t max, json_t **root, char *err, size_t errlen)
{
	char *buf;
	size_t len;
	json_error_t jerr;

	*root = NULL;
	int rc = read_small(dfd, name, max, &buf, &len, err, errlen);
	if (rc < 0 || !buf)
		return rc;
	*root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
	free(buf);
	if (!*root)
		return reason(-EINVAL, err, errlen, "%s: JSON: %s (line %d)", name, jerr.text, jerr.line);
	if (!json_is_object(*root)) {
		json_decref(*root);
		*root = NULL;
		return reason(-EINVAL, err, errlen, "%s: not a JSON object", name);
	}
	return 0;
}

/* Layout A with an index: keeps only the files its weight_map names, each of
 * which must be here. *weight_map (a reference into *index) is NULL when
 * there is no index. */
static int apply_index(int dfd, struct checkpoint *c, json_t **index, json_t **weight_map,
		       char *err, size_t errlen)
{
	const char *tensor;
	json_t *v;

	*weight_map = NULL;
	int rc = load_json(dfd, INDEX_NAME, CHECKPOINT_INDEX_MAX, index, err, errlen);
	if (rc < 0 || !*index)
		return rc;
	json_t *map = json_object_get(*index, "weight_map");
	if (!json_is_object(map))
		return reason(-EINVAL, err, errlen, "%s: no weight_map object", INDEX_NAME);
	if (json_object_size(map) == 0)
		return reason(-EINVAL, err, errlen, "%s: weight_map is empty", INDEX_NAME);

	bool *used = calloc(c->nfiles, sizeof(*used));
	if (!used)
		return reason(-ENOMEM, err, errlen, "%s: out of memory", INDEX_NAME);
	json_object_foreach(map, tensor, v) {
		const char *file = json_string_value(v);
		if (!file) {
			rc = reason(-EINVAL, err, errlen, "%s: weight_map[\"%.64s\"] is not a string",
				  INDEX_NAME, tensor);
			break;
		}
		struct checkpoint_file key = { .name = (char *)file };
		struct checkpoint_file *f = bsearch(&key, c->files, c->nfiles, sizeof(*c->files), by_name);
		if (!f) {
			rc = reason(-EINVAL, err, errlen,
				  "%s: weight_map puts \"%.64s\" in %.256s, which is not in the directory",
				  INDEX_NAME, tensor, file);
			break;
		}
		used[f - c->files] = true;
	}
	if (rc == 0) {
		size_t n = 0;
		for (size_t i = 0; i < c->nfiles; i++) {
			if (used[i])
				c->files[n++] = c->files[i];
			else
				free_file(&c->files[i]);
		}
		c->nfiles = n;
		*weight_map = map;
	}
	free(used);
	return rc;
}

static void put_be64(struct sha256 *s, uint64_t v)
{
	uint8_t b[8];

	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)(v >> (56 - 8 * i));
	sha256_update(s, b, sizeof(b));
}

/* Reads every header, in name order, into the revision hash. */
static int read_headers(int dfd, struct checkpoint *c, char *err, size_t errlen)
{
	struct sha256 rev;
	char why[256];
	int rc = sha256_begin(&rev);

	if (rc < 0)
		return reason(rc, err, errlen, "out of memory");
	for (size_t i = 0; i < c->nfiles && rc == 0; i++) {
		struct checkpoint_file *f = &c->files[i];
		if (asprintf(&f->path, "%s/%s", c->dir, f->name) < 0) {
			f->path = NULL;
			rc = reason(-ENOMEM, err, errlen, "%s: out of memory", f->name);
			break;
		}
		/* Follows symlinks; O_NONBLOCK so that a FIFO cannot hang us
		 * before safetensors_read refuses it. */
		int fd = openat(dfd, f->name, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
		if (fd < 0) {
			/* A dangling link is a broken checkpoint, not a missing one. */
			rc = errno == ENOENT ? -EINVAL : -errno;
			reason(rc, err, errlen, "%s: %s", f->name, strerror(errno));
			break;
		}
		rc = safetensors_read(fd, &f->st, why, sizeof(why));
		close(fd);
		if (rc < 0) {
			reason(rc, err, errlen, "%s: %s", f->name, why);
			break;
		}
		if (f->st.count > CHECKPOINT_TENSORS_MAX - c->ntensors) {
			rc = reason(-EINVAL, err, errlen, "%s: more than %d tensors in the checkpoint",
				  f->name, CHECKPOINT_TENSORS_MAX);
			break;
		}
		c->ntensors += f->st.count;
		sha256_update(&rev, f->name, strlen(f->name) + 1);
		put_be64(&rev, f->st.file_size);
		put_be64(&rev, f->st.header_len);
		sha256_update(&rev, f->st.raw + SAFETENSORS_PREFIX_LEN, (size_t)f->st.header_len);
		/* Only the revision needs the raw header; do not hold them all. */
		free(f->st.raw);
		f->st.raw = NULL;
		f->st.raw_len = 0;
	}
	if (rc == 0)
		sha256_end(&rev, c->revision);
	else
		sha256_abandon(&rev);
	return rc;
}

struct name_ref {
	const char *name;
	int rank;
	size_t file;
};

static int by_rank_name(const void *a, const void *b)
{
	const struct name_ref *x = a, *y = b;

	if (x->rank != y->rank)
		return x->rank < y->rank ? -1 : 1;
	return strcmp(x->name, y->name);
}

/* Ties by file, so that a duplicate is reported in the later file. */
static int by_rank_name_file(const void *a, const void *b)
{
	const struct name_ref *x = a, *y = b;
	int d = by_rank_name(a, b);

	return d ? d : (x->file > y->file) - (x->file < y->file);
}

/* Tensor names are unique per rank (in layout A: over all files), and with
 * an index every tensor is mapped to the file that holds it. */
static int check_names(struct checkpoint *c, json_t *weight_map, char *err, size_t errlen)
{
	struct name_ref *refs = malloc((c->ntensors ? c->ntensors : 1) * sizeof(*refs));
	size_t n = 0;
	int rc = 0;

	if (!refs)
		return reason(-ENOMEM, err, errlen, "%s: out of memory for %zu tensor names", c->dir,
			    c->ntensors);
	for (size_t i = 0; i < c->nfiles; i++)
		for (size_t t = 0; t < c->files[i].st.count; t++)
			refs[n++] = (struct name_ref){ c->files[i].st.tensors[t].name, c->files[i].rank, i };
	qsort(refs, n, sizeof(*refs), by_rank_name_file);
	for (size_t i = 1; i < n; i++)
		if (by_rank_name(&refs[i - 1], &refs[i]) == 0) {
			const char *a = c->files[refs[i - 1].file].name, *b = c->files[refs[i].file].name;
			if (a == b)  /* safetensors_parse refuses duplicate keys; cannot happen */
				rc = reason(-EINVAL, err, errlen, "%s: tensor \"%.64s\" twice", a, refs[i].name);
			else
				rc = reason(-EINVAL, err, errlen, "%s: tensor \"%.64s\" is also in %s", b,
					  refs[i].name, a);
			goto out;
		}
	for (size_t i = 0; weight_map && i < n; i++) {
		const char *file = c->files[refs[i].file].name;
		const char *mapped = json_string_value(json_object_get(weight_map, refs[i].name));
		if (!mapped) {
			rc = reason(-EINVAL, err, errlen, "%s: tensor \"%.64s\" is not in %s's weight_map",
				  file, refs[i].name, INDEX_NAME);
			goto out;
		}
		if (strcmp(mapped, file) != 0) {
			rc = reason(-EINVAL, err, errlen, "%s: tensor \"%.64s\" is mapped to %.256s in %s",
				  file, refs[i].name, mapped, INDEX_NAME);
			goto out;
		}
	}
out:
	free(refs);
	return rc;
}

static int copy_string(char *dst, size_t size, json_t *v, const char *what, char *err, size_t errlen)
{
	if (!json_is_string(v))
		return reason(-EINVAL, err, errlen, "%s: %s is not a string", CONFIG_NAME, what);
	if (json_string_length(v) >= size)
		return reason(-EINVAL, err, errlen, "%s: %s longer than %zu bytes", CONFIG_NAME, what,
			    size - 1);
	memcpy(dst, json_string_value(v), json_string_length(v) + 1);
	return 0;
}

static int read_config(int dfd, struct checkpoint *c, char *err, size_t errlen)
{
	json_t *root;
	int rc = load_json(dfd, CONFIG_NAME, CHECKPOINT_CONFIG_MAX, &root, err, errlen);

	if (rc < 0 || !root)
		return rc;
	json_t *arch = json_object_get(root, "architectures");
	if (json_array_size(arch) > 0)
		rc = copy_string(c->architecture, sizeof(c->architecture), json_array_get(arch, 0),
				 "architectures[0]", err, errlen);
	else if (arch && !json_is_null(arch) && !json_is_array(arch))
		rc = reason(-EINVAL, err, errlen, "%s: architectures is not a list", CONFIG_NAME);
	if (rc < 0)
		goto out;

	json_t *qc = json_object_get(root, "quantization_config");
	if (!qc || json_is_null(qc))
		goto out;
	if (!json_is_object(qc)) {
		rc = reason(-EINVAL, err, errlen, "%s: quantization_config is not an object", CONFIG_NAME);
		goto out;
	}
	/* Without a quant_method the checkpoint would pass for unquantized. */
	rc = copy_string(c->quant_method, sizeof(c->quant_method),
			 json_object_get(qc, "quant_method"), "quantization_config.quant_method",
			 err, errlen);
	if (rc < 0)
		goto out;
	json_t *block = json_object_get(qc, "weight_block_size");
	c->quant_block_fp8 = strcmp(c->quant_method, "fp8") == 0 && block && !json_is_null(block);
	/* Canonical text, so that key order and spacing do not matter. */
	char *text = json_dumps(qc, JSON_SORT_KEYS | JSON_COMPACT);
	if (!text) {
		rc = reason(-ENOMEM, err, errlen, "%s: out of memory", CONFIG_NAME);
		goto out;
	}
	sha256_once(text, strlen(text), c->quant_config_sha256);
	free(text);
out:
	json_decref(root);
	return rc;
}

static int by_string(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

void checkpoint_dtype_list(const bool seen[SAFETENSORS_DTYPE_COUNT], char *out, size_t size)
{
	const char *names[SAFETENSORS_DTYPE_COUNT];
	size_t n = 0, at = 0;

	for (unsigned d = 0; d < SAFETENSORS_DTYPE_COUNT; d++)
		if (seen[d])
			names[n++] = safetensors_dtype_name((enum safetensors_dtype)d);
	qsort(names, n, sizeof(*names), by_string);
	out[0] = '\0';
	for (size_t i = 0; i < n && at < size; i++)
		at += (size_t)snprintf(out + at, size - at, "%s%s", i ? "," : "", names[i]);
}

static void collect_dtypes(struct checkpoint *c)
{
	bool seen[SAFETENSORS_DTYPE_COUNT] = { false };

	for (size_t i = 0; i < c->nfiles; i++)
		for (size_t t = 0; t < c->files[i].st.count; t++)
			seen[c->files[i].st.tensors[t].dtype] = true;
	/* All 22 names and commas take 122 bytes: this never truncates. */
	checkpoint_dtype_list(seen, c->dtypes, sizeof(c->dtypes));
}

int checkpoint_open(const char *dir, struct checkpoint *c, char *err, size_t errlen)
{
	json_t *index = NULL, *weight_map = NULL;
	int rc;

	memset(c, 0, sizeof(*c));
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0) {
		rc = errno == ENOENT || errno == ENOTDIR ? -ENOENT : -errno;
		return reason(rc, err, errlen, "%s: %s", dir, strerror(errno));
	}
	c->dir = strdup(dir);
	if (!c->dir) {
		rc = reason(-ENOMEM, err, errlen, "%s: out of memory", dir);
		goto out;
	}
	rc = list_files(dfd, c, err, errlen);
	/* A sharded-state directory may carry the index of the checkpoint it
	 * was made from (vLLM's save_sharded_state.py copies *.json): it does
	 * not describe these files. */
	if (rc == 0 && c->layout == CHECKPOINT_HF)
		rc = apply_index(dfd, c, &index, &weight_map, err, errlen);
	if (rc == 0)
		rc = read_headers(dfd, c, err, errlen);
	if (rc == 0)
		rc = check_names(c, weight_map, err, errlen);
	if (rc == 0)
		rc = read_config(dfd, c, err, errlen);
	if (rc == 0)
		collect_dtypes(c);
out:
	json_decref(index);
	close(dfd);
	if (rc < 0)
		checkpoint_close(c);
	return rc;
}

void checkpoint_close(struct checkpoint *c)
{
	for (size_t i = 0; i < c->nfiles; i++)
		free_file(&c->files[i]);
	free(c->files);
	free(c->dir);
	memset(c, 0, sizeof(*c));
}

uint64_t checkpoint_rank_bytes(const struct checkpoint *c, int rank)
{
	uint64_t sum = 0;

	for (size_t i = 0; i < c->nfiles; i++) {
		const struct checkpoint_file *f = &c->files[i];
		if (f->rank != -1 && f->rank != rank)
			continue;
		/* The tensors cover the data buffer exactly (safetensors_parse). */
		if (__builtin_add_overflow(sum, f->st.file_size - f->st.data_start, &sum))
			return UINT64_MAX;
	}
	return sum;
}
