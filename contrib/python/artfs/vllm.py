# SPDX-License-Identifier: Apache-2.0
"""vLLM's artifact store protocol over an artfs mount (DESIGN.md §3.6, §3.7).

vLLM's artifact connector publishes and reads R3 objects through a store
with put(objects), get(keys) and close(), knowing each object only by its
key. ArtfsArtifactStore and ArtfsArtifactReader are such stores: put is one
.keys/.put transaction, get one .keys/.get transaction, and the objects are
the daemon's, shared by every engine and trainer on the node.

    from artfs.vllm import ArtfsArtifactStore, ArtifactObject
    store = ArtfsArtifactStore()                       # $ARTFS_MOUNT or /mnt/artifacts
    store.put([ArtifactObject(key, envelope), ...])
    store.get([key, ...])                              # the envelopes, as published

Errors are vLLM's own classes when vLLM is importable, same-named classes
of this module otherwise: ArtifactCapacityError (ENOSPC, EFBIG),
ArtifactNotFoundError (ENOENT), ArtifactCorruptionError (EIO, EBADMSG,
EEXIST), ArtifactStoreError (anything else; the base of them all, a
RuntimeError). The OSError is the exception's __cause__.

register() is the vllm.general_plugins entry point: where an artfs mount is
present it makes vLLM's artifact connector use these classes instead of its
per-engine shared-memory store. ARTFS_VLLM_DISABLE=1 turns it off.
"""
from __future__ import annotations

import errno
import logging
import os
import re
from collections.abc import Sequence
from types import TracebackType
from typing import Protocol

from . import envelope, r3
from .mount import is_artfs_mount, mount_point

try:
    from vllm.distributed.artifact_connector.store import (
        ArtifactCapacityError,
        ArtifactCorruptionError,
        ArtifactNotFoundError,
        ArtifactObject,
        ArtifactStoreError,
    )
    VLLM_CLASSES = True
except ImportError:
    from ._vllm_fallback import (
        ArtifactCapacityError,
        ArtifactCorruptionError,
        ArtifactNotFoundError,
        ArtifactObject,
        ArtifactStoreError,
    )
    VLLM_CLASSES = False

__all__ = ["ArtfsArtifactReader", "ArtfsArtifactStore", "ArtifactObject", "ArtifactStoreError",
           "ArtifactCapacityError", "ArtifactCorruptionError", "ArtifactNotFoundError",
           "register", "DISABLE_ENV"]

DISABLE_ENV = "ARTFS_VLLM_DISABLE"

# A child of vLLM's logger, so that the line goes where vLLM's own go.
_log = logging.getLogger("vllm.artfs")

_KEY = re.compile(r"vllm-artifact/[0-9a-f]{64}")

_CLASSES: dict[int, type[ArtifactStoreError]] = {
    errno.ENOSPC: ArtifactCapacityError,
    errno.EFBIG: ArtifactCapacityError,
    errno.ENOENT: ArtifactNotFoundError,
    errno.EIO: ArtifactCorruptionError,
    errno.EBADMSG: ArtifactCorruptionError,
    errno.EEXIST: ArtifactCorruptionError,
}

_MEANINGS = {
    errno.ENOSPC: "artfs capacity exceeded",
    errno.EFBIG: "artifact object larger than the daemon's max_object",
    errno.ENOENT: "artifact object does not exist",
    errno.EIO: "artifact object failed verification in the store",
    errno.EBADMSG: "artfs refused a malformed artifact object",
    errno.EEXIST: "artifact object key collision",
    errno.EACCES: "this user may not publish to the artfs mount (its mode bits say no)",
}


def _store_error(code: int, detail: str) -> ArtifactStoreError:
    """vLLM's exception for a daemon errno."""
    meaning = _MEANINGS.get(code, "artfs artifact store failed")
    name = errno.errorcode.get(code, str(code))
    return _CLASSES.get(code, ArtifactStoreError)(f"{meaning}: {detail} ({name})")


class _Object(Protocol):
    """What put takes: vLLM's ArtifactObject or anything shaped like it."""

    @property
    def key(self) -> str: ...

    @property
    def payload(self) -> bytes: ...


