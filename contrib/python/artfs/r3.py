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
import hashlib
import io
import json
import math
import os
import re
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Union

import numpy as np
import numpy.typing as npt

from .mount import mount_point

__all__ = ["KEY_PREFIX", "SCHEMA_VERSION", "HEADER_MAX", "EnvelopeError", "PutResult",
           "key_of", "encode_envelope", "decode_envelope", "publish", "publish_many",
           "get_envelopes", "read_r3", "r3_attributes", "materialize"]

KEY_PREFIX = "vllm-artifact/"
SCHEMA_VERSION = 3
HEADER_MAX = 4096
NDIM_MAX = 8
FIELDS = frozenset(("schema_version", "key", "kind", "field", "dtype", "shape",
                    "source_token_start", "payload_sha256"))

_U32 = struct.Struct("<I")
_BE64 = struct.Struct(">Q")
_KEY = re.compile(r"vllm-artifact/[0-9a-f]{64}")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_DTYPE = re.compile(r"\|[biu]1|[<>][iu][248]|[<>]f[248]")
_READ_CHUNK = 1 << 22
# A result line of a batch publish: 64 hex (or "-"), a space, an errno name, "\n".
_RESULT_LINE_MAX = 96
_IOV_MAX = 1024  # os.writev takes at most IOV_MAX pieces (1024 on Linux)
_ERRNO_NAMES = {name: code for code, name in errno.errorcode.items()}

BlockHash = Union[bytes, bytearray, str]
"""A KV block hash: its bytes, or their lowercase hex (the file name)."""
Envelope = Union[bytes, bytearray, memoryview]
"""The bytes of one schema-3 envelope."""
Record = Union[Envelope, tuple[BlockHash, Envelope]]
"""A record of publish_many: an envelope (.keys/.put) or (block hash, envelope) (<wv>/.put)."""


class EnvelopeError(ValueError):
    """Bytes that are not a valid schema-3 envelope (what the daemon answers
    with EBADMSG)."""

    errno = errno.EBADMSG


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


# ---- keys -----------------------------------------------------------------------------

def _hash_bytes(block_hash: BlockHash) -> bytes:
    if isinstance(block_hash, str):
        try:
            return bytes.fromhex(block_hash)
        except ValueError:
            raise ValueError(f"block hash {block_hash!r} is not hex") from None
    return bytes(block_hash)


def _hash_name(block_hash: BlockHash) -> str:
    """The object's file name: lowercase hex of the hash bytes."""
    return _hash_bytes(block_hash).hex()


def key_of(weight_version: str, block_hash: BlockHash) -> str:
    """The object key of DESIGN.md §3.1, as vLLM's routed_experts_key derives it:
    "vllm-artifact/" + hex(sha256(be64(len(wv)) ‖ wv ‖ be64(len(h)) ‖ h))."""
    wv = weight_version.encode()
    h = _hash_bytes(block_hash)
    digest = hashlib.sha256()
    for part in (wv, h):
        digest.update(_BE64.pack(len(part)))
        digest.update(part)
    return KEY_PREFIX + digest.hexdigest()


def _key_hex(key: str) -> str:
    """The 64 hex digits of a key given as "vllm-artifact/<64 hex>" or bare."""
    if _KEY.fullmatch(key):
        return key[len(KEY_PREFIX):]
    if _HEX64.fullmatch(key):
        return key
    raise ValueError(f"{key!r} is not an artfs key (\"vllm-artifact/\" + 64 lowercase hex digits)")


# ---- the envelope ---------------------------------------------------------------------

