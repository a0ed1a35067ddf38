# SPDX-License-Identifier: Apache-2.0
"""Raw blocks by key through an artfs mount (DESIGN.md §10): the write-once
tree .blocks/, where upstream vLLM's auxiliary outputs (routed-expert blocks
under keys "vllm-artifact/<namespace>/<block hash hex>") are kept. A batch
is one .blocks/.put transaction, a read of many keys one .blocks/.get.

    from artfs import blocks
    blocks.put([(key, payload), ...])    # one errno per record, 0 = committed
    blocks.get([key, ...])               # the payloads back to back, as asked
    blocks.read(key)                     # one block: open, read, close

Every failure of the mount is an OSError with the daemon's errno, its
message naming the path and, where one is to blame, the key.
"""
from __future__ import annotations

import errno
import os
import re
import struct
from collections.abc import Iterable, Sequence
from typing import Union

from .mount import mount_point
from .r3 import _ERRNO_NAMES, _end_batch, _error, _read_all, _read_file, _write_all, _writev_all

__all__ = ["KEY_MAX", "key_problem", "put", "get", "read"]

Payload = Union[bytes, bytearray, memoryview]

KEY_MAX = 512
"""Bytes of a key at most."""
SEGMENT_MAX = 255
"""Bytes of a segment at most (it is a file name)."""

_SEGMENT = r"[A-Za-z0-9._:-]+"
_KEY = re.compile(rf"{_SEGMENT}(?:/{_SEGMENT})*")
# Names in .blocks/ that are the transaction files, not keys.
_RESERVED = frozenset((".put", ".get"))
_LENGTH = struct.Struct("<Q")
# A result line: the key, a space, an errno name (EBADMSG is the longest), "\n".
_STATUS_MAX = 10


def key_problem(key: object) -> str | None:
    """Why key cannot name a block (None when it can): 1-512 bytes of
    [A-Za-z0-9._:-] segments joined by "/", none empty, "." or "..", none
    over 255 bytes, and not under a name of the transaction files."""
    if not isinstance(key, str):
        return f"a key is a str, not {type(key).__name__}"
    if not 0 < len(key) <= KEY_MAX:
        return f"a key is 1 to {KEY_MAX} bytes, this one {len(key)}"
    if not _KEY.fullmatch(key):
        return "a key is segments of [A-Za-z0-9._:-] joined by \"/\", none of them empty"
    segments = key.split("/")
    if "." in segments or ".." in segments:
        return "no segment of a key is \".\" or \"..\""
    if max(map(len, segments)) > SEGMENT_MAX:
        return f"a segment of a key is 1 to {SEGMENT_MAX} bytes"
    if segments[0] in _RESERVED:
        return f"\".blocks/{segments[0]}\" is a transaction file, not a key"
    return None


def _check_keys(keys: Iterable[object]) -> None:
    for key in keys:
        problem = key_problem(key)
        if problem:
            raise ValueError(f"not a block key: {str(key)[:80]!r}: {problem}")


def _parse_results(text: bytes, keys: Sequence[str], path: str) -> list[int]:
    """One errno per record from the result lines, each line checked
    against the key it answers."""
    lines = text.decode("ascii", "replace").splitlines()
    if len(lines) != len(keys):
        raise _error(errno.EIO, f"batch put of {len(keys)} blocks: the daemon answered "
                     f"{len(lines)} result lines", path)
    codes = []
    for key, line in zip(keys, lines):
        got, _, status = line.rpartition(" ")
        if got != key:
            raise _error(errno.EIO, f"batch put: asked {key}, the result line says "
                         f"{line[:KEY_MAX + 16]!r}", path)
        code = int(status) if status.isdigit() else _ERRNO_NAMES.get(status)
        if code is None:
            raise _error(errno.EIO, f"batch put: unexpected result {status[:40]!r} for {key}",
                         path)
        codes.append(code)
    return codes


