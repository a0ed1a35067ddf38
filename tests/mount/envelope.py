# SPDX-License-Identifier: Apache-2.0
"""An R3 envelope encoder written for the tests, independent of artfs's C code.

It follows DESIGN.md §3.1 and what vLLM's encoder writes: u32 little-endian
header length, canonical JSON (sorted keys, "," and ":" separators), payload.
"""
import hashlib
import json
import struct

import numpy as np


def derive_key(weight_version: str, block_hash_hex: str) -> str:
    wv = weight_version.encode()
    h = bytes.fromhex(block_hash_hex)
    msg = struct.pack(">Q", len(wv)) + wv + struct.pack(">Q", len(h)) + h
    return "vllm-artifact/" + hashlib.sha256(msg).hexdigest()


def header_fields(weight_version, block_hash_hex, arr, kind="block", source_token_start=0):
    arr = np.ascontiguousarray(arr)
    return {
        "schema_version": 3,
        "key": derive_key(weight_version, block_hash_hex),
        "kind": kind,
        "field": "routed_experts",
        "dtype": arr.dtype.str,
        "shape": list(arr.shape),
        "source_token_start": source_token_start,
        "payload_sha256": hashlib.sha256(arr.tobytes()).hexdigest(),
    }


def pack(fields, payload: bytes, canonical=True) -> bytes:
    if isinstance(fields, (bytes, bytearray)):
        header = bytes(fields)
    elif canonical:
        header = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
    else:
        header = json.dumps(fields, indent=2).encode()
    return struct.pack("<I", len(header)) + header + payload


def encode(weight_version, block_hash_hex, arr, kind="block", source_token_start=0, **override):
    """Envelope bytes for arr; keyword overrides replace header fields
    (None removes one)."""
    arr = np.ascontiguousarray(arr)
    fields = header_fields(weight_version, block_hash_hex, arr, kind, source_token_start)
    for k, v in override.items():
        if v is None:
            fields.pop(k, None)
        else:
            fields[k] = v
    return pack(fields, arr.tobytes())


def npy_bytes(arr) -> bytes:
    import io
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(arr))
    return buf.getvalue()


def routed_experts(rows, layers=48, top_k=8, dtype=np.uint8, seed=0):
    rng = np.random.default_rng(seed)
    hi = 256 if dtype == np.uint8 else 4096
    return rng.integers(0, hi, size=(rows, layers, top_k), dtype=dtype)