def encode_envelope(array: npt.ArrayLike, *, key: str, kind: str, source_token_start: int,
                    field: str = "routed_experts") -> bytes:
    """The schema-3 envelope of array, byte for byte what vLLM's
    encode_routed_experts_array writes: u32 little-endian header length,
    canonical JSON header (sorted keys, "," and ":"), C-order payload."""
    contiguous = np.ascontiguousarray(array)
    raw = contiguous.tobytes(order="C")
    header = {
        "schema_version": SCHEMA_VERSION,
        "key": key,
        "kind": kind,
        "field": field,
        "dtype": contiguous.dtype.str,
        "shape": list(contiguous.shape),
        "source_token_start": source_token_start,
        "payload_sha256": hashlib.sha256(raw).hexdigest(),
    }
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    if len(text) > HEADER_MAX:
        raise ValueError(f"envelope header of {len(text)} bytes exceeds {HEADER_MAX}")
    return _U32.pack(len(text)) + text + raw


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in pairs:
        if name in out:
            raise EnvelopeError(f"envelope header repeats {name!r}")
        out[name] = value
    return out


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class _Layout:
    """The key of each header of a batch, checked as _parse_header checks
    it, with one JSON parse for headers laid out alike (as the daemon's
    envelope_layout does): a header whose bytes are those of one that
    parsed but for the 64 hex digits of its key and of payload_sha256, and
    the digits of source_token_start when they come after both, is that
    same valid JSON with those values changed. Quotes inside JSON strings
    are escaped, and a header that parsed has only the known members, whose
    strings hold no quote: `"key":"` can only open the key's value. The
    layout is one regular expression of the header that parsed."""

    _HEX = rb"[0-9a-f]{64}"
    _DIGITS = rb"(?:0|[1-9][0-9]{0,17})"  # an integer JSON and the daemon both read

    def __init__(self) -> None:
        self.pattern: re.Pattern[bytes] | None = None

    def key_of(self, data: Envelope) -> str:
        """The key in the envelope's header; EnvelopeError as _parse_header."""
        pattern = self.pattern  # once: another thread may learn a new one meanwhile
        if pattern is not None and len(data) >= _U32.size:
            (h,) = _U32.unpack_from(data, 0)
            if h <= HEADER_MAX and len(data) - _U32.size >= h:
                m = pattern.fullmatch(data, _U32.size, _U32.size + h)
                if m:
                    return "vllm-artifact/" + m.group("key").decode()
        view = memoryview(data)
        parsed, start, _ = _parse_header(view)
        self.pattern = self._learn(bytes(view[_U32.size:start]))
        return parsed["key"]

    @classmethod
    def _learn(cls, header: bytes) -> re.Pattern[bytes] | None:
        runs = []
        for name, opening in ((b"key", b'"key":"vllm-artifact/'), (b"sha", b'"payload_sha256":"')):
            at = header.find(opening)
            pos = at + len(opening)
            if at < 0 or not re.fullmatch(cls._HEX, header[pos:pos + 64]) or header[pos + 64:pos + 65] != b'"':
                return None
            runs.append((pos, pos + 64, b"(?P<key>" + cls._HEX + b")" if name == b"key" else cls._HEX))
        runs.sort()
        at = header.find(b'"source_token_start":')
        pos = at + len(b'"source_token_start":')
        digits = re.match(rb"[0-9]+", header[pos:]) if at >= 0 else None
        if digits and pos > runs[-1][1]:
            runs.append((pos, pos + digits.end(), cls._DIGITS))
        pattern, last = b"", 0
        for begin, end, value in runs:
            pattern += re.escape(header[last:begin]) + value
            last = end
        return re.compile(pattern + re.escape(header[last:]), re.DOTALL)


