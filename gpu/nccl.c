/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "gpu/nccl.h"

#ifdef HAVE_NCCL
#include <nccl.h>

static struct {
	void *lib;
	ncclResult_t (*comm_init_all)(ncclComm_t *, int, const int *);
	ncclResult_t (*comm_destroy)(ncclComm_t);
	ncclResult_t (*group_start)(void);
	ncclResult_t (*group_end)(void);
	ncclResult_t (*broadcast)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t,
				  cudaStream_t);
	const char *(*error_string)(ncclResult_t);
} api;
static pthread_once_t api_once = PTHREAD_ONCE_INIT;
static char api_error[256];

static void api_load(void)
{
	const char *names[] = { "libnccl.so.2", "libnccl.so" };

	for (size_t i = 0; i < 2 && !api.lib; i++)
		api.lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
	if (!api.lib) {
		snprintf(api_error, sizeof(api_error), "cannot load NCCL: %s", dlerror());
		return;
	}
	*(void **)&api.comm_init_all = dlsym(api.lib, "ncclCommInitAll");
	*(void **)&api.comm_destroy = dlsym(api.lib, "ncclCommDestroy");
	*(void **)&api.group_start = dlsym(api.lib, "ncclGroupStart");
	*(void **)&api.group_end = dlsym(api.lib, "ncclGroupEnd");
	*(void **)&api.broadcast = dlsym(api.lib, "ncclBroadcast");
	*(void **)&api.error_string = dlsym(api.lib, "ncclGetErrorString");
	if (!api.comm_init_all || !api.comm_destroy || !api.group_start || !api.group_end ||
	    !api.broadcast || !api.error_string) {
		snprintf(api_error, sizeof(api_error), "NCCL lacks a needed symbol");
		dlclose(api.lib);
		api.lib = NULL;
	}
}

struct nccl_group {
	int n;
	ncclComm_t comms[];
};

int nccl_open(const int *devs, int n, struct nccl_group **out, char *err, size_t errlen)
{
	pthread_once(&api_once, api_load);
	if (!api.lib) {
		snprintf(err, errlen, "%s", api_error);
		return -ENOSYS;
	}
	struct nccl_group *g = calloc(1, sizeof(*g) + (size_t)n * sizeof(ncclComm_t));
	if (!g)
		return -ENOMEM;
	g->n = n;
	ncclResult_t r = api.comm_init_all(g->comms, n, devs);
	if (r != ncclSuccess) {
		snprintf(err, errlen, "ncclCommInitAll: %s", api.error_string(r));
		free(g);
		return -EIO;
	}
	*out = g;
	return 0;
}

int nccl_broadcast(struct nccl_group *g, void *const *bufs, size_t off, size_t len,
		   cudaStream_t *streams, char *err, size_t errlen)
{
	ncclResult_t r = api.group_start();

	for (int i = 0; i < g->n && r == ncclSuccess; i++)
		r = api.broadcast((char *)bufs[0] + off, (char *)bufs[i] + off, len, ncclUint8, 0,
				  g->comms[i], streams[i]);
	ncclResult_t end = api.group_end();
	if (r == ncclSuccess)
		r = end;
	if (r != ncclSuccess) {
		snprintf(err, errlen, "ncclBroadcast: %s", api.error_string(r));
		return -EIO;
	}
	return 0;
}

void nccl_close(struct nccl_group *g)
{
	if (!g)
		return;
	for (int i = 0; i < g->n; i++)
		api.comm_destroy(g->comms[i]);
	free(g);
}

#else /* built without NCCL: replicated loads copy from host memory */

int nccl_open(const int *devs, int n, struct nccl_group **out, char *err, size_t errlen)
{
	snprintf(err, errlen, "this artfs was built without NCCL");
	return -ENOSYS;
}

int nccl_broadcast(struct nccl_group *g, void *const *bufs, size_t off, size_t len,
		   cudaStream_t *streams, char *err, size_t errlen)
{
	return -ENOSYS;
}

void nccl_close(struct nccl_group *g)
{
}

#endif
