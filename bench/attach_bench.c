/* SPDX-License-Identifier: Apache-2.0 */
/* attach_bench: time from process start to every tensor of a preloaded
 * rank usable, through libartfs (ioctl, the slabs from .artfs/attach, their
 * mapping, the manifest).
 *
 *   attach_bench <mount> <wv> <checkpoint-dir> [rank] [tp_size] [runs]
 *
 * Each run is a fresh process (fork + exec of this program with --child);
 * the parent times fork to exit, the child reports its phases. */
#include "autoconf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "artfs/client.h"

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int child(const char *mount, const char *wv, const char *ckpt, int rank, int tp)
{
	double t0 = now();
	char err[512];
	struct artfs_fingerprint fp;
	struct artfs_weights *w;

	if (cudaSetDevice(rank) != cudaSuccess || cudaFree(0) != cudaSuccess) {
		fprintf(stderr, "no CUDA device %d\n", rank);
		return 1;
	}
	double t_ctx = now();
	if (artfs_fingerprint(ckpt, tp, tp == 1 ? 0 : rank, rank, &fp, err, sizeof(err)) < 0) {
		fprintf(stderr, "fingerprint: %s\n", err);
		return 1;
	}
	double t_fp = now();
	if (artfs_weights_attach(mount, wv, rank, &fp, &w, err, sizeof(err)) < 0) {
		fprintf(stderr, "attach: %s\n", err);
		return 1;
	}
	double t_attach = now();
	/* Usable: one byte from the first and the last tensor reaches the host. */
	size_t n = artfs_weights_count(w);
	uint64_t bytes = 0;
	unsigned char probe[2];
	for (size_t i = 0; i < n; i++)
		bytes += artfs_weights_tensor(w, i)->size;
	for (size_t i = 0; i < n; i += n - 1 ? n - 1 : 1) {
		const struct artfs_tensor *t = artfs_weights_tensor(w, i);
		if (t->size && cudaMemcpy(probe, t->data, 1, cudaMemcpyDeviceToHost) != cudaSuccess) {
			fprintf(stderr, "tensor %s is not readable\n", t->name);
			return 1;
		}
		if (n == 1)
			break;
	}
	double t_done = now();
	printf("{\"tensors\": %zu, \"bytes\": %llu, \"context_s\": %.4f, \"fingerprint_s\": %.4f, "
	       "\"attach_s\": %.4f, \"probe_s\": %.4f, \"in_process_s\": %.4f}\n",
	       n, (unsigned long long)bytes, t_ctx - t0, t_fp - t_ctx, t_attach - t_fp,
	       t_done - t_attach, t_done - t0);
	fflush(stdout);
	artfs_weights_detach(w);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 2 && strcmp(argv[argc - 1], "--child") == 0)
		return child(argv[1], argv[2], argv[3], atoi(argv[4]), atoi(argv[5]));
	if (argc < 4) {
		fprintf(stderr, "usage: %s <mount> <wv> <checkpoint-dir> [rank] [tp_size] [runs]\n", argv[0]);
		return 2;
	}
	const char *rank = argc > 4 ? argv[4] : "0", *tp = argc > 5 ? argv[5] : "1";
	int runs = argc > 6 ? atoi(argv[6]) : 5;
	for (int i = 0; i < runs; i++) {
		double t0 = now();
		pid_t pid = fork();
		if (pid == 0) {
			execl("/proc/self/exe", argv[0], argv[1], argv[2], argv[3], rank, tp, "--child",
			      (char *)NULL);
			_exit(127);
		}
		int status;
		waitpid(pid, &status, 0);
		double total = now() - t0;
		if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
			fprintf(stderr, "run %d failed\n", i);
			return 1;
		}
		printf("run %d: process start to every tensor usable: %.4f s\n", i, total);
		fflush(stdout);
	}
	return 0;
}
