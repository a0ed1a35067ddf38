# SPDX-License-Identifier: Apache-2.0
"""torch modules on artfs weights (DESIGN.md §4.3).

    import artfs.torch
    w = artfs.attach_weights("v2", rank=0)                 # a published or loaded version
    artfs.torch.bind(model, w)                              # no copy: parameters alias the slab
    artfs.torch.publish_weights("v3", model.state_dict())   # trainer side, GPU to GPU

    artfs.torch.bind_in_place(model, "v2")                  # once: slabs in a range that stays
    artfs.torch.flip_in_place(model, "v3")                  # same layout: no data_ptr() changes

torch is imported only when a function runs, so `import artfs` works without it.
"""
from __future__ import annotations

import ctypes
import errno
from typing import TYPE_CHECKING, Mapping

from ._abi import PublishTensor, pack_publish
from .weights import InPlaceWeights, attach_in_place, publish_blob

if TYPE_CHECKING:
    import torch

__all__ = ["bind", "publish_weights", "BindError", "bind_in_place", "flip_in_place"]


class BindError(ValueError):
    """What did not match between a module and the weights; .names lists them."""

    def __init__(self, message: str, names: list[str]) -> None:
        super().__init__(message)
        self.names = names


def bind(module: "torch.nn.Module", weights: Mapping[str, "torch.Tensor"], strict: bool = True) -> None:
    """Points module's parameters and buffers at the tensors of weights
    without copying. Every name must match in dtype and shape, else
    BindError lists the names; with strict, names missing on either side
    raise too. Nothing is changed unless everything matches. Binding again
    to another version swaps every tensor; an attachment closes once no
    tensor of it is used any more."""
    import torch
    slots: dict[str, tuple[torch.nn.Module, str, bool]] = {}
    for prefix, sub in module.named_modules(remove_duplicate=False):
        for name, p in sub._parameters.items():
            if p is not None:
                slots[f"{prefix}.{name}" if prefix else name] = (sub, name, True)
        for name, b in sub._buffers.items():
            if b is not None and name not in sub._non_persistent_buffers_set:
                slots[f"{prefix}.{name}" if prefix else name] = (sub, name, False)
    bad: list[str] = []
    reasons: list[str] = []
    # Tied parameters (one Parameter under two names) need only one name in
    # the weights: a checkpoint saved without duplicates binds both.
    present: set[int] = set()
    for full, (sub, name, is_param) in slots.items():
        if full in weights:
            present.add(id(sub._parameters[name] if is_param else sub._buffers[name]))
    for full, (sub, name, is_param) in slots.items():
        cur = sub._parameters[name] if is_param else sub._buffers[name]
        assert cur is not None
        new = weights.get(full)
        if new is None:
            if strict and id(cur) not in present:
                bad.append(full)
                reasons.append(f"{full}: not in the weights")
            continue
        if new.dtype != cur.dtype or tuple(new.shape) != tuple(cur.shape):
            bad.append(full)
            reasons.append(f"{full}: weights have {new.dtype} {tuple(new.shape)}, "
                           f"the module {cur.dtype} {tuple(cur.shape)}")
    if strict:
        for full in weights:
            if full not in slots:
                bad.append(full)
                reasons.append(f"{full}: not in the module")
    if bad:
        raise BindError(f"bind: {len(bad)} name(s) do not match: " + "; ".join(reasons[:20])
                        + (" ..." if len(reasons) > 20 else ""), bad)
    with torch.no_grad():
        bound: dict[int, "torch.Tensor"] = {}
        for full, (sub, name, is_param) in slots.items():
            if full in weights:
                cur = sub._parameters[name] if is_param else sub._buffers[name]
                bound.setdefault(id(cur), weights[full])
        for full, (sub, name, is_param) in slots.items():
            cur = sub._parameters[name] if is_param else sub._buffers[name]
            new = weights.get(full, bound.get(id(cur)))
            if new is None:
                continue
            if is_param and cur.device != new.device:
                # A module built on the meta device (no memory of its own)
                # gets new Parameters around the attached tensors.
                sub._parameters[name] = torch.nn.Parameter(new, requires_grad=cur.requires_grad)
            elif is_param:
                # The Parameter object stays (optimizers, hooks hold it); its
                # storage becomes the attached tensor's.
                cur.data = new
            else:
                sub._buffers[name] = new


# ---- in place: flips that keep every address (DESIGN.md §4.3) ----------------------

_IN_PLACE = "_artfs_in_place"


def bind_in_place(module: "torch.nn.Module", weight_version: str, rank: int = 0,
                  mount: str | None = None, *, device: int | None = None,
                  checkpoint_dir: str | None = None, strict: bool = True) -> InPlaceWeights:
    """Binds module once to weight_version attached in place: its slabs in a
    range of addresses that stays, so that flip_in_place can later switch
    every parameter and buffer to another version without changing a
    data_ptr() (CUDA graphs captured on the module stay valid). Checks as
    bind (BindError); tied tensors stay tied. Returns the attachment (the
    module keeps it)."""
    w = attach_in_place(weight_version, rank, checkpoint_dir=checkpoint_dir, mount=mount, device=device)
    try:
        bind(module, w, strict=strict)
    except BaseException:
        w.close()
        raise
    old = getattr(module, _IN_PLACE, None)
    object.__setattr__(module, _IN_PLACE, w)  # not a submodule or a parameter
    if old is not None:
        old.clear()  # its tensors go with the module's old ones
    return w


