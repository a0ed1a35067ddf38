/* SPDX-License-Identifier: Apache-2.0 */
/* The GPU backend of a build without CUDA: the same functions as gpu/, each
 * saying that there is no GPU support, so the core never needs #ifdef. */
#include "autoconf.h"

#include <errno.h>
#include <stdio.h>
#include <unistd.h>

#include "gpu/gpu.h"

int gpu_devices(struct gpu_device *out, int cap, char *err, size_t errlen)
{
	(void)out, (void)cap;
	snprintf(err, errlen, "this artfs was built without GPU support");
	return -ENODEV;
}

int gpu_load(struct gpu_load *l, char *err, size_t errlen)
{
	(void)l;
	snprintf(err, errlen, "built without GPU support");
	return -ENODEV;
}

/* Only slabs taken over from a daemon with GPU support can be here: their
 * descriptors. */
void gpu_unload(struct gpu_load *l)
{
	for (int r = 0; r < l->nranks; r++)
		if (l->ranks[r].fd >= 0) {
			close(l->ranks[r].fd);
			l->ranks[r].fd = -1;
		}
}

int gpu_alloc(struct gpu_load *l, char *err, size_t errlen)
{
	(void)l;
	snprintf(err, errlen, "built without GPU support");
	return -ENODEV;
}

int gpu_publish(struct gpu_publish *p, char *err, size_t errlen)
{
	(void)p;
	snprintf(err, errlen, "this artfs was built without GPU support");
	return -ENODEV;
}

void gpu_warmup_start(unsigned delay_ms)
{
	(void)delay_ms;
}

void gpu_warmup_stop(void)
{
}