class ArtfsArtifactReader:
    """Reads artifact objects by key from an artfs mount: vLLM's
    ArtifactReader protocol (get, close)."""

    def __init__(self, mount: str | None = None) -> None:
        self.mount = mount_point(mount)
        if not os.path.isdir(os.path.join(self.mount, ".keys")):
            raise ArtifactStoreError(
                f"{self.mount} is not an artfs mount that serves .keys/ "
                "(no daemon there, or one older than key-addressed access)")

    def get(self, keys: list[str]) -> list[bytes]:
        """The envelopes of keys, in order, each exactly as published; one
        .keys/.get transaction."""
        keys = list(keys)
        if not keys:
            return []
        for key in keys:
            if not isinstance(key, str) or not _KEY.fullmatch(key):
                raise ArtifactNotFoundError(
                    f"artifact object does not exist: {key!r} (artfs holds only "
                    "\"vllm-artifact/\" + 64 hex digit keys)")
        try:
            return r3.get_envelopes(keys, self.mount)
        except OSError as e:
            raise _store_error(e.errno or errno.EIO, str(e)) from e

    def close(self) -> None:
        """Readers hold nothing open between calls."""

    def __enter__(self) -> ArtfsArtifactReader:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class ArtfsArtifactStore(ArtfsArtifactReader):
    """Publishes and reads artifact objects by key in an artfs mount: vLLM's
    ArtifactStore protocol (put, get, close).

    Capacity, object size limit and expiry are the daemon's (capacity=,
    max_object=, ttl=), shared by every engine on the node. An identical
    re-put succeeds; the same key with other content is a collision
    (ArtifactCorruptionError). Only a user who may publish on the mount
    puts (its mode bits: by default the daemon's user); any user gets."""

    # The layout of the headers put before: headers laid out alike (an
    # engine's encoder writes them all) are checked without a JSON parse.
    _layout: envelope._Layout

    def __init__(self, mount: str | None = None) -> None:
        super().__init__(mount)
        self._layout = envelope._Layout()

    def put(self, objects: Sequence[_Object]) -> None:
        """Publishes objects in one .keys/.put transaction; the first
        failure raises. Keys and envelope headers are checked first, so a
        malformed object sends nothing. Then the daemon commits each object
        on its own, in order: unlike vLLM's SHM store, the objects after a
        failed one are committed too."""
        objects = list(objects)
        if not objects:
            return
        layout = self._layout
        for obj in objects:
            if not isinstance(obj.key, str) or not _KEY.fullmatch(obj.key):
                raise ArtifactCorruptionError(
                    f"artifact object key {obj.key!r} is not \"vllm-artifact/\" + 64 hex digits")
            try:
                inside = layout.key_of(obj.payload)
            except envelope.EnvelopeError as e:
                raise ArtifactCorruptionError(
                    f"artifact object {obj.key} is not a schema-3 envelope: {e}") from e
            if inside != obj.key:
                raise ArtifactCorruptionError(
                    f"artifact object {obj.key} holds the envelope of {inside}")
        try:
            results = r3.publish_many(None, [obj.payload for obj in objects], self.mount)
        except OSError as e:
            raise _store_error(e.errno or errno.EIO, str(e)) from e
        for obj, result in zip(objects, results):
            if not result.ok:
                cause = OSError(result.errno, os.strerror(result.errno),
                                os.path.join(self.mount, ".keys", ".put"))
                raise _store_error(result.errno, obj.key) from cause
            if result.key != obj.key:
                raise ArtifactCorruptionError(
                    f"artfs answered for {result.key} where {obj.key} was put")


# ---- the vLLM plugin -----------------------------------------------------------------------

_registered_mount: str | None = None


class _ConnectorReader(ArtfsArtifactReader):
    """In place of vLLM's LocalSharedMemoryArtifactReader(root, store_id)."""

    def __init__(self, root: str, store_id: str) -> None:
        super().__init__(_registered_mount)
        self.store_id = store_id


class _ConnectorStore(ArtfsArtifactStore):
    """In place of vLLM's LocalSharedMemoryArtifactStore(root, instance_id,
    dp_rank, *, max_bytes, ttl_seconds). The limits are the daemon's."""

    def __init__(self, root: str, instance_id: str, dp_rank: int, *, max_bytes: int,
                 ttl_seconds: int) -> None:
        super().__init__(_registered_mount)


def register() -> bool:
    """The vllm.general_plugins entry point: when an artfs mount with .keys/
    is present ($ARTFS_MOUNT, else /mnt/artifacts), vLLM's artifact
    connector builds ArtfsArtifactStore and ArtfsArtifactReader where it
    built its shared-memory store and reader. Returns whether it did.
    ARTFS_VLLM_DISABLE=1 turns it off. vLLM may call it more than once."""
    global _registered_mount
    if os.environ.get(DISABLE_ENV, "") not in ("", "0"):
        _log.debug("artfs: %s is set; vLLM keeps its own artifact store", DISABLE_ENV)
        return False
    mnt = mount_point(None)
    if not is_artfs_mount(mnt):
        _log.debug("artfs: no artfs mount at %s; vLLM keeps its own artifact store", mnt)
        return False
    if not os.path.isdir(os.path.join(mnt, ".keys")):
        _log.warning("artfs: the daemon at %s serves no .keys/ (too old); vLLM keeps its own "
                     "artifact store", mnt)
        return False
    try:
        from vllm.distributed.artifact_connector import connector
    except ImportError:
        _log.debug("artfs: this vLLM has no artifact connector")
        return False
    names = ("LocalSharedMemoryArtifactStore", "LocalSharedMemoryArtifactReader")
    if not all(hasattr(connector, name) for name in names):
        _log.warning("artfs: vLLM's artifact connector does not build %s here; it keeps its "
                     "own artifact store", " or ".join(names))
        return False
    again = connector.LocalSharedMemoryArtifactStore is _ConnectorStore
    _registered_mount = mnt
    connector.LocalSharedMemoryArtifactStore = _ConnectorStore
    connector.LocalSharedMemoryArtifactReader = _ConnectorReader
    if not again:
        _log.info("artfs: vLLM's artifact connector stores R3 objects in the artfs mount %s "
                  "(%s=1 turns this off)", mnt, DISABLE_ENV)
    return True
