"""Preloaded GPU weights (DESIGN.md §4.2): torch tensors that alias the
daemon's slabs through CUDA IPC handles, without a copy.

attach_weights falls back to loading the checkpoint from disk only when no
artfs mount is present; every other failure raises (fail closed).
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import hashlib
import json
import os
import re
import struct
from typing import TYPE_CHECKING, Any, Callable

from .mount import is_artfs_mount, mount_point

if TYPE_CHECKING:
    import torch

__all__ = ["fingerprint", "attach_weights", "AttachedWeights", "manifest_fingerprint",
           "PublishTensor", "pack_publish", "publish_blob"]

# ---- the ABI of artfs/artfs.h -----------------------------------------------------
ABI_VERSION = 1
SLABS_MAX = 16
_FP = struct.Struct("<128s64s32s32s256sIIIIII")       # struct artfs_fingerprint
_SLAB = struct.Struct("<64sQ")                          # struct artfs_slab
_ATTACH_HEAD = struct.Struct("<II")
_ATTACH_OUT = struct.Struct("<16sIIQ")
ATTACH_SIZE = _ATTACH_HEAD.size + _FP.size + _ATTACH_OUT.size + SLABS_MAX * _SLAB.size
_IOC_WRITE, _IOC_READ = 1, 2
IOC_ATTACH = ((_IOC_READ | _IOC_WRITE) << 30) | (ATTACH_SIZE << 16) | (0xA7 << 8) | 1

# safetensors dtype -> torch dtype name
_TORCH_DTYPES = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16",
    "I32": "int32", "U32": "uint32", "I64": "int64", "U64": "uint64", "F16": "float16",
    "BF16": "bfloat16", "F32": "float32", "F64": "float64", "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2", "C64": "complex64",
}

Fingerprint = dict[str, Any]
"""What fingerprint() returns and attach_weights(expect=...) takes."""


# ---- fingerprints ---------------------------------------------------------------------

def _jansson_compact(value: Any) -> str:
    """JSON as jansson's json_dumps(JSON_SORT_KEYS | JSON_COMPACT) writes it,
    so that the quantization config hashes as the daemon hashes it."""
    if isinstance(value, dict):
        return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + _jansson_compact(value[k])
                              for k in sorted(value)) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_jansson_compact(v) for v in value) + "]"
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, float):
        text = "%.17g" % value
        return text if any(c in text for c in ".eEn") else text + ".0"
    return json.dumps(value, ensure_ascii=False)


_SHARD = re.compile(r"^model-rank-(0|[1-9][0-9]*)-part-([0-9]{1,9})\.safetensors$")


def _checkpoint_files(checkpoint_dir: str) -> tuple[list[str], str]:
    names = sorted(n for n in os.listdir(checkpoint_dir)
                   if n.endswith(".safetensors") and not n.startswith("."))
    if any(_SHARD.match(n) for n in names):
        return names, "vllm-sharded"
    index = os.path.join(checkpoint_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            names = sorted(set(json.load(f)["weight_map"].values()))
    return names, "huggingface"


def _header(path: str) -> tuple[int, bytes, int]:
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return n, f.read(n), os.fstat(f.fileno()).st_size


_Runtime = dict[str, Callable[..., Any]]
_RUNTIME: _Runtime | None = None


def _cupy_runtime() -> _Runtime:
    import cupy
    rt = cupy.cuda.runtime
    return {"driver_version": rt.driverGetVersion,
            "ipc_open": lambda h: rt.ipcOpenMemHandle(h, rt.cudaIpcMemLazyEnablePeerAccess),
            "ipc_close": rt.ipcCloseMemHandle}


def _ctypes_runtime() -> _Runtime:
    """The libcudart torch loaded, through ctypes."""
    import torch  # noqa: F401  (loads libcudart into the process)
    found = None
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            found = ctypes.CDLL(name)
            break
        except OSError:
            continue
    if found is None:
        raise OSError(errno.ENODEV, "no CUDA runtime library found")
    lib = found

    class Handle(ctypes.Structure):  # cudaIpcMemHandle_t, passed by value
        _fields_ = [("reserved", ctypes.c_ubyte * 64)]

    lib.cudaIpcOpenMemHandle.argtypes = [ctypes.POINTER(ctypes.c_void_p), Handle, ctypes.c_uint]
    lib.cudaIpcOpenMemHandle.restype = ctypes.c_int
    lib.cudaIpcCloseMemHandle.argtypes = [ctypes.c_void_p]
    lib.cudaDriverGetVersion.argtypes = [ctypes.POINTER(ctypes.c_int)]

    def driver_version() -> int:
        v = ctypes.c_int()
        lib.cudaDriverGetVersion(ctypes.byref(v))
        return v.value

    def ipc_open(h: bytes) -> int:
        ptr = ctypes.c_void_p()
        rc = lib.cudaIpcOpenMemHandle(ctypes.byref(ptr), Handle.from_buffer_copy(bytes(h)), 1)
        if rc != 0:
            raise OSError(errno.EIO, f"cudaIpcOpenMemHandle failed (cudaError {rc})")
        return int(ptr.value or 0)

    def ipc_close(ptr: int) -> None:
        lib.cudaIpcCloseMemHandle(ctypes.c_void_p(ptr))

    return {"driver_version": driver_version, "ipc_open": ipc_open, "ipc_close": ipc_close}


def _cuda_runtime() -> _Runtime:
    """CUDA runtime calls: cupy's, else the libcudart torch loaded through
    ctypes ($ARTFS_CUDA_RUNTIME=ctypes forces the latter)."""
    global _RUNTIME
    if _RUNTIME is None:
        if os.environ.get("ARTFS_CUDA_RUNTIME") == "ctypes":
            _RUNTIME = _ctypes_runtime()
        else:
            try:
                _RUNTIME = _cupy_runtime()
            except ImportError:
                _RUNTIME = _ctypes_runtime()
    return _RUNTIME


def fingerprint(checkpoint_dir: str, tp_size: int = 1, tp_rank: int = 0,
                device: int = 0) -> Fingerprint:
    """What an engine on `device` expects of the checkpoint (DESIGN.md §4.2),
    computed as the daemon computes it."""
    import torch
    names, _ = _checkpoint_files(checkpoint_dir)
    rev = hashlib.sha256()
    dtypes = set()
    for name in names:
        n, header, size = _header(os.path.join(checkpoint_dir, name))
        rev.update(name.encode() + b"\0" + struct.pack(">QQ", size, n) + header)
        for key, entry in json.loads(header).items():
            if key != "__metadata__":
                dtypes.add(entry["dtype"])
    arch, quant, quant_sha = "", "", b"\0" * 32
    config = os.path.join(checkpoint_dir, "config.json")
    if os.path.exists(config):
        with open(config) as f:
            cfg = json.load(f)
        arch = (cfg.get("architectures") or [""])[0] or ""
        qc = cfg.get("quantization_config")
        if isinstance(qc, dict):
            quant = qc.get("quant_method", "")
            quant_sha = hashlib.sha256(_jansson_compact(qc).encode()).digest()
    major, minor = torch.cuda.get_device_capability(device)
    return {"architecture": arch, "quant_method": quant, "quant_config_sha256": quant_sha,
            "revision": rev.digest(), "dtypes": ",".join(sorted(dtypes)), "tp_size": tp_size,
            "tp_rank": tp_rank, "cc_major": major, "cc_minor": minor,
            "driver_version": _cuda_runtime()["driver_version"]()}


def _pack_attach(fp: Fingerprint) -> bytearray:
    head = _ATTACH_HEAD.pack(ABI_VERSION, 0)
    fpb = _FP.pack(fp["architecture"].encode(), fp["quant_method"].encode(),
                   fp["quant_config_sha256"], fp["revision"], fp["dtypes"].encode(),
                   fp["tp_size"], fp["tp_rank"], fp["cc_major"], fp["cc_minor"],
                   fp["driver_version"], 0)
    return bytearray(head + fpb + b"\0" * (ATTACH_SIZE - len(head) - len(fpb)))


# ---- attaching weights -------------------------------------------------------------------

class _Attachment:
    """The open rank file and the mapped slabs. Every attached tensor holds
    it (through its storage), so it closes when the last tensor is gone."""

    def __init__(self, fd: int | None, ipc_close: Callable[[int], None]) -> None:
        self.fd: int | None = fd
        self.slabs: list[int] = []
        self._ipc_close = ipc_close

    def close(self) -> None:
        for ptr in self.slabs:
            self._ipc_close(ptr)
        self.slabs = []
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


class _DeviceBytes:
    """A device range that torch.as_tensor takes without copying; torch
    keeps this object (and so the attachment) alive with the storage."""

    def __init__(self, ptr: int, size: int, owner: Any = None) -> None:
        self.owner = owner
        self.__cuda_array_interface__ = {"shape": (size,), "typestr": "|u1",
                                         "data": (ptr, False), "version": 3}


class AttachedWeights(dict[str, "torch.Tensor"]):
    """name -> torch.Tensor aliasing the daemon's slab. The open rank file is
    the attachment; it closes when this object and every tensor taken from
    it are gone, or at once with close() (then no tensor may be used)."""

    def __init__(self, attachment: _Attachment) -> None:
        super().__init__()
        self._att = attachment

    @property
    def fd(self) -> int | None:
        return self._att.fd

    @fd.setter
    def fd(self, value: int | None) -> None:
        self._att.fd = value

    @property
    def _slabs(self) -> list[int]:
        return self._att.slabs

    def close(self) -> None:
        self.clear()
        self._att.close()


def _load_from_disk(checkpoint_dir: str, rank: int, device: int) -> dict[str, "torch.Tensor"]:
    from safetensors.torch import load_file
    names, layout = _checkpoint_files(checkpoint_dir)
    if layout == "vllm-sharded":
        names = [n for n in names if n.startswith(f"model-rank-{rank}-part-")]
    out: dict[str, "torch.Tensor"] = {}
    for name in names:
        out.update(load_file(os.path.join(checkpoint_dir, name), device=f"cuda:{device}"))
    return out


def attach_weights(weight_version: str, rank: int = 0, checkpoint_dir: str | None = None,
                   expect: Fingerprint | None = None, mount: str | None = None,
                   device: int | None = None,
                   tp_size: int | None = None) -> dict[str, "torch.Tensor"]:
    """The tensors of one rank as a dict of torch tensors on the GPU
    (an AttachedWeights when served by artfs).

    expect is the fingerprint the engine expects (fingerprint(...)); when
    omitted it is computed from checkpoint_dir. Without an artfs mount the
    checkpoint is loaded from disk (safetensors); any other failure raises
    OSError with the errno of DESIGN.md §4.2."""
    mnt = mount_point(mount)
    device = rank if device is None else device
    if not is_artfs_mount(mnt):
        if checkpoint_dir is None:
            raise OSError(errno.ENODEV, f"{mnt} is not an artfs mount and no checkpoint_dir")
        return _load_from_disk(checkpoint_dir, rank, device)
    if expect is None and checkpoint_dir is None:
        # A published version: what its manifest says (device checked).
        expect = manifest_fingerprint(weight_version, rank, mnt, device)
    if expect is None:
        assert checkpoint_dir is not None
        _, layout = _checkpoint_files(checkpoint_dir)
        tp = tp_size or (1 if layout == "huggingface" else None)
        if tp is None:
            ranks = set()
            for n in os.listdir(checkpoint_dir):
                m = _SHARD.match(n)
                if m:
                    ranks.add(int(m.group(1)))
            tp = len(ranks)
        expect = fingerprint(checkpoint_dir, tp, 0 if tp == 1 else rank, device)
    import torch
    rt = _cuda_runtime()
    torch.cuda.set_device(device)
    path = os.path.join(mnt, weight_version, "weights", f"rank{rank}")
    fd = os.open(path, os.O_RDONLY)
    att = _Attachment(fd, rt["ipc_close"])
    weights = AttachedWeights(att)
    try:
        buf = _pack_attach(expect)
        fcntl.ioctl(fd, IOC_ATTACH, buf, True)
        off = _ATTACH_HEAD.size + _FP.size
        _uuid, _dev, count, _total = _ATTACH_OUT.unpack_from(buf, off)
        off += _ATTACH_OUT.size
        if not 1 <= count <= SLABS_MAX:
            raise OSError(errno.EIO, f"attach returned {count} slabs")
        for i in range(count):
            handle, _size = _SLAB.unpack_from(buf, off + i * _SLAB.size)
            att.slabs.append(rt["ipc_open"](handle))
        with open(os.path.join(mnt, weight_version, "weights", "manifest.json")) as f:
            manifest = json.load(f)
        for name, t in manifest["ranks"][rank]["tensors"].items():
            dt = getattr(torch, _TORCH_DTYPES[t["dtype"]])
            raw = torch.as_tensor(_DeviceBytes(att.slabs[t["slab"]] + t["offset"], t["size"], att),
                                  device=f"cuda:{device}")
            weights[name] = raw.view(dt).reshape(t["shape"])
    except BaseException:
        weights.close()
        raise
    return weights


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


def publish_blob(weight_version: str, blob: bytes, mount: str | None = None) -> str:
    """Sends a blob to <wv>/weights/.publish (making weights/ if needed) and
    returns the daemon's reply line once the copy is done. Raises OSError
    with the errno of artfs/artfs.h and the daemon's reason."""
    mnt = mount_point(mount)
    wdir = os.path.join(mnt, weight_version, "weights")
    os.makedirs(os.path.join(mnt, weight_version), exist_ok=True)
    try:
        os.mkdir(wdir)
    except FileExistsError:
        pass
    fd = os.open(os.path.join(wdir, ".publish"), os.O_RDWR)
    try:
        view = memoryview(blob)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        try:
            os.fsync(fd)
        except OSError as e:
            reply = os.pread(fd, 4096, 0).decode(errors="replace").strip()
            raise OSError(e.errno, f"publish {weight_version}: {reply or os.strerror(e.errno)}") from None
        return os.pread(fd, 4096, 0).decode().strip()
    finally:
        os.close(fd)


def manifest_fingerprint(weight_version: str, rank: int = 0, mount: str | None = None,
                         device: int | None = None) -> Fingerprint:
    """The fingerprint that manifest.json gives for rank (a version that was
    published, not loaded from a checkpoint the engine can read), with the
    compute capability and driver of this process's device, so that an
    attach still fails (ESTALE) on a device unlike the daemon's."""
    import torch
    mnt = mount_point(mount)
    with open(os.path.join(mnt, weight_version, "weights", "manifest.json")) as f:
        fp = json.load(f)["ranks"][rank]["fingerprint"]
    major, minor = torch.cuda.get_device_capability(rank if device is None else device)
    return {"architecture": fp["architecture"], "quant_method": fp["quant_method"],
            "quant_config_sha256": bytes.fromhex(fp["quant_config_sha256"]),
            "revision": bytes.fromhex(fp["revision"]), "dtypes": fp["dtypes"],
            "tp_size": fp["tp_size"], "tp_rank": fp["tp_rank"], "cc_major": major,
            "cc_minor": minor, "driver_version": _cuda_runtime()["driver_version"]()}
