# SPDX-License-Identifier: Apache-2.0
"""The store boundary: objects, the protocol, the error classes."""
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class ArtifactObject:
    key: str
    payload: bytes


class ArtifactStoreError(RuntimeError):
    pass


class ArtifactCapacityError(ArtifactStoreError):
    pass


class ArtifactCorruptionError(ArtifactStoreError):
    pass


class ArtifactNotFoundError(ArtifactStoreError):
    pass


class ArtifactReader(Protocol):
    def get(self, keys: list[str]) -> list[bytes]: ...

    def close(self) -> None: ...


class ArtifactStore(ArtifactReader, Protocol):
    def put(self, objects: list[ArtifactObject]) -> None: ...
