# SPDX-License-Identifier: Apache-2.0
"""R3 objects through an artfs mount (DESIGN.md §3): keys, the schema-3
envelope, publishing one object or a batch, reading by path, by key and as
one materialized request.

    import artfs
    key = artfs.key_of("default", block_hash)                  # "vllm-artifact/<64 hex>"
    env = artfs.encode_envelope(rows, key=key, kind="block", source_token_start=0)
    artfs.publish("default", block_hash, env)                  # open/write/close
    artfs.publish_many("default", [(block_hash, env)])         # one <wv>/.put transaction
    artfs.get_envelopes([key])                                 # one .keys/.get transaction
    artfs.read_r3("default", block_hash)                       # numpy.ndarray
    artfs.materialize("default", [h0, h1, tail], token_end=40)

Every failure of the mount is an OSError with the errno the daemon gave
(DESIGN.md §3.2-§3.7), its message naming the path and the key.
"""
from __future__ import annotations

import errno
import io
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Union

import numpy as np
import numpy.typing as npt

# The codec, without I/O, is artfs.envelope; its names stay importable from
# here (artfs.r3.key_of, artfs.r3.EnvelopeError, ...).
from .envelope import (_HEX64, FIELDS, HEADER_MAX, KEY_PREFIX, NDIM_MAX,  # noqa: F401
                       SCHEMA_VERSION, BlockHash, Envelope, EnvelopeError, _hash_name, _key_hex,
                       _Layout, _parse_header, _split_envelopes, decode_envelope,
                       encode_envelope, key_of)
from .mount import mount_point

__all__ = ["KEY_PREFIX", "SCHEMA_VERSION", "HEADER_MAX", "EnvelopeError", "PutResult",
           "key_of", "encode_envelope", "decode_envelope", "publish", "publish_many",
           "get_envelopes", "read_r3", "r3_attributes", "materialize"]

_READ_CHUNK = 1 << 22
# A result line of a batch publish: 64 hex (or "-"), a space, an errno name, "\n".
_RESULT_LINE_MAX = 96
_IOV_MAX = 1024  # os.writev takes at most IOV_MAX pieces (1024 on Linux)
_ERRNO_NAMES = {name: code for code, name in errno.errorcode.items()}

Record = Union[Envelope, tuple[BlockHash, Envelope]]
"""A record of publish_many: an envelope (.keys/.put) or (block hash, envelope) (<wv>/.put)."""


@dataclass(frozen=True)
class PutResult:
    """The outcome of one record of a batch publish (DESIGN.md §3.7)."""

    key: str
    """The key, "vllm-artifact/<64 hex>", as the daemon reported it."""
    errno: int
    """0 (committed or identical), EEXIST, EBADMSG, ENOSPC or EFBIG."""

    @property
    def ok(self) -> bool:
        return self.errno == 0


# ---- system calls -----------------------------------------------------------------------

def _error(e: int | None, what: str, path: str) -> OSError:
    """An OSError of the daemon's errno (the matching subclass, e.g.
    FileNotFoundError) that says what failed and on which path."""
    code = e or errno.EIO
    return OSError(code, f"{os.strerror(code)} ({what})", path)


def _write_all(fd: int, data: Envelope) -> None:
    view = memoryview(data)
    off = 0
    while off < len(view):
        off += os.write(fd, view[off:])


def _writev_all(fd: int, parts: Sequence[Envelope]) -> None:
    """parts back to back, gathered by the kernel: no joined copy of the
    batch (a FUSE write takes up to 1 MiB of them in one request)."""
    views = [memoryview(p).cast("B") for p in parts if len(p)]
    i = 0
    while i < len(views):
        n = os.writev(fd, views[i:i + _IOV_MAX])
        while i < len(views) and n >= len(views[i]):
            n -= len(views[i])
            i += 1
        if n:
            views[i] = views[i][n:]


def _read_all(fd: int, expect: int = 0) -> bytes:
    """From offset 0 to EOF (transaction files are read with pread). With
    expect, the bytes the caller expects at most: one read of a byte more,
    and a shorter answer is the end (a transaction file answers a read in
    full up to its end), so no second round trip asks for EOF."""
    chunks: list[bytes] = []
    off = 0
    if expect:
        b = os.pread(fd, expect + 1, 0)
        if len(b) <= expect:
            return b
        chunks.append(b)
        off = len(b)
    while True:
        b = os.pread(fd, _READ_CHUNK, off)
        if not b:
            return b"".join(chunks)
        chunks.append(b)
        off += len(b)