def _parse_header(data: Envelope, offset: int = 0) -> tuple[dict[str, Any], int, int]:
    """The header of the envelope at offset, validated as DESIGN.md §3.1
    says: (header, payload offset, payload length)."""
    view = memoryview(data)
    if len(view) - offset < _U32.size:
        raise EnvelopeError(f"{len(view) - offset} bytes: no header length")
    (h,) = _U32.unpack_from(view, offset)
    if not 1 <= h <= HEADER_MAX:
        raise EnvelopeError(f"header length {h} outside 1..{HEADER_MAX}")
    start = offset + _U32.size
    if len(view) - start < h:
        raise EnvelopeError(f"header of {h} bytes cut short")
    try:
        header = json.loads(bytes(view[start:start + h]).decode("utf-8"),
                            object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise EnvelopeError(f"header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise EnvelopeError("header is not a JSON object")
    missing = FIELDS - header.keys()
    unknown = header.keys() - FIELDS
    if missing or unknown:
        raise EnvelopeError("header fields: " + ", ".join(
            [f"missing {n!r}" for n in sorted(missing)] + [f"unknown {n!r}" for n in sorted(unknown)]))
    if not _is_int(header["schema_version"]) or header["schema_version"] != SCHEMA_VERSION:
        raise EnvelopeError(f"schema_version is {header['schema_version']!r}, not 3")
    if not isinstance(header["key"], str) or not _KEY.fullmatch(header["key"]):
        raise EnvelopeError(f"key {header['key']!r} is not \"vllm-artifact/\" + 64 hex digits")
    if header["kind"] not in ("block", "tail"):
        raise EnvelopeError(f"kind {header['kind']!r} is not \"block\" or \"tail\"")
    if header["field"] != "routed_experts":
        raise EnvelopeError(f"field {header['field']!r} is not \"routed_experts\"")
    if not isinstance(header["dtype"], str) or not _DTYPE.fullmatch(header["dtype"]):
        raise EnvelopeError(f"unsupported dtype {header['dtype']!r}")
    shape = header["shape"]
    if (not isinstance(shape, list) or not 1 <= len(shape) <= NDIM_MAX
            or not all(_is_int(d) and d > 0 for d in shape)):
        raise EnvelopeError(f"shape {shape!r} is not a list of 1 to {NDIM_MAX} positive integers")
    start_token = header["source_token_start"]
    if not _is_int(start_token) or start_token < 0:
        raise EnvelopeError(f"source_token_start {start_token!r} is not an integer >= 0")
    sha = header["payload_sha256"]
    if not isinstance(sha, str) or not _HEX64.fullmatch(sha):
        raise EnvelopeError("payload_sha256 is not 64 lowercase hex digits")
    payload_len = math.prod(shape) * int(header["dtype"][2])
    return header, start + h, payload_len


def decode_envelope(data: Envelope, *,
                    expected_key: str | None = None) -> tuple[dict[str, Any], npt.NDArray[Any]]:
    """(header, array) of one envelope, validated as the daemon validates a
    publish: exact fields, key form, kind, field, dtype, shape, length and
    SHA-256 of the payload (and the key, when expected_key is given).
    Raises EnvelopeError. The array is a read-only view of data."""
    header, start, payload_len = _parse_header(data)
    view = memoryview(data)
    if len(view) - start != payload_len:
        raise EnvelopeError(f"payload of {len(view) - start} bytes, shape and dtype say {payload_len}")
    raw = view[start:]
    if hashlib.sha256(raw).hexdigest() != header["payload_sha256"]:
        raise EnvelopeError(f"payload checksum mismatch ({header['key']})")
    if expected_key is not None and header["key"] != expected_key:
        raise EnvelopeError(f"envelope holds {header['key']}, not {expected_key}")
    array = np.frombuffer(raw, dtype=np.dtype(header["dtype"])).reshape(header["shape"])
    return header, array


def _split_envelopes(data: Envelope) -> list[tuple[str, bytes]]:
    """Back-to-back envelopes as (key, bytes), cut where each one's header
    says it ends."""
    out: list[tuple[str, bytes]] = []
    view = memoryview(data)
    off = 0
    while off < len(view):
        header, start, payload_len = _parse_header(view, off)
        end = start + payload_len
        if end > len(view):
            raise EnvelopeError(f"envelope at byte {off} cut short")
        out.append((header["key"], bytes(view[off:end])))
        off = end
    return out


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


def _end_batch(fd: int, records: int) -> bytes:
    """Ends a batch transaction and returns its result lines: a read from
    offset 0 ends it (one round trip fewer than fsync). A daemon older than
    that answers the read EINVAL: then fsync ends it (its errno is the
    first failing record's, which the lines say too) and the read follows."""
    expect = (records + 1) * _RESULT_LINE_MAX
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
        text = _end_batch(fd, len(records))
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
