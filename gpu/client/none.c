/* SPDX-License-Identifier: Apache-2.0 */
/* libartfs built without CUDA: the same API, every GPU call ENODEV. */
#include "autoconf.h"

#include <errno.h>
#include <stdio.h>

#include "gpu/client/client_i.h"

int client_gpu_describe(int device, uint32_t *cc_major, uint32_t *cc_minor, uint32_t *driver,
			char *err, size_t errlen)
{
	(void)cc_major, (void)cc_minor, (void)driver;
	snprintf(err, errlen, "GPU %d: this libartfs was built without CUDA", device);
	return -ENODEV;
}

int client_gpu_current(void)
{
	return 0;
}

int client_gpu_import(int fd, uint64_t size, void **ptr, char *err, size_t errlen)
{
	(void)fd, (void)size;
	*ptr = NULL;
	snprintf(err, errlen, "this libartfs was built without CUDA");
	return -ENODEV;
}

void client_gpu_unmap(void *ptr, uint64_t size)
{
	(void)ptr, (void)size;
}

int client_gpu_sync(char *err, size_t errlen)
{
	snprintf(err, errlen, "this libartfs was built without CUDA");
	return -ENODEV;
}

static int no_import(int fd, uint64_t *handle, char *err, size_t errlen)
{
	(void)fd, (void)handle;
	snprintf(err, errlen, "this libartfs was built without CUDA");
	return -ENODEV;
}

static void no_release(uint64_t handle)
{
	(void)handle;
}

static int no_reserve(uint64_t size, uint64_t *va, char *err, size_t errlen)
{
	(void)size, (void)va;
	snprintf(err, errlen, "this libartfs was built without CUDA");
	return -ENODEV;
}

static void no_free(uint64_t va, uint64_t size)
{
	(void)va, (void)size;
}

static int no_map(uint64_t va, uint64_t size, uint64_t handle, char *err, size_t errlen)
{
	(void)va, (void)size, (void)handle;
	snprintf(err, errlen, "this libartfs was built without CUDA");
	return -ENODEV;
}

static const struct range_driver none_range = {
	.import = no_import, .release = no_release, .reserve = no_reserve, .free = no_free,
	.map = no_map, .unmap = no_free,
};

const struct range_driver *client_gpu_range_driver(void)
{
	return &none_range;
}
