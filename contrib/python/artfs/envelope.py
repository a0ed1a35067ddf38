# SPDX-License-Identifier: Apache-2.0
"""The schema-3 envelope of an R3 object (DESIGN.md §3.1), without I/O:
keys, encoding, decoding and validating as the daemon validates a publish,
the layout a batch's headers are checked with, and back-to-back envelopes
split at their own lengths. artfs.r3 does the mount's I/O with it.

    import artfs
    key = artfs.key_of("default", block_hash)                  # "vllm-artifact/<64 hex>"
    env = artfs.encode_envelope(rows, key=key, kind="block", source_token_start=0)
    header, array = artfs.decode_envelope(env, expected_key=key)
"""
from __future__ import annotations

import errno
import hashlib
import json
import math
import re
import struct
from typing import Any, Union

import numpy as np
import numpy.typing as npt

__all__ = ["KEY_PREFIX", "SCHEMA_VERSION", "HEADER_MAX", "EnvelopeError",
           "key_of", "encode_envelope", "decode_envelope"]

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

BlockHash = Union[bytes, bytearray, str]
"""A KV block hash: its bytes, or their lowercase hex (the file name)."""
Envelope = Union[bytes, bytearray, memoryview]
"""The bytes of one schema-3 envelope."""


class EnvelopeError(ValueError):
    """Bytes that are not a valid schema-3 envelope (what the daemon answers
    with EBADMSG)."""

    errno = errno.EBADMSG


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