def flip_in_place(module: "torch.nn.Module", weight_version: str, *,
                  checkpoint_dir: str | None = None) -> float:
    """Switches every parameter and buffer of a module bound by bind_in_place
    to weight_version, at the same addresses: no copy, no allocation, no
    data_ptr() changes. Waits for the device first; the engine must not run
    the module meanwhile (flip between steps). On any failure the version
    before stays. OSError EXDEV: weight_version has another layout (other
    names, dtypes or shapes): bind it anew with bind() instead. Returns the
    seconds the flip took."""
    w = getattr(module, _IN_PLACE, None)
    if not isinstance(w, InPlaceWeights):
        raise OSError(errno.EINVAL, "flip_in_place: the module was not bound with bind_in_place")
    return w.flip(weight_version, checkpoint_dir=checkpoint_dir)


# ---- publish ---------------------------------------------------------------------

_DTYPE_NAMES = {
    "bool": "BOOL", "uint8": "U8", "int8": "I8", "int16": "I16", "uint16": "U16",
    "int32": "I32", "uint32": "U32", "int64": "I64", "uint64": "U64", "float16": "F16",
    "bfloat16": "BF16", "float32": "F32", "float64": "F64", "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2", "complex64": "C64",
}

_CUDA: ctypes.CDLL | None = None


def _libcuda() -> ctypes.CDLL:
    global _CUDA
    if _CUDA is None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError:
            raise OSError(errno.ENODEV, "no CUDA driver (libcuda.so.1)") from None
        lib.cuMemGetAddressRange_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64),
                                                ctypes.POINTER(ctypes.c_size_t), ctypes.c_uint64]
        lib.cuIpcGetMemHandle.argtypes = [ctypes.c_char_p, ctypes.c_uint64]
        lib.cuDeviceGet.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
        lib.cuDeviceGetUuid_v2.argtypes = [ctypes.c_char_p, ctypes.c_int]
        _CUDA = lib
    return _CUDA


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise OSError(errno.EIO, f"{what} failed (CUresult {rc})")


def publish_weights(weight_version: str, tensors: Mapping[str, "torch.Tensor"], rank: int = 0,
                    mount: str | None = None, *, tp_size: int = 1, target_device: int | None = None,
                    architecture: str = "", quant_method: str = "") -> None:
    """Publishes tensors (all on one GPU, contiguous) as rank `rank` of
    weight_version: the daemon copies them GPU to GPU into its own memory
    (target_device, default the tensors' GPU) and this returns when the copy
    is done, so the tensors may be changed right after. Tensors that share
    storage (tied parameters) are stored once. Raises OSError with the
    errno of artfs/artfs.h."""
    import torch
    if not tensors:
        raise ValueError("publish_weights: no tensors")
    devices = {t.device for t in tensors.values()}
    bad = [n for n, t in tensors.items() if not t.is_cuda or not t.is_contiguous()
           or t.dtype.__str__().removeprefix("torch.") not in _DTYPE_NAMES]
    if len(devices) != 1 or bad:
        raise ValueError("publish_weights: every tensor must be a contiguous CUDA tensor of a "
                         f"safetensors dtype on one GPU (devices {sorted(map(str, devices))}); "
                         f"not so: {bad[:20]}")
    dev = devices.pop()
    lib = _libcuda()
    torch.cuda.synchronize(dev)  # the daemon's copy must see finished writes
    with torch.cuda.device(dev):
        cudev = ctypes.c_int()
        _check(lib.cuDeviceGet(ctypes.byref(cudev), dev.index), "cuDeviceGet")
        uuid = ctypes.create_string_buffer(16)
        _check(lib.cuDeviceGetUuid_v2(uuid, cudev.value), "cuDeviceGetUuid")
        handles: list[bytes] = []
        index: dict[int, int] = {}
        entries: list[PublishTensor] = []
        for name, t in tensors.items():
            size = t.numel() * t.element_size()
            ptr = t.data_ptr()
            if size == 0:  # no bytes: any handle, offset 0
                entries.append(PublishTensor(name, _DTYPE_NAMES[str(t.dtype)[6:]], tuple(t.shape), 0, 0, 0))
                continue
            base, length = ctypes.c_uint64(), ctypes.c_size_t()
            _check(lib.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(length), ptr),
                   f"cuMemGetAddressRange ({name})")
            if base.value not in index:
                h = ctypes.create_string_buffer(64)
                _check(lib.cuIpcGetMemHandle(h, base.value), f"cuIpcGetMemHandle ({name})")
                index[base.value] = len(handles)
                handles.append(h.raw)
            entries.append(PublishTensor(name, _DTYPE_NAMES[str(t.dtype)[6:]], tuple(t.shape),
                                         index[base.value], ptr - base.value, size))
        if not handles:
            raise ValueError("publish_weights: every tensor is empty")
    blob = pack_publish(handles, entries, uuid.raw, rank=rank, tp_size=tp_size,
                        target_device=-1 if target_device is None else target_device,
                        architecture=architecture, quant_method=quant_method)
    publish_blob(weight_version, blob, mount)
