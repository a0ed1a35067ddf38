# SPDX-License-Identifier: Apache-2.0
"""The object format (schema-3 envelope, keys) and the request lifecycle
that is the same whatever the store."""
import hashlib
import json
import math
import struct
from dataclasses import dataclass

import numpy as np

from vllm.distributed.artifact_connector.store import ArtifactCorruptionError, ArtifactObject

_LENGTH = struct.Struct("<I")
_HEADER_MAX = 4096


def routed_experts_key(block_hash: bytes, weight_version: str) -> str:
    digest = hashlib.sha256()
    for part in (weight_version.encode(), block_hash):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return "vllm-artifact/" + digest.hexdigest()


def encode_routed_experts_array(*, key, kind, array, source_token_start):
    array = np.ascontiguousarray(array)
    raw = array.tobytes(order="C")
    header = json.dumps({
        "schema_version": 3, "key": key, "kind": kind, "field": "routed_experts",
        "dtype": array.dtype.str, "shape": list(array.shape),
        "source_token_start": source_token_start,
        "payload_sha256": hashlib.sha256(raw).hexdigest(),
    }, sort_keys=True, separators=(",", ":")).encode()
    if len(header) > _HEADER_MAX:
        raise ValueError("artifact object header is too large")
    return _LENGTH.pack(len(header)) + header + raw


def decode_routed_experts_array(payload, *, expected_key):
    if len(payload) < _LENGTH.size:
        raise ArtifactCorruptionError("artifact object is truncated")
    (length,) = _LENGTH.unpack_from(payload)
    if not 0 < length <= _HEADER_MAX:
        raise ArtifactCorruptionError("invalid artifact header length")
    end = _LENGTH.size + length
    if end > len(payload):
        raise ArtifactCorruptionError("artifact header is truncated")
    try:
        header = json.loads(payload[_LENGTH.size:end])
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ArtifactCorruptionError("invalid artifact object header") from error
    if not isinstance(header, dict):
        raise ArtifactCorruptionError("artifact object header must be an object")
    if (header.get("schema_version") != 3 or header.get("key") != expected_key
            or header.get("kind") not in ("block", "tail")
            or header.get("field") != "routed_experts"):
        raise ArtifactCorruptionError("artifact object identity mismatch")
    raw = payload[end:]
    if header.get("payload_sha256") != hashlib.sha256(raw).hexdigest():
        raise ArtifactCorruptionError("artifact payload checksum mismatch")
    try:
        dtype = np.dtype(header["dtype"])
        shape = tuple(int(d) for d in header["shape"])
        start = int(header["source_token_start"])
    except (KeyError, TypeError, ValueError) as error:
        raise ArtifactCorruptionError("invalid artifact array metadata") from error
    if (not shape or shape[0] <= 0 or any(d < 0 for d in shape) or dtype.kind not in "biuf"
            or start < 0 or math.prod(shape) * dtype.itemsize != len(raw)):
        raise ArtifactCorruptionError("invalid artifact array shape")
    return np.frombuffer(raw, dtype=dtype).reshape(shape), header


def materialize_routed_experts(store, artifact_keys, *, expected_shape_per_token=None,
                               expected_dtype=None, expected_token_end=None,
                               hash_block_size=None):
    """One request's rows from its ordered keys, checked as a whole."""
    if not artifact_keys:
        raise ValueError("routed-experts artifact key list must not be empty")
    payloads = store.get(artifact_keys)
    if len(payloads) != len(artifact_keys):
        raise ArtifactCorruptionError("artifact backend returned the wrong object count")
    arrays, next_start, per_token, dtype = [], 0, None, None
    for key, payload in zip(artifact_keys, payloads):
        array, header = decode_routed_experts_array(payload, expected_key=key)
        if int(header["source_token_start"]) != next_start:
            raise ArtifactCorruptionError("artifact keys do not cover one contiguous logical range")
        if expected_token_end is not None:
            if not hash_block_size or hash_block_size <= 0:
                raise ValueError("hash_block_size must be positive")
            rows = min(hash_block_size, expected_token_end - next_start)
            if rows <= 0 or len(array) != rows:
                raise ArtifactCorruptionError(
                    "artifact object does not match the terminal token range")
            if header["kind"] != ("block" if rows == hash_block_size else "tail"):
                raise ArtifactCorruptionError(
                    "artifact object kind does not match the terminal token range")
        if per_token is None:
            per_token, dtype = array.shape[1:], array.dtype
        elif array.shape[1:] != per_token or array.dtype != dtype:
            raise ArtifactCorruptionError("artifact key list mixes array schemas")
        next_start += len(array)
        arrays.append(array)
    if expected_shape_per_token is not None and per_token != expected_shape_per_token:
        raise ArtifactCorruptionError("artifact shape does not match the model")
    if expected_dtype is not None and dtype != expected_dtype:
        raise ArtifactCorruptionError("artifact dtype does not match the model")
    result = np.concatenate(arrays, axis=0)
    if expected_token_end is not None and len(result) != expected_token_end:
        raise ArtifactCorruptionError("artifact keys do not cover the terminal token range")
    return result


