# SPDX-License-Identifier: Apache-2.0
"""Scheduler -> worker -> scheduler messages of the artifact connector."""
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ArtifactCommitRequest:
    request_id: str
    weight_version: str
    block_hashes: Sequence[bytes]
    block_start: int
    hash_block_size: int


@dataclass(frozen=True)
class ArtifactFinalizeRequest:
    request_id: str
    request_attempt_id: str
    weight_version: str
    block_hashes: Sequence[bytes]
    tail_block_hash: bytes | None
    token_end: int
    hash_block_size: int


@dataclass
class ArtifactConnectorMetadata:
    commits: list[ArtifactCommitRequest] = field(default_factory=list)
    finalizes: list[ArtifactFinalizeRequest] = field(default_factory=list)


@dataclass(frozen=True)
class ArtifactFinalizeResult:
    request_id: str
    request_attempt_id: str
    keys: list[str]


@dataclass
class ArtifactConnectorOutput:
    results: list[ArtifactFinalizeResult] = field(default_factory=list)
