/* SPDX-License-Identifier: Apache-2.0 */
/* flip_bench: libartfs's flip in place on a GPU (issue #38), timed.
 *
 *   flip_bench <mount> <checkpoint-dir> <wv1> <wv2> <wv-other> <its-dir> [flips]
 *
 * Attaches wv1 in place (a range reserved by libartfs), prints the first
 * tensor's address and the sum of its bytes, flips to wv2 and back `flips`
 * times (each timed), checks that no address changed, then asks for a flip
 * to wv-other (another layout: EXDEV expected) and checks that the version
 * before is still mapped. wv1 and wv2 are loads of checkpoints with the
 * same headers, so one fingerprint (of checkpoint-dir) serves both. */
#include "autoconf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "artfs/client.h"

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The sum of the bytes of t, read back to the host. */
static unsigned long long byte_sum(const struct artfs_tensor *t)
{
	unsigned char *h = malloc(t->size);
	unsigned long long s = 0;

	if (!h || cudaMemcpy(h, t->data, t->size, cudaMemcpyDeviceToHost) != cudaSuccess) {
		fprintf(stderr, "cudaMemcpy failed\n");
		exit(1);
	}
	for (uint64_t i = 0; i < t->size; i++)
		s += h[i];
	free(h);
	return s;
}

int main(int argc, char **argv)
{
	char err[512];
	struct artfs_fingerprint fp;
	struct artfs_weights *w;

	if (argc < 7) {
		fprintf(stderr, "usage: flip_bench <mount> <checkpoint-dir> <wv1> <wv2> <wv-other> <its-dir> "
			"[flips]\n");
		return 2;
	}
	const char *mount = argv[1], *ckpt = argv[2], *v[2] = { argv[3], argv[4] }, *other = argv[5];
	int flips = argc > 7 ? atoi(argv[7]) : 20;
	struct artfs_fingerprint ofp;
	if (cudaSetDevice(0) != cudaSuccess || cudaFree(0) != cudaSuccess) {
		fprintf(stderr, "no CUDA device\n");
		return 1;
	}
	int rc = artfs_fingerprint(ckpt, 1, 0, 0, &fp, err, sizeof(err));
	if (rc == 0)
		rc = artfs_weights_attach_at(mount, v[0], 0, &fp, NULL, 0, &w, err, sizeof(err));
	if (rc < 0) {
		fprintf(stderr, "attach: %s\n", err);
		return 1;
	}
	const struct artfs_tensor *t = artfs_weights_tensor(w, 0);
	void *at = t->data;
	printf("ATTACHED %s %p %llu\n", t->name, at, byte_sum(t));
	double best = 1e9, total = 0;
	for (int i = 0; i < flips; i++) {
		double t0 = now();
		rc = artfs_weights_flip(w, v[(i + 1) % 2], &fp, err, sizeof(err));
		double dt = now() - t0;
		if (rc < 0) {
			fprintf(stderr, "flip %d: %s\n", i, err);
			return 1;
		}
		best = dt < best ? dt : best;
		total += dt;
		if (i < 2)
			printf("FLIPPED %s %p %llu\n", v[(i + 1) % 2], artfs_weights_tensor(w, 0)->data,
			       byte_sum(artfs_weights_tensor(w, 0)));
	}
	printf("TIMES %d flips, best %.3f ms, mean %.3f ms, same address %d\n", flips, best * 1e3,
	       total / flips * 1e3, artfs_weights_tensor(w, 0)->data == at);
	rc = artfs_fingerprint(argv[6], 1, 0, 0, &ofp, err, sizeof(err));
	if (rc == 0)
		rc = artfs_weights_flip(w, other, &ofp, err, sizeof(err));
	printf("OTHER %d %s\n", -rc, err);
	printf("INTACT %llu\n", byte_sum(artfs_weights_tensor(w, 0)));
	artfs_weights_detach(w);
	return 0;
}
