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
