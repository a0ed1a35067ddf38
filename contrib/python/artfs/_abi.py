# SPDX-License-Identifier: Apache-2.0
"""The structs of include/artfs/artfs.h as Python packs them, without I/O:
the attach ioctl's argument and the attach socket's messages (attach ABI 2),
and the blob that <wv>/weights/.publish takes (DESIGN.md §4.3). artfs.weights
sends them; its names stay importable from there.
"""
from __future__ import annotations

import struct
from typing import Any

# ---- the ABI of artfs/artfs.h -----------------------------------------------------
ABI_VERSION = 2
SLABS_MAX = 16
TOKEN_SIZE = 32
SLABS_MAGIC = 0x534C5441
_FP = struct.Struct("<128s64s32s32s256sIIIIII")       # struct artfs_fingerprint
_ATTACH_HEAD = struct.Struct("<II")
LAYOUT_SIZE = 32                                         # SHA-256 of a rank's layout
_ATTACH_OUT = struct.Struct(f"<16sIIQ{SLABS_MAX}Q{TOKEN_SIZE}s{LAYOUT_SIZE}s")
ATTACH_SIZE = _ATTACH_HEAD.size + _FP.size + _ATTACH_OUT.size
assert ATTACH_SIZE == 768
_SLABS_REQUEST = struct.Struct(f"<II{TOKEN_SIZE}s")       # struct artfs_slabs_request
_SLABS_REPLY = struct.Struct(f"<IiII{SLABS_MAX}Q")       # struct artfs_slabs_reply
_IOC_WRITE, _IOC_READ = 1, 2
IOC_ATTACH = ((_IOC_READ | _IOC_WRITE) << 30) | (ATTACH_SIZE << 16) | (0xA7 << 8) | 2

Fingerprint = dict[str, Any]
"""What fingerprint() returns and attach_weights(expect=...) takes."""


def _unpack_attach(buf: bytes) -> tuple[int, list[int], bytes, bytes]:
    """The reply part of an attach: slab count, slab sizes, token, layout
    digest (32 zero bytes from a daemon before layouts)."""
    out = _ATTACH_OUT.unpack_from(buf, _ATTACH_HEAD.size + _FP.size)
    count = out[2]
    return count, list(out[4:4 + SLABS_MAX]), out[4 + SLABS_MAX], out[5 + SLABS_MAX]


def _pack_attach(fp: Fingerprint) -> bytearray:
    head = _ATTACH_HEAD.pack(ABI_VERSION, 0)
    fpb = _FP.pack(fp["architecture"].encode(), fp["quant_method"].encode(),
                   fp["quant_config_sha256"], fp["revision"], fp["dtypes"].encode(),
                   fp["tp_size"], fp["tp_rank"], fp["cc_major"], fp["cc_minor"],
                   fp["driver_version"], 0)
    return bytearray(head + fpb + b"\0" * (ATTACH_SIZE - len(head) - len(fpb)))


# ---- GPU-direct publish (DESIGN.md §4.3; the blob of artfs/artfs.h) ---------------------

PUBLISH_MAGIC = 0x50545241
PUBLISH_ABI = 1
PUBLISH_NAME_MAX = 256
_PUB_HEAD = struct.Struct("<IIIIIIIIiI16s128s64s8s")   # struct artfs_publish_header
_PUB_TENSOR = struct.Struct("<256s16sII8QQQ")          # struct artfs_publish_tensor
assert _PUB_HEAD.size == 256 and _PUB_TENSOR.size == 360


class PublishTensor:
    """One tensor of a publish: its bytes are `size` bytes at `offset` in the
    allocation of IPC handle number `handle`."""

    __slots__ = ("name", "dtype", "shape", "handle", "offset", "size")

    def __init__(self, name: str, dtype: str, shape: tuple[int, ...], handle: int, offset: int,
                 size: int) -> None:
        self.name, self.dtype, self.shape = name, dtype, tuple(shape)
        self.handle, self.offset, self.size = handle, offset, size


def pack_publish(handles: list[bytes], tensors: list[PublishTensor], source_uuid: bytes,
                 rank: int = 0, tp_size: int = 1, target_device: int = -1,
                 architecture: str = "", quant_method: str = "") -> bytes:
    """The blob that <wv>/weights/.publish takes (include/artfs/artfs.h)."""
    head = _PUB_HEAD.pack(PUBLISH_MAGIC, PUBLISH_ABI, _PUB_HEAD.size, _PUB_TENSOR.size,
                          len(handles), len(tensors), rank, tp_size, target_device, 0,
                          bytes(source_uuid)[:16], architecture.encode()[:127],
                          quant_method.encode()[:63], b"")
    parts = [head] + [bytes(h).ljust(64, b"\0")[:64] for h in handles]
    for t in tensors:
        name = t.name.encode()
        if not 0 < len(name) < PUBLISH_NAME_MAX:
            raise ValueError(f"tensor name of {len(name)} bytes: 1..{PUBLISH_NAME_MAX - 1} are allowed")
        shape = list(t.shape) + [0] * (8 - len(t.shape))
        parts.append(_PUB_TENSOR.pack(name, t.dtype.encode(), len(t.shape), t.handle, *shape,
                                      t.offset, t.size))
    return b"".join(parts)