def put(records: Sequence[tuple[str, Payload]], mount: str | None = None) -> list[int]:
    """Puts blocks in one .blocks/.put transaction: one open, a gathered
    write of every record ("<key>\\n", u64 little-endian length, payload),
    the read of the result lines (which ends the transaction) and close.

    Returns one errno per record, in order: 0 when it committed or its
    key was there already (the first block put under a key stays, whatever
    this one holds), else ENOSPC (blocks_capacity= is full), EFBIG,
    EBADMSG, EINVAL, EEXIST (a block lies where the key's directory would,
    or the reverse) or EIO (the cluster, with remote=). Each record
    commits or fails on its own. Keys are checked first (ValueError;
    nothing is sent). A failure of the transaction itself raises
    OSError."""
    if not records:
        return []
    keys = [key for key, _payload in records]
    _check_keys(keys)
    parts: list[Payload] = []
    expect = 0
    for key, payload in records:
        view = memoryview(payload).cast("B")
        parts += [key.encode() + b"\n" + _LENGTH.pack(view.nbytes), view]
        expect += len(key) + 2 + _STATUS_MAX
    path = os.path.join(mount_point(mount), ".blocks", ".put")
    what = f"batch put of {len(records)} blocks"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError as e:
        raise _error(e.errno, what, path) from None
    try:
        _writev_all(fd, parts)
        text = _end_batch(fd, expect)
    except OSError as e:
        os.close(fd)
        raise _error(e.errno, what, path) from None
    closed = 0
    try:
        os.close(fd)
    except OSError as e:
        closed = e.errno or errno.EIO  # the errno of the first failing record
    codes = _parse_results(text, keys, path)
    if closed and not any(codes):
        raise _error(closed, what, path)  # the transaction failed, not a record
    return codes


def _culprit(blocks_dir: str, keys: Sequence[str], code: int) -> str:
    """The first key that makes a .blocks/.get fail with code, read alone
    (only after a failure: the message names the block)."""
    for key in dict.fromkeys(keys):
        path = os.path.join(blocks_dir, key)
        try:
            if code == errno.ENOENT:
                os.stat(path)
            else:
                _read_file(path)
        except OSError as e:
            return f"{key}: {os.strerror(e.errno or errno.EIO)}"
    return f"{len(keys)} keys"


def get(keys: Sequence[str], mount: str | None = None, expect: int = 0) -> bytes:
    """The payloads of keys concatenated in the order asked (repeats
    allowed): one .blocks/.get transaction. expect: the bytes the caller
    expects at most (len(keys) × block size), which saves the round trip
    that asks for EOF. Raises ValueError for a malformed key (nothing is
    sent), OSError with the daemon's errno otherwise: ENOENT when a key is
    absent, EIO when a block fails its check (also a cluster that does
    not answer), ENOMEM for an answer over materialize_max=; the message
    names the first key to blame."""
    if not keys:
        return b""
    _check_keys(keys)
    blocks_dir = os.path.join(mount_point(mount), ".blocks")
    path = os.path.join(blocks_dir, ".get")
    what = f"batch read of {len(keys)} blocks"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError as e:
        raise _error(e.errno, what, path) from None
    try:
        _write_all(fd, ("\n".join(keys) + "\n").encode())
        return _read_all(fd, expect)
    except OSError as e:
        code = e.errno or errno.EIO
        culprit = _culprit(blocks_dir, keys, code) if code in (errno.ENOENT, errno.EIO) else ""
        raise _error(code, f"{what}{': ' + culprit if culprit else ''}", path) from None
    finally:
        os.close(fd)


def read(key: str, mount: str | None = None) -> bytes:
    """One block's bytes: open, read, close of .blocks/<key>."""
    _check_keys((key,))
    path = os.path.join(mount_point(mount), ".blocks", key)
    try:
        return _read_file(path)
    except OSError as e:
        raise _error(e.errno, f"read of block {key}", path) from None
