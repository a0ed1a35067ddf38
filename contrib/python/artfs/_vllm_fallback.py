# SPDX-License-Identifier: Apache-2.0
"""vLLM's store classes (its artifact connector's and its auxiliary outputs'),
for where vLLM is not installed (a trainer, a test): same names, same
hierarchy, same fields. artfs.vllm uses vLLM's own when it can import them."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ArtifactObject:
    """One immutable, self-describing object: its key and its envelope."""

    key: str
    payload: bytes


class ArtifactStoreError(RuntimeError):
    """Base class for artifact-store failures."""


class ArtifactCapacityError(ArtifactStoreError):
    """The artifact store cannot retain another object (ENOSPC, EFBIG)."""


class ArtifactCorruptionError(ArtifactStoreError):
    """An artifact object failed validation, or its key holds other content
    (EIO, EBADMSG, EEXIST)."""


class ArtifactNotFoundError(ArtifactStoreError):
    """A requested artifact object is not present (ENOENT)."""


# Upstream vLLM's auxiliary outputs (vllm/distributed/aux_output_connector/store.py).

@dataclass(frozen=True)
class BlockObject:
    """One immutable auxiliary output object: its key and its raw bytes."""

    key: str
    payload: bytes


class BlockObjectStoreError(RuntimeError):
    """AuxOutput storage or retrieval failed."""
