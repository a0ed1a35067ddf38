/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "gpu/vmm.h"

#define DEVICES_MAX 64
#define ARTFS_VMM_ALIGN (2u << 20) /* of a reserved range: the slabs' granularity */

/* The driver functions, found once. */
static struct {
	CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
			   unsigned long long);
	CUresult (*release)(CUmemGenericAllocationHandle);
	CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
	CUresult (*address_free)(CUdeviceptr, size_t);
	CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
	CUresult (*unmap)(CUdeviceptr, size_t);
	CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
	CUresult (*export_fd)(void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType,
			      unsigned long long);
	CUresult (*import_fd)(CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType);
	CUresult (*properties)(CUmemAllocationProp *, CUmemGenericAllocationHandle);
	CUresult (*error_string)(CUresult, const char **);
	bool ok;
} api;
static pthread_once_t found = PTHREAD_ONCE_INIT;

static void *entry(const char *name)
{
	enum cudaDriverEntryPointQueryResult q;
	void *f = NULL;

	if (cudaGetDriverEntryPointByVersion(name, &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
	    q != cudaDriverEntryPointSuccess)
		return NULL;
	return f;
}

static void find(void)
{
	*(void **)&api.create = entry("cuMemCreate");
	*(void **)&api.release = entry("cuMemRelease");
	*(void **)&api.reserve = entry("cuMemAddressReserve");
	*(void **)&api.address_free = entry("cuMemAddressFree");
	*(void **)&api.map = entry("cuMemMap");
	*(void **)&api.unmap = entry("cuMemUnmap");
	*(void **)&api.set_access = entry("cuMemSetAccess");
	*(void **)&api.export_fd = entry("cuMemExportToShareableHandle");
	*(void **)&api.import_fd = entry("cuMemImportFromShareableHandle");
	*(void **)&api.properties = entry("cuMemGetAllocationPropertiesFromHandle");
	*(void **)&api.error_string = entry("cuGetErrorString");
	api.ok = api.create && api.release && api.reserve && api.address_free && api.map &&
		 api.unmap && api.set_access && api.export_fd && api.import_fd && api.properties;
}

static bool have_api(char *err, size_t errlen)
{
	pthread_once(&found, find);
	if (!api.ok)
		snprintf(err, errlen, "the CUDA driver lacks the VMM functions (cuMemCreate...)");
	return api.ok;
}

static const char *why(CUresult r)
{
	const char *s = NULL;

	if (api.error_string && api.error_string(r, &s) == CUDA_SUCCESS && s)
		return s;
	return "unknown CUDA driver error";
}

/* Read-write access for device and, when peers is set, every GPU that can
 * reach it as a peer. */
static CUresult grant(CUdeviceptr va, size_t size, int device, int also, bool peers)
{
	CUmemAccessDesc d[DEVICES_MAX];
	int n = 0, count = 0;

	d[n++] = (CUmemAccessDesc){ .location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = device },
				    .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
	if (also >= 0 && also != device)
		d[n++] = (CUmemAccessDesc){ .location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = also },
					    .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
	if (peers && cudaGetDeviceCount(&count) == cudaSuccess)
		for (int i = 0; i < count && n < DEVICES_MAX; i++) {
			int can = 0;
			if (i != device && cudaDeviceCanAccessPeer(&can, i, device) == cudaSuccess && can)
				d[n++] = (CUmemAccessDesc){
					.location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = i },
					.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
		}
	cudaGetLastError();
	return api.set_access(va, size, d, (size_t)n);
}

int vmm_create(int device, uint64_t size, void **ptr, int *fd, char *err, size_t errlen)
{
	CUmemGenericAllocationHandle h = 0;
	CUdeviceptr va = 0;
	CUmemAllocationProp prop;
	int rc = -EIO;

	*ptr = NULL;
	*fd = -1;
	if (!have_api(err, errlen))
		return -ENODEV;
	if (cudaSetDevice(device) != cudaSuccess || cudaFree(NULL) != cudaSuccess) {
		snprintf(err, errlen, "GPU %d: %s", device, cudaGetErrorString(cudaGetLastError()));
		return -ENODEV;
	}
	memset(&prop, 0, sizeof(prop));
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = device;
	CUresult r = api.create(&h, size, &prop, 0);
	if (r == CUDA_ERROR_OUT_OF_MEMORY) {
		size_t free_b = 0, total_b = 0;
		cudaMemGetInfo(&free_b, &total_b);
		snprintf(err, errlen, "GPU %d lacks room: %.2f GiB needed, %.2f GiB free of %.2f GiB "
			 "(unload a version or wait for its engines to detach)", device,
			 (double)size / (1 << 30), (double)free_b / (1 << 30), (double)total_b / (1 << 30));
		return -ENOMEM;
	}
	if (r != CUDA_SUCCESS) {
		snprintf(err, errlen, "GPU %d: cuMemCreate of %llu bytes: %s", device,
			 (unsigned long long)size, why(r));
		return r == CUDA_ERROR_NOT_SUPPORTED ? -ENODEV : -EIO;
	}
	const char *step = "cuMemAddressReserve";
	r = api.reserve(&va, size, 0, 0, 0);
	if (r == CUDA_SUCCESS && (step = "cuMemMap", r = api.map(va, size, 0, h, 0)) == CUDA_SUCCESS &&
	    (step = "cuMemSetAccess", r = grant(va, size, device, -1, true)) == CUDA_SUCCESS &&
	    (step = "cuMemExportToShareableHandle",
	     r = api.export_fd(fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)) == CUDA_SUCCESS) {
		api.release(h); /* the mapping and the descriptor keep the memory */
		*ptr = (void *)(uintptr_t)va;
		return 0;
	}
	snprintf(err, errlen, "GPU %d: %s: %s", device, step, why(r));
	if (va) {
		api.unmap(va, size);
		api.address_free(va, size);
	}
	api.release(h);
	*fd = -1;
	return rc;
}

void vmm_unmap(void *ptr, uint64_t size)
{
	if (!ptr || !api.ok)
		return;
	CUdeviceptr va = (CUdeviceptr)(uintptr_t)ptr;
	api.unmap(va, size);
	api.address_free(va, size);
}

int vmm_import(int fd, uint64_t size, void **ptr, char *err, size_t errlen)
{
	CUmemGenericAllocationHandle h = 0;
	CUmemAllocationProp prop;
	CUdeviceptr va = 0;
	int current = 0;

	*ptr = NULL;
	if (!have_api(err, errlen))
		return -ENODEV;
	if (cudaGetDevice(&current) != cudaSuccess || cudaFree(NULL) != cudaSuccess) {
		snprintf(err, errlen, "no CUDA device: %s", cudaGetErrorString(cudaGetLastError()));
		return -ENODEV;
	}
	CUresult r = api.import_fd(&h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	if (r != CUDA_SUCCESS) {
		snprintf(err, errlen, "cuMemImportFromShareableHandle: %s", why(r));
		return r == CUDA_ERROR_INVALID_VALUE ? -EBADF : -EIO;
	}
	memset(&prop, 0, sizeof(prop));
	const char *step = "cuMemGetAllocationPropertiesFromHandle";
	r = api.properties(&prop, h);
	if (r == CUDA_SUCCESS && (step = "cuMemAddressReserve", r = api.reserve(&va, size, 0, 0, 0)) ==
	    CUDA_SUCCESS && (step = "cuMemMap", r = api.map(va, size, 0, h, 0)) == CUDA_SUCCESS &&
	    (step = "cuMemSetAccess", r = grant(va, size, prop.location.id, current, false)) ==
	    CUDA_SUCCESS) {
		api.release(h); /* the mapping keeps the memory */
		*ptr = (void *)(uintptr_t)va;
		return 0;
	}
	snprintf(err, errlen, "%s: %s", step, why(r));
	if (va) {
		api.unmap(va, size);
		api.address_free(va, size);
	}
	api.release(h);
	return -EIO;
}

/* ---- handles and ranges: the steps of a flip in place -------------------------- */

int vmm_handle_import(int fd, uint64_t *handle, char *err, size_t errlen)
{
	CUmemGenericAllocationHandle h = 0;

	if (!have_api(err, errlen))
		return -ENODEV;
	CUresult r = api.import_fd(&h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	if (r != CUDA_SUCCESS) {
		snprintf(err, errlen, "cuMemImportFromShareableHandle: %s", why(r));
		return r == CUDA_ERROR_INVALID_VALUE ? -EBADF : -EIO;
	}
	*handle = (uint64_t)h;
	return 0;
}

void vmm_handle_release(uint64_t handle)
{
	if (api.ok)
		api.release((CUmemGenericAllocationHandle)handle);
}

int vmm_reserve(uint64_t size, uint64_t *va, char *err, size_t errlen)
{
	CUdeviceptr p = 0;

	if (!have_api(err, errlen))
		return -ENODEV;
	if (cudaFree(NULL) != cudaSuccess) {
		snprintf(err, errlen, "no CUDA device: %s", cudaGetErrorString(cudaGetLastError()));
		return -ENODEV;
	}
	CUresult r = api.reserve(&p, size, ARTFS_VMM_ALIGN, 0, 0);
	if (r != CUDA_SUCCESS) {
		snprintf(err, errlen, "cuMemAddressReserve of %llu bytes: %s", (unsigned long long)size, why(r));
		return -EIO;
	}
	*va = (uint64_t)p;
	return 0;
}

void vmm_reserve_free(uint64_t va, uint64_t size)
{
	if (api.ok)
		api.address_free((CUdeviceptr)va, size);
}

int vmm_map_at(uint64_t va, uint64_t size, uint64_t handle, char *err, size_t errlen)
{
	CUmemAllocationProp prop;
	int current = 0;

	if (!have_api(err, errlen))
		return -ENODEV;
	memset(&prop, 0, sizeof(prop));
	cudaGetDevice(&current);
	const char *step = "cuMemGetAllocationPropertiesFromHandle";
	CUresult r = api.properties(&prop, (CUmemGenericAllocationHandle)handle);
	if (r == CUDA_SUCCESS &&
	    (step = "cuMemMap", r = api.map((CUdeviceptr)va, size, 0, (CUmemGenericAllocationHandle)handle, 0)) ==
	    CUDA_SUCCESS) {
		step = "cuMemSetAccess";
		r = grant((CUdeviceptr)va, size, prop.location.id, current, false);
		if (r == CUDA_SUCCESS)
			return 0;
		api.unmap((CUdeviceptr)va, size);
	}
	snprintf(err, errlen, "%s: %s", step, why(r));
	return -EIO;
}

void vmm_unmap_at(uint64_t va, uint64_t size)
{
	if (api.ok)
		api.unmap((CUdeviceptr)va, size);
}
