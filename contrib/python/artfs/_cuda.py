# SPDX-License-Identifier: Apache-2.0
"""The CUDA driver (libcuda) through ctypes: what artfs.weights needs to map
the daemon's slabs (CUDA VMM allocations) from their descriptors. The driver
is loaded, and torch imported for its primary context, on the first call of
_driver(), so that `import artfs` works without either.
"""
from __future__ import annotations

import ctypes
import errno


class _Loc(ctypes.Structure):        # CUmemLocation
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _Prop(ctypes.Structure):       # CUmemAllocationProp
    _fields_ = [("type", ctypes.c_int), ("handle_types", ctypes.c_int), ("location", _Loc),
                ("win32", ctypes.c_void_p), ("flags", ctypes.c_ubyte * 8)]


class _Access(ctypes.Structure):     # CUmemAccessDesc
    _fields_ = [("location", _Loc), ("flags", ctypes.c_int)]


_CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1
_CU_MEM_LOCATION_TYPE_DEVICE = 1
_CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3


class _Driver:
    """The CUDA driver (libcuda) through ctypes: what mapping a slab's
    descriptor takes (cuMemImportFromShareableHandle, cuMemMap...)."""

    def __init__(self) -> None:
        import torch
        torch.cuda.init()  # the primary context the driver calls work in
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise OSError(errno.ENODEV, f"no CUDA driver library: {e}") from None
        u64, vp, sz = ctypes.c_ulonglong, ctypes.c_void_p, ctypes.c_size_t
        lib = self.lib
        for name, args in (("cuMemImportFromShareableHandle", [ctypes.POINTER(u64), vp, ctypes.c_int]),
                           ("cuMemGetAllocationPropertiesFromHandle", [ctypes.POINTER(_Prop), u64]),
                           ("cuMemAddressReserve", [ctypes.POINTER(u64), sz, sz, u64, u64]),
                           ("cuMemAddressFree", [u64, sz]),
                           ("cuMemMap", [u64, sz, sz, u64, u64]),
                           ("cuMemUnmap", [u64, sz]),
                           ("cuMemSetAccess", [u64, sz, ctypes.POINTER(_Access), sz]),
                           ("cuMemRelease", [u64]),
                           ("cuCtxGetDevice", [ctypes.POINTER(ctypes.c_int)]),
                           ("cuDriverGetVersion", [ctypes.POINTER(ctypes.c_int)])):
            fn = getattr(lib, name)
            fn.argtypes = args
            fn.restype = ctypes.c_int

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise OSError(errno.EIO, f"{what} failed (CUresult {rc})")

    def driver_version(self) -> int:
        v = ctypes.c_int()
        self._check(self.lib.cuDriverGetVersion(ctypes.byref(v)), "cuDriverGetVersion")
        return v.value

    def import_fd(self, fd: int, size: int) -> int:
        """Maps the slab of a descriptor read-write on this thread's device
        (and the slab's own); the mapping keeps the memory."""
        lib = self.lib
        h = ctypes.c_ulonglong()
        self._check(lib.cuMemImportFromShareableHandle(ctypes.byref(h), ctypes.c_void_p(fd),
                                                       _CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                    "cuMemImportFromShareableHandle")
        va = ctypes.c_ulonglong()
        try:
            prop = _Prop()
            self._check(lib.cuMemGetAllocationPropertiesFromHandle(ctypes.byref(prop), h),
                        "cuMemGetAllocationPropertiesFromHandle")
            self._check(lib.cuMemAddressReserve(ctypes.byref(va), size, 0, 0, 0), "cuMemAddressReserve")
            try:
                self._check(lib.cuMemMap(va, size, 0, h, 0), "cuMemMap")
                try:
                    dev = ctypes.c_int()
                    self._check(lib.cuCtxGetDevice(ctypes.byref(dev)), "cuCtxGetDevice")
                    devices = sorted({prop.location.id, dev.value})
                    access = (_Access * len(devices))(*[
                        _Access(_Loc(_CU_MEM_LOCATION_TYPE_DEVICE, d),
                                _CU_MEM_ACCESS_FLAGS_PROT_READWRITE) for d in devices])
                    self._check(lib.cuMemSetAccess(va, size, access, len(devices)), "cuMemSetAccess")
                except BaseException:
                    lib.cuMemUnmap(va, size)  # the mapping would keep the memory
                    raise
            except BaseException:
                lib.cuMemAddressFree(va, size)
                raise
        finally:
            lib.cuMemRelease(h)
        return int(va.value)

    def unmap(self, ptr: int, size: int) -> None:
        self.lib.cuMemUnmap(ctypes.c_ulonglong(ptr), size)
        self.lib.cuMemAddressFree(ctypes.c_ulonglong(ptr), size)

    # ---- the steps of a flip in place (artfs._range) ----------------------------------

    def import_handle(self, fd: int) -> int:
        """The allocation of a descriptor, imported and kept as a handle."""
        h = ctypes.c_ulonglong()
        self._check(self.lib.cuMemImportFromShareableHandle(ctypes.byref(h), ctypes.c_void_p(fd),
                                                            _CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                    "cuMemImportFromShareableHandle")
        return int(h.value)

    def release(self, handle: int) -> None:
        self.lib.cuMemRelease(ctypes.c_ulonglong(handle))

    def reserve(self, size: int) -> int:
        va = ctypes.c_ulonglong()
        self._check(self.lib.cuMemAddressReserve(ctypes.byref(va), size, 2 << 20, 0, 0),
                    "cuMemAddressReserve")
        return int(va.value)

    def free(self, va: int, size: int) -> None:
        self.lib.cuMemAddressFree(ctypes.c_ulonglong(va), size)

    def map(self, va: int, size: int, handle: int) -> None:
        """Maps handle at va read-write for this thread's device and the
        allocation's own; nothing stays mapped on failure."""
        lib = self.lib
        prop = _Prop()
        self._check(lib.cuMemGetAllocationPropertiesFromHandle(ctypes.byref(prop), ctypes.c_ulonglong(handle)),
                    "cuMemGetAllocationPropertiesFromHandle")
        self._check(lib.cuMemMap(ctypes.c_ulonglong(va), size, 0, ctypes.c_ulonglong(handle), 0), "cuMemMap")
        try:
            dev = ctypes.c_int()
            self._check(lib.cuCtxGetDevice(ctypes.byref(dev)), "cuCtxGetDevice")
            devices = sorted({prop.location.id, dev.value})
            access = (_Access * len(devices))(*[
                _Access(_Loc(_CU_MEM_LOCATION_TYPE_DEVICE, d), _CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
                for d in devices])
            self._check(lib.cuMemSetAccess(ctypes.c_ulonglong(va), size, access, len(devices)),
                        "cuMemSetAccess")
        except BaseException:
            lib.cuMemUnmap(ctypes.c_ulonglong(va), size)
            raise

    def unmap_at(self, va: int, size: int) -> None:
        self.lib.cuMemUnmap(ctypes.c_ulonglong(va), size)


_DRIVER: _Driver | None = None


def _driver() -> _Driver:
    global _DRIVER
    if _DRIVER is None:
        _DRIVER = _Driver()
    return _DRIVER
