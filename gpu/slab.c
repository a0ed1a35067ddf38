/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <errno.h>
#include <stdio.h>
#include <unistd.h>

#include "gpu/slab.h"
#include "gpu/vmm.h"

int slab_alloc(int device, uint64_t size, void **ptr, int *fd, char *err, size_t errlen)
{
	*ptr = NULL;
	*fd = -1;
	if (size == 0 || size % ARTFS_SLAB_ALIGN) {
		snprintf(err, errlen, "slab of %llu bytes is not a multiple of 2 MiB",
			 (unsigned long long)size);
		return -EINVAL;
	}
	return vmm_create(device, size, ptr, fd, err, errlen);
}

void slab_free(void *ptr, uint64_t size, int fd)
{
	vmm_unmap(ptr, size);
	if (fd >= 0)
		close(fd);
}