def get_routing_shape_and_dtype(vllm_config):
    hf = vllm_config.model_config.hf_text_config
    top_k = getattr(hf, "num_experts_per_tok", None) or getattr(hf, "top_k_experts")
    experts = next(getattr(hf, n) for n in ("num_experts", "n_routed_experts",
                                             "num_local_experts") if hasattr(hf, n))
    return (hf.num_hidden_layers, top_k), ("uint8" if experts <= 256 else "uint16")


@dataclass(frozen=True)
class PreparedCommit:
    request_id: str
    block_end: int
    objects: list


class RoutedExpertsRequestCore:
    """Full blocks are put as they complete; finalize puts the tail (if any)
    and returns the request's ordered keys."""

    def __init__(self, store, source):
        self._store = store
        self._source = source

    def prepare_commit(self, request):
        size = request.hash_block_size
        if request.block_start < 0 or request.block_start % size or not request.block_hashes:
            raise ValueError("invalid artifact full-block commit")
        block_end = request.block_start + len(request.block_hashes) * size
        rows = self._source.read(request.request_id, request.block_start, block_end)
        objects = []
        for i, block_hash in enumerate(request.block_hashes):
            key = routed_experts_key(block_hash, request.weight_version)
            objects.append(ArtifactObject(key=key, payload=encode_routed_experts_array(
                key=key, kind="block", array=rows[i * size:(i + 1) * size],
                source_token_start=request.block_start + i * size)))
        return PreparedCommit(request.request_id, block_end, objects)

    def publish_commits(self, commits):
        self._store.put([obj for commit in commits for obj in commit.objects])
        for commit in commits:
            self._source.release_through(commit.request_id, commit.block_end)

    def _put_tail(self, request, start, end):
        try:
            rows = self._source.read(request.request_id, start, end)
        except RuntimeError:
            # The rows went with a full block already published: cut the
            # tail out of that block.
            index = start // request.hash_block_size
            if index >= len(request.block_hashes):
                raise
            block_key = routed_experts_key(request.block_hashes[index], request.weight_version)
            (payload,) = self._store.get([block_key])
            block, header = decode_routed_experts_array(payload, expected_key=block_key)
            if (header["kind"] != "block" or header["source_token_start"] != start
                    or len(block) != request.hash_block_size
                    or end - start >= request.hash_block_size):
                raise ArtifactCorruptionError("artifact block cannot reconstruct the terminal tail")
            rows = block[:end - start]
        if request.tail_block_hash is None:
            raise RuntimeError("terminal artifact is missing its partial block hash")
        key = routed_experts_key(request.tail_block_hash, request.weight_version)
        self._store.put([ArtifactObject(key=key, payload=encode_routed_experts_array(
            key=key, kind="tail", array=rows, source_token_start=start))])
        return key

    def finalize(self, request):
        if request.token_end <= 0:
            raise ValueError(f"invalid artifact token range: [0, {request.token_end})")
        size = request.hash_block_size
        full_end = request.token_end // size * size
        if len(request.block_hashes) < full_end // size:
            raise RuntimeError("terminal artifact is missing KV-compatible block hashes")
        keys = [routed_experts_key(h, request.weight_version)
                for h in request.block_hashes[:full_end // size]]
        if full_end < request.token_end:
            keys.append(self._put_tail(request, full_end, request.token_end))
        self._source.discard(request.request_id)
        return keys
