"""R3 objects through an artfs mount (DESIGN.md §3): one object as a numpy
array, its attributes, one request materialized by the daemon.

    import artfs
    artfs.read_r3("default", block_hash)                       # numpy.ndarray
    artfs.materialize("default", [h0, h1, tail], token_end=40)
"""
from __future__ import annotations

import io
import os
from collections.abc import Iterable
from typing import Any, Union

import numpy as np
import numpy.typing as npt

from .mount import mount_point

__all__ = ["read_r3", "r3_attributes", "materialize"]

_READ_CHUNK = 1 << 22

BlockHash = Union[bytes, bytearray, str]
"""A KV block hash: its bytes, or their lowercase hex (the file name)."""


def _hash_name(block_hash: BlockHash) -> str:
    return bytes(block_hash).hex() if isinstance(block_hash, (bytes, bytearray)) else block_hash


def read_r3(weight_version: str, block_hash: BlockHash, mount: str | None = None) -> npt.NDArray[Any]:
    """The routed-expert array of one object; raises OSError (EIO if the
    store fails verification, ENOENT if absent)."""
    array: npt.NDArray[Any] = np.load(os.path.join(mount_point(mount), weight_version,
                                                   _hash_name(block_hash)))
    return array


def r3_attributes(weight_version: str, block_hash: BlockHash,
                  mount: str | None = None) -> dict[str, str]:
    """The user.artfs.* extended attributes of one object, without the prefix."""
    path = os.path.join(mount_point(mount), weight_version, _hash_name(block_hash))
    return {k[len("user.artfs."):]: os.getxattr(path, k).decode()
            for k in os.listxattr(path) if k.startswith("user.artfs.")}


def materialize(weight_version: str, block_hashes: Iterable[BlockHash],
                token_end: int | None = None, block_size: int | None = None,
                mount: str | None = None) -> npt.NDArray[Any]:
    """One request's R3 array (DESIGN.md §3.4) as a numpy array."""
    lines = []
    if token_end is not None:
        lines.append(f"token_end {int(token_end)}")
    if block_size is not None:
        lines.append(f"block_size {int(block_size)}")
    lines += [_hash_name(h) for h in block_hashes]
    path = os.path.join(mount_point(mount), weight_version, ".materialize")
    fd = os.open(path, os.O_RDWR)
    try:
        data = ("\n".join(lines) + "\n").encode()
        while data:
            data = data[os.write(fd, data):]
        chunks, off = [], 0
        while True:
            b = os.pread(fd, _READ_CHUNK, off)
            if not b:
                break
            chunks.append(b)
            off += len(b)
    finally:
        os.close(fd)
    array: npt.NDArray[Any] = np.load(io.BytesIO(b"".join(chunks)))
    return array
