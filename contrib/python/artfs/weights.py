# SPDX-License-Identifier: Apache-2.0
"""Preloaded GPU weights (DESIGN.md §4.2): torch tensors that alias the
daemon's slabs, without a copy. The slabs are CUDA VMM allocations: the
attach ioctl gives a token, the mount's socket .artfs/attach gives the
slabs' descriptors for it, and the driver maps them here (attach ABI 2 of
artfs/artfs.h). The mapping outlives a crash or an upgrade of the daemon.

attach_weights falls back to loading the checkpoint from disk only when no
artfs mount is present; every other failure raises (fail closed).
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import socket
import struct
import time
from typing import TYPE_CHECKING, Any, Callable

# The structs of artfs/artfs.h and the publish blob are artfs._abi, the CUDA
# driver calls artfs._cuda; the names stay importable from here.
from ._abi import (_ATTACH_HEAD, _ATTACH_OUT, _FP, _SLABS_REPLY, _SLABS_REQUEST,  # noqa: F401
                   ABI_VERSION, ATTACH_SIZE, IOC_ATTACH, LAYOUT_SIZE, PUBLISH_ABI, PUBLISH_MAGIC,
                   PUBLISH_NAME_MAX, SLABS_MAGIC, SLABS_MAX, TOKEN_SIZE, Fingerprint,
                   PublishTensor, _pack_attach, _unpack_attach, pack_publish)
from ._cuda import _driver
from ._range import Range
from .mount import is_artfs_mount, mount_point

if TYPE_CHECKING:
    import torch

__all__ = ["fingerprint", "attach_weights", "AttachedWeights", "manifest_fingerprint",
           "PublishTensor", "pack_publish", "publish_blob", "attach_in_place", "InPlaceWeights"]

# How long an attach tries again when the daemon that gave its token went
# before the slabs were fetched (a restart: the next one serves).
ATTACH_RETRY_S = 10.0

# safetensors dtype -> torch dtype name
_TORCH_DTYPES = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16",
    "I32": "int32", "U32": "uint32", "I64": "int64", "U64": "uint64", "F16": "float16",
    "BF16": "bfloat16", "F32": "float32", "F64": "float64", "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2", "C64": "complex64",
}


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
            "driver_version": _driver().driver_version()}


def _recv_with_fds(s: socket.socket, size: int, maxfds: int) -> tuple[bytes, list[int], int]:
    """One message and the descriptors that came with it, close-on-exec (a
    child this process starts must not keep the slabs; socket.recv_fds
    drops its flags argument)."""
    data, anc, flags, _ = s.recvmsg(size, socket.CMSG_LEN(maxfds * 4), socket.MSG_CMSG_CLOEXEC)
    fds = []
    for level, kind, cdata in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds += struct.unpack(f"{len(cdata) // 4}i", cdata[:len(cdata) - len(cdata) % 4])
    return data, fds, flags


def _fetch_slabs(mnt: str, token: bytes) -> tuple[list[int], list[int]]:
    """The slabs' descriptors and sizes that a token grants, from the mount's
    socket .artfs/attach."""
    path = os.path.join(mnt, ".artfs", "attach")
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        s.settimeout(10.0)
        try:
            s.connect(path)
            s.send(_SLABS_REQUEST.pack(SLABS_MAGIC, ABI_VERSION, token))
            data, fds, flags = _recv_with_fds(s, _SLABS_REPLY.size + 1, SLABS_MAX)
        except OSError as e:
            raise OSError(e.errno or errno.EIO, f"{path}: {e.strerror or e}") from None
    try:
        if not data:
            raise OSError(errno.ECONNRESET, f"{path}: the daemon went before it replied")
        if len(data) != _SLABS_REPLY.size or flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            raise OSError(errno.EPROTO, f"{path}: not a reply of attach ABI {ABI_VERSION}")
        magic, error, count, _, *sizes = _SLABS_REPLY.unpack(data)
        if magic != SLABS_MAGIC:
            raise OSError(errno.EPROTO, f"{path}: not a reply of attach ABI {ABI_VERSION}")
        if error < 0:
            raise OSError(-error, f"{path}: {os.strerror(-error)}")
        if not 1 <= count <= SLABS_MAX or len(fds) != count:
            raise OSError(errno.EPROTO, f"{path}: {count} slabs with {len(fds)} descriptors")
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return list(fds), sizes[:count]


def _attach_and_fetch(fd: int, mnt: str, path: str, expect: Fingerprint,
                      want_layout: bytes | None = None) -> tuple[list[int], list[int], bytes]:
    """The attach ioctl on the open rank file, then the slabs its token
    grants, and the layout digest; again while the daemon that answered went
    before the slabs were fetched (it restarted). With want_layout, another
    layout raises EXDEV before any slab is fetched."""
    until = time.monotonic() + ATTACH_RETRY_S
    while True:
        buf = _pack_attach(expect)
        fcntl.ioctl(fd, IOC_ATTACH, buf, True)
        count, sizes, token, layout = _unpack_attach(buf)
        sizes = sizes[:count]
        if not 1 <= count <= SLABS_MAX:
            raise OSError(errno.EIO, f"{path}: attach returned {count} slabs")
        if want_layout is not None and layout != want_layout:
            raise OSError(errno.EXDEV, f"{path}: its layout {layout.hex()[:16]}... is not the layout "
                          f"in place {want_layout.hex()[:16]}... (other tensor names, dtypes or "
                          "shapes): no flip in place; bind it anew (artfs.torch.bind) instead")
        try:
            fds, got = _fetch_slabs(mnt, token)
        except OSError as e:
            again = e.errno in (errno.ENOENT, errno.ECONNRESET, errno.ECONNREFUSED, errno.EPIPE)
            if not again or time.monotonic() > until:
                raise
            time.sleep(0.002)
            continue
        if got != sizes:
            for f in fds:
                os.close(f)
            raise OSError(errno.EPROTO, f"{path}: the slabs fetched are not those the attach named")
        return fds, got, layout


# ---- attaching weights -------------------------------------------------------------------

class _Attachment:
    """The open rank file and the mapped slabs. Every attached tensor holds
    it (through its storage), so it closes when the last tensor is gone."""

    def __init__(self, fd: int | None, unmap: Callable[[int, int], None]) -> None:
        self.fd: int | None = fd
        self.slabs: list[int] = []
        self.sizes: list[int] = []
        self._unmap = unmap

    def close(self) -> None:
        for ptr, size in zip(self.slabs, self.sizes):
            self._unmap(ptr, size)
        self.slabs = []
        self.sizes = []
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
    expect = _expectation(weight_version, rank, checkpoint_dir, expect, mnt, device, tp_size)
    import torch
    torch.cuda.set_device(device)
    drv = _driver()
    path = os.path.join(mnt, weight_version, "weights", f"rank{rank}")
    fd = os.open(path, os.O_RDONLY)
    att = _Attachment(fd, drv.unmap)
    weights = AttachedWeights(att)
    try:
        fds, sizes, _ = _attach_and_fetch(fd, mnt, path, expect)
        try:
            for slab_fd, size in zip(fds, sizes):
                att.slabs.append(drv.import_fd(slab_fd, size))
                att.sizes.append(size)
        finally:
            for slab_fd in fds:
                os.close(slab_fd)  # the mapping keeps the memory
        _fill_from_manifest(weights, att, mnt, weight_version, rank, device)
    except BaseException:
        weights.close()
        raise
    return weights


def _expectation(weight_version: str, rank: int, checkpoint_dir: str | None,
                 expect: Fingerprint | None, mnt: str, device: int,
                 tp_size: int | None) -> Fingerprint:
    """The fingerprint an attach expects: expect, else the checkpoint's, else
    (a published version) what its manifest says."""
    if expect is not None:
        return expect
    if checkpoint_dir is None:
        return manifest_fingerprint(weight_version, rank, mnt, device)
    _, layout = _checkpoint_files(checkpoint_dir)
    tp = tp_size or (1 if layout == "huggingface" else None)
    if tp is None:
        ranks = set()
        for n in os.listdir(checkpoint_dir):
            m = _SHARD.match(n)
            if m:
                ranks.add(int(m.group(1)))
        tp = len(ranks)
    return fingerprint(checkpoint_dir, tp, 0 if tp == 1 else rank, device)


def _fill_from_manifest(weights: "AttachedWeights", att: "_Attachment", mnt: str,
                        weight_version: str, rank: int, device: int) -> None:
    """weights' tensors, where manifest.json places them in att's slabs."""
    import torch
    for name, t in manifest_rank(weight_version, rank, mnt)["tensors"].items():
        dt = getattr(torch, _TORCH_DTYPES[t["dtype"]])
        slab, off, size = t["slab"], t["offset"], t["size"]
        if not (all(isinstance(v, int) for v in (slab, off, size)) and
                0 <= slab < len(att.slabs) and off >= 0 and size >= 0 and
                off + size <= att.sizes[slab]):
            raise OSError(errno.EBADMSG, f"{weight_version}/rank{rank}: the manifest places "
                          f"{name} outside the slabs the daemon sent")
        raw = torch.as_tensor(_DeviceBytes(att.slabs[slab] + off, size, att),
                              device=f"cuda:{device}")
        weights[name] = raw.view(dt).reshape(t["shape"])


# ---- in place: versions of one layout at the same addresses (flip in place) ------------

class _InPlaceAttachment(_Attachment):
    """The open rank file of the version mapped, and the range that holds
    the slabs of whichever version is mapped."""

    def __init__(self, fd: int | None, rng: Range) -> None:
        super().__init__(fd, lambda ptr, size: None)
        self.range: Range | None = rng

    def close(self) -> None:
        if self.range is not None:
            self.range.close()
            self.range = None
        self.slabs = []
        self.sizes = []
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class InPlaceWeights(AttachedWeights):
    """Weights attached in place (attach_in_place): flip() maps another
    version of the same layout at the same addresses, so every tensor keeps
    its data_ptr() and CUDA graphs captured on them stay valid."""

    def __init__(self, attachment: _InPlaceAttachment, weight_version: str, rank: int, mount: str,
                 device: int, layout: bytes, tp_size: int = 1) -> None:
        super().__init__(attachment)
        self.weight_version, self.rank, self.mount = weight_version, rank, mount
        self.device, self.layout, self.tp_size = device, layout, tp_size

    def flip(self, weight_version: str, expect: Fingerprint | None = None,
             checkpoint_dir: str | None = None) -> float:
        """Maps weight_version (same rank, same layout) where this version is:
        waits for the device (no kernel may read the weights meanwhile: flip
        between steps), unmaps each slab and maps the new one; on any failure
        the version before stays. Then the version before is let go (unload
        frees it). EXDEV: another layout, or none known: bind anew instead;
        ESTALE: a version of another tensor-parallel size (its rank holds
        other shards); ENOENT: the version has no such rank. Each rank of
        an engine flips on its own. Returns the seconds the flip took."""
        import torch
        t0 = time.perf_counter()
        att = self._att
        assert isinstance(att, _InPlaceAttachment)
        if att.range is None:
            raise OSError(errno.EBADF, "flip of weights already closed")
        path = os.path.join(self.mount, weight_version, "weights", f"rank{self.rank}")
        if self.layout == bytes(LAYOUT_SIZE):
            raise OSError(errno.EXDEV, f"{path}: the daemon said no layout of the weights in place "
                          "(a daemon before flips in place): bind anew instead")
        expect = _expectation(weight_version, self.rank, checkpoint_dir, expect, self.mount,
                              self.device, None)
        check_same_tp(path, self.tp_size, expect)
        fd = os.open(path, os.O_RDONLY)
        try:
            fds, sizes, _ = _attach_and_fetch(fd, self.mount, path, expect, self.layout)
            try:
                with torch.cuda.device(self.device):
                    torch.cuda.synchronize()
                    att.range.map(fds, sizes)
            finally:
                for slab_fd in fds:
                    os.close(slab_fd)
        except BaseException:
            os.close(fd)
            raise
        old, att.fd = att.fd, fd
        if old is not None:
            os.close(old)  # the version before: unload frees it now
        self.weight_version = weight_version
        return time.perf_counter() - t0


def check_same_tp(path: str, tp_size: int, expect: Fingerprint) -> None:
    """A rank in place flips only to a version of its own tensor-parallel
    size: ESTALE otherwise (what the daemon answers a fingerprint that
    differs), before anything is mapped."""
    if expect["tp_size"] != tp_size:
        raise OSError(errno.ESTALE, f"{path}: a version of tp_size {expect['tp_size']}, the "
                      f"weights in place have tp_size {tp_size}: a rank flips only to versions "
                      "of its own tensor-parallel size")


def attach_in_place(weight_version: str, rank: int = 0, checkpoint_dir: str | None = None,
                    expect: Fingerprint | None = None, mount: str | None = None,
                    device: int | None = None, tp_size: int | None = None,
                    base: int = 0, length: int = 0) -> InPlaceWeights:
    """Like attach_weights, with the slabs mapped one after the other in a
    range of addresses: [base, base + length) that the engine reserved
    (cuMemAddressReserve, 2 MiB aligned), or one reserved here (base 0).
    InPlaceWeights.flip then switches the range to another version of the
    same layout (manifest.json's ranks[k].layout)."""
    mnt = mount_point(mount)
    device = rank if device is None else device
    if not is_artfs_mount(mnt):
        raise OSError(errno.ENODEV, f"{mnt} is not an artfs mount: no flip in place")
    expect = _expectation(weight_version, rank, checkpoint_dir, expect, mnt, device, tp_size)
    import torch
    torch.cuda.set_device(device)
    drv = _driver()
    path = os.path.join(mnt, weight_version, "weights", f"rank{rank}")
    fd = os.open(path, os.O_RDONLY)
    try:
        fds, sizes, layout = _attach_and_fetch(fd, mnt, path, expect)
    except BaseException:
        os.close(fd)
        raise
    try:
        rng = Range(drv, sizes, base, length)
    except BaseException:
        for slab_fd in fds:
            os.close(slab_fd)
        os.close(fd)
        raise
    att = _InPlaceAttachment(fd, rng)
    weights = InPlaceWeights(att, weight_version, rank, mnt, device, layout, expect["tp_size"])
    try:
        try:
            rng.map(fds, sizes)
        finally:
            for slab_fd in fds:
                os.close(slab_fd)  # the mappings keep the memory
        att.slabs, att.sizes = list(rng.at), list(rng.sizes)
        _fill_from_manifest(weights, att, mnt, weight_version, rank, device)
    except BaseException:
        weights.close()
        raise
    return weights


# ---- GPU-direct publish (DESIGN.md §4.3; the blob is packed by artfs._abi) --------------

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


def manifest_rank(weight_version: str, rank: int = 0, mount: str | None = None) -> dict[str, Any]:
    """Rank's entry of weight_version's manifest.json; OSError ENOENT when
    the version has no such rank (another tensor-parallel size)."""
    path = os.path.join(mount_point(mount), weight_version, "weights", "manifest.json")
    with open(path) as f:
        ranks = json.load(f).get("ranks")
    if not isinstance(ranks, list) or not 0 <= rank < len(ranks) or not isinstance(ranks[rank], dict):
        count = len(ranks) if isinstance(ranks, list) else 0
        raise OSError(errno.ENOENT, f"{path}: no rank {rank} (the version has {count} "
                      f"rank{'' if count == 1 else 's'})")
    return ranks[rank]


def manifest_fingerprint(weight_version: str, rank: int = 0, mount: str | None = None,
                         device: int | None = None) -> Fingerprint:
    """The fingerprint that manifest.json gives for rank (a version that was
    published, not loaded from a checkpoint the engine can read), with the
    compute capability and driver of this process's device, so that an
    attach still fails (ESTALE) on a device unlike the daemon's."""
    import torch
    fp = manifest_rank(weight_version, rank, mount)["fingerprint"]
    major, minor = torch.cuda.get_device_capability(rank if device is None else device)
    return {"architecture": fp["architecture"], "quant_method": fp["quant_method"],
            "quant_config_sha256": bytes.fromhex(fp["quant_config_sha256"]),
            "revision": bytes.fromhex(fp["revision"]), "dtypes": fp["dtypes"],
            "tp_size": fp["tp_size"], "tp_rank": fp["tp_rank"], "cc_major": major,
            "cc_minor": minor, "driver_version": _driver().driver_version()}
