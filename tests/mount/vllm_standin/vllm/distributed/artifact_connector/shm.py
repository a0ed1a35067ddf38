# SPDX-License-Identifier: Apache-2.0
"""vLLM's own store: one directory of files per engine and DP rank in
/dev/shm. What artfs.vllm.register() replaces. Kept to its semantics:
capacity, collisions, missing keys (no locks, no collection here)."""
import hashlib
import os
import re
from pathlib import Path

from vllm.distributed.artifact_connector.store import (
    ArtifactCapacityError,
    ArtifactCorruptionError,
    ArtifactNotFoundError,
)

_STORE_ID = re.compile(r"[a-f0-9]{32,64}")


def make_shm_store_id(instance_id: str, dp_rank: int) -> str:
    return hashlib.sha256(f"{instance_id}:{dp_rank}".encode()).hexdigest()[:32]


class LocalSharedMemoryArtifactReader:
    def __init__(self, root: str, store_id: str) -> None:
        if not _STORE_ID.fullmatch(store_id):
            raise ValueError(f"invalid artifact store id: {store_id!r}")
        self.root = Path(root) / store_id
        self.store_id = store_id
        self.objects_dir = self.root / "objects"

    def _path(self, key: str) -> Path:
        if not key or "\x00" in key:
            raise ValueError("artifact object key must be a non-empty string")
        return self.objects_dir / (hashlib.sha256(key.encode()).hexdigest() + ".bin")

    def get(self, keys: list[str]) -> list[bytes]:
        out = []
        for key in keys:
            try:
                out.append(self._path(key).read_bytes())
            except FileNotFoundError as error:
                raise ArtifactNotFoundError(f"artifact object does not exist: {key}") from error
        return out

    def close(self) -> None:
        pass


class LocalSharedMemoryArtifactStore(LocalSharedMemoryArtifactReader):
    def __init__(self, root: str, instance_id: str, dp_rank: int, *, max_bytes: int,
                 ttl_seconds: int) -> None:
        super().__init__(root, make_shm_store_id(instance_id, dp_rank))
        self.max_bytes = max_bytes
        self.ttl_seconds = ttl_seconds
        self.objects_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._used = sum(p.stat().st_size for p in self.objects_dir.glob("*.bin"))

    def put(self, objects) -> None:
        for obj in objects:
            path = self._path(obj.key)
            if path.exists():
                if path.read_bytes() != obj.payload:
                    raise ArtifactCorruptionError(f"artifact object key collision: {obj.key}")
                continue
            if self._used + len(obj.payload) > self.max_bytes:
                raise ArtifactCapacityError("artifact SHM capacity exceeded")
            partial = path.with_name(path.name + ".partial")
            partial.write_bytes(obj.payload)
            os.replace(partial, path)
            self._used += len(obj.payload)