def _read_file(path: str) -> bytes:
    """A whole file in the fewest FUSE round trips (lookup, open, read,
    release): a buffered open() would ask isatty() (an ioctl round trip),
    and a stat after the first read asks for attributes again (the read
    made the kernel drop its cached atime)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return _read_all(fd)
    finally:
        os.close(fd)


def _mkdir_version(mnt: str, weight_version: str) -> str:
    path = os.path.join(mnt, weight_version)
    try:
        os.mkdir(path)
    except FileExistsError:
        pass
    except OSError as e:
        raise _error(e.errno, f"creating weight version {weight_version!r}", path) from None
    return path


# ---- publishing -----------------------------------------------------------------------

def publish(weight_version: str, block_hash: BlockHash, envelope: Envelope,
            mount: str | None = None) -> None:
    """Publishes one object as <wv>/<hash> (DESIGN.md §3.2): mkdir -p the
    version, open, write, close. Raises OSError with the daemon's errno:
    EEXIST (the key holds other content), EBADMSG, ENOSPC, EFBIG, ...

    A published object is read-only (artfs never opens it for writing), so
    when the name exists already the same envelope goes through a
    one-record <wv>/.put, which says 0 for identical content and EEXIST
    for different: publishing is idempotent for every user."""
    name = _hash_name(block_hash)
    mnt = mount_point(mount)
    path = os.path.join(mnt, weight_version, name)
    what = f"publish of {key_of(weight_version, name)}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    try:
        try:
            fd = os.open(path, flags, 0o644)
        except FileNotFoundError:
            # The version is new here. (mkdir first on every publish would
            # cost a FUSE round trip: the kernel looks an existing name up
            # again before mkdir.)
            _mkdir_version(mnt, weight_version)
            fd = os.open(path, flags, 0o644)
    except OSError as e:
        if e.errno != errno.EEXIST:
            raise _error(e.errno, what, path) from None
        try:
            publish_many(weight_version, [(name, envelope)], mount, check=True)
        except OSError as e2:
            raise _error(e2.errno, what, path) from None
        return
    try:
        _write_all(fd, envelope)
    except OSError as e:
        try:
            os.close(fd)
        except OSError:
            pass
        raise _error(e.errno, what, path) from None
    try:
        os.close(fd)
    except OSError as e:
        raise _error(e.errno, what, path) from None


_RESULT_LINE = re.compile(r"([0-9a-f]{64}) 0")  # the line of a record that committed


def _parse_results(text: bytes, path: str) -> list[PutResult]:
    results = []
    for line in text.decode("ascii", "replace").splitlines():
        ok = _RESULT_LINE.fullmatch(line)
        if ok:
            results.append(PutResult(KEY_PREFIX + ok.group(1), 0))
            continue
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 2:
            raise _error(errno.EIO, f"unexpected result line {line[:80]!r}", path)
        key, status = fields
        if _HEX64.fullmatch(key):
            key = KEY_PREFIX + key
        code = int(status) if status.isdigit() else _ERRNO_NAMES.get(status)
        if code is None:
            raise _error(errno.EIO, f"unexpected result {status[:40]!r} for {key[:80]}", path)
        results.append(PutResult(key, code))
    return results


def _batch(weight_version: str | None, records: Sequence[Record],
           mnt: str) -> tuple[str, list[Envelope]]:
    """The batch file and the pieces to write to it, in order."""
    parts: list[Envelope] = []
    if weight_version is None:
        for record in records:
            if isinstance(record, tuple):
                raise TypeError("publish_many(None, ...) takes envelopes, not (hash, envelope) pairs")
            parts.append(record)
        return os.path.join(mnt, ".keys", ".put"), parts
    for record in records:
        if not isinstance(record, tuple) or len(record) != 2:
            raise TypeError("publish_many(<wv>, ...) takes (block hash, envelope) pairs")
        block_hash, envelope = record
        parts += [_hash_name(block_hash).encode() + b"\n", envelope]
    return os.path.join(_mkdir_version(mnt, weight_version), ".put"), parts


def _end_batch(fd: int, expect: int) -> bytes:
    """Ends a batch transaction and returns its result lines (expect: their
    bytes at most): a read from offset 0 ends it (one round trip fewer than
    fsync). A daemon older than that answers the read EINVAL: then fsync
    ends it (its errno is the first failing record's, which the lines say
    too) and the read follows."""
    try:
        return _read_all(fd, expect)
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise
    try:
        os.fsync(fd)
    except OSError:
        pass
    return _read_all(fd, expect)


def publish_many(weight_version: str | None, records: Sequence[Record],
                 mount: str | None = None, *, check: bool = False) -> list[PutResult]:
    """Publishes a batch in one transaction (DESIGN.md §3.7): one open, write,
    read of the result lines (which ends the transaction) and close of
    .keys/.put (weight_version None; records are envelopes) or of <wv>/.put
    (records are (block hash, envelope) pairs; the version is created if
    missing).

    Every record commits or fails on its own, as in order; returns one
    PutResult per record. With check=True an OSError with the errno of the
    first failing record is raised instead. A failure of the transaction
    itself (open, write, the results) always raises."""
    if not records:
        return []
    path, parts = _batch(weight_version, records, mount_point(mount))
    what = f"batch publish of {len(records)} records"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError as e:
        raise _error(e.errno, what, path) from None
    try:
        _writev_all(fd, parts)
        text = _end_batch(fd, (len(records) + 1) * _RESULT_LINE_MAX)
    except OSError as e:
        os.close(fd)
        raise _error(e.errno, what, path) from None
    closed = 0
    try:
        os.close(fd)
    except OSError as e:
        closed = e.errno  # the errno of the first failing record
    results = _parse_results(text, path)
    if len(results) != len(records):
        raise _error(closed or errno.EIO,
                     f"{what}: the daemon answered {len(results)} result lines", path)
    failed = [i for i, r in enumerate(results) if not r.ok]
    if closed and not failed:  # the transaction failed, not a record
        raise _error(closed, what, path)
    if check and failed:
        first = results[failed[0]]
        raise _error(first.errno, f"{what}: record {failed[0]}, {first.key}", path)
    return results


# ---- reading --------------------------------------------------------------------------

def _probe(keys_dir: str, hexes: list[str]) -> str:
    """Which key made a .keys/.get fail: the first that cannot be read alone."""
    for h in hexes:
        try:
            _read_file(os.path.join(keys_dir, h))
        except OSError as e:
            return f"{KEY_PREFIX}{h}: {os.strerror(e.errno)}"
    return f"{len(hexes)} keys"


def get_envelopes(keys: Iterable[str], mount: str | None = None) -> list[bytes]:
    """The envelopes of keys, in order, each exactly as published: one
    .keys/.get transaction (DESIGN.md §3.7). Keys are "vllm-artifact/<64
    hex>" (or the bare 64 hex digits). Raises OSError: ENOENT when a key is
    absent, EIO when an object fails its checksum; the message names the
    key."""
    hexes = [_key_hex(k) for k in keys]
    if not hexes:
        return []
    keys_dir = os.path.join(mount_point(mount), ".keys")
    path = os.path.join(keys_dir, ".get")
    what = f"batch read of {len(hexes)} keys"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError as e:
        raise _error(e.errno, what, path) from None
    try:
        _write_all(fd, "".join(h + "\n" for h in hexes).encode())
        data = _read_all(fd)
    except OSError as e:
        culprit = _probe(keys_dir, hexes) if e.errno in (errno.ENOENT, errno.EIO) else ""
        raise _error(e.errno, f"{what}{': ' + culprit if culprit else ''}", path) from None
    finally:
        os.close(fd)
    try:
        envelopes = _split_envelopes(data)
    except EnvelopeError as e:
        raise _error(errno.EIO, f"{what}: the answer does not parse: {e}", path) from None
    if len(envelopes) != len(hexes):
        raise _error(errno.EIO, f"{what}: {len(envelopes)} envelopes came back", path)
    for h, (got, _env) in zip(hexes, envelopes):
        if got != KEY_PREFIX + h:
            raise _error(errno.EIO, f"{what}: asked {KEY_PREFIX}{h}, got {got}", path)
    return [env for _key, env in envelopes]


def read_r3(weight_version: str, block_hash: BlockHash, mount: str | None = None) -> npt.NDArray[Any]:
    """The routed-expert array of one object; raises OSError (EIO if the
    store fails verification, ENOENT if absent)."""
    path = os.path.join(mount_point(mount), weight_version, _hash_name(block_hash))
    try:
        array: npt.NDArray[Any] = np.load(io.BytesIO(_read_file(path)))
        return array
    except OSError as e:
        raise _error(e.errno, f"read of {key_of(weight_version, block_hash)}", path) from None


def r3_attributes(weight_version: str, block_hash: BlockHash,
                  mount: str | None = None) -> dict[str, str]:
    """The user.artfs.* extended attributes of one object, without the prefix."""
    path = os.path.join(mount_point(mount), weight_version, _hash_name(block_hash))
    return {k[len("user.artfs."):]: os.getxattr(path, k).decode()
            for k in os.listxattr(path) if k.startswith("user.artfs.")}


def materialize(weight_version: str, block_hashes: Iterable[BlockHash],
                token_end: int | None = None, block_size: int | None = None,
                mount: str | None = None) -> npt.NDArray[Any]:
    """One request's R3 array (DESIGN.md §3.4) in one .materialize
    transaction. Raises OSError: ENOENT (an object is missing), EIO (one
    fails its checksum), EBADMSG (they do not form the request), EINVAL."""
    lines = []
    if token_end is not None:
        lines.append(f"token_end {int(token_end)}")
    if block_size is not None:
        lines.append(f"block_size {int(block_size)}")
    names = [_hash_name(h) for h in block_hashes]
    lines += names
    path = os.path.join(mount_point(mount), weight_version, ".materialize")
    what = f"materialize of {len(names)} objects"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError as e:
        raise _error(e.errno, what, path) from None
    try:
        _write_all(fd, ("\n".join(lines) + "\n").encode())
        data = _read_all(fd)
    except OSError as e:
        raise _error(e.errno, what, path) from None
    finally:
        os.close(fd)
    array: npt.NDArray[Any] = np.load(io.BytesIO(data))
    return array
