# SPDX-License-Identifier: Apache-2.0
"""vLLM's stores over an artfs mount: the artifact connector's (DESIGN.md
§3.6, §3.7) and upstream vLLM's auxiliary outputs' (§10).

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

Upstream vLLM's auxiliary outputs (vllm/distributed/aux_output_connector/)
keep routed-expert blocks, raw bytes under keys "vllm-artifact/<namespace>/
<block hash hex>", in a BlockObjectStore inside the engine's process.
ArtfsBlockObjectStore is that store over the mount's .blocks/ tree: put is
one .blocks/.put transaction, get_concatenated one .blocks/.get; the blocks
are the daemon's, readable by a trainer in another process or, with
remote=, on another node:

    from artfs.vllm import ArtfsBlockObjectStore, BlockObject, get_concatenated
    store = ArtfsBlockObjectStore(object_nbytes=16 * 48 * 8)
    store.put([BlockObject(key, block.tobytes()), ...])
    store.get_concatenated([key, ...])                 # the blocks back to back
    get_concatenated(keys)                             # the same, for a trainer

A refusal, a missing or damaged block and a failure of the mount are
vLLM's BlockObjectStoreError (a same-named class of this module without
vLLM), the daemon's OSError its __cause__; as in vLLM, a payload of the
wrong size is a ValueError and a call after close() a RuntimeError.

register() is the vllm.general_plugins entry point: where an artfs mount is
present it makes vLLM's artifact connector use these classes instead of its
per-engine shared-memory store, and vLLM's auxiliary-output worker build
ArtfsBlockObjectStore where it built its in-process BlockObjectStore.
ARTFS_VLLM_DISABLE=1 turns it off.
"""
from __future__ import annotations

import errno
import importlib
import logging
import os
import re
import sys
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Protocol

from . import blocks, envelope, r3
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

try:
    from vllm.distributed.aux_output_connector.store import BlockObject, BlockObjectStoreError
    VLLM_BLOCK_CLASSES = True
except ImportError:
    from ._vllm_fallback import BlockObject, BlockObjectStoreError
    VLLM_BLOCK_CLASSES = False

__all__ = ["ArtfsArtifactReader", "ArtfsArtifactStore", "ArtifactObject", "ArtifactStoreError",
           "ArtifactCapacityError", "ArtifactCorruptionError", "ArtifactNotFoundError",
           "ArtfsBlockObjectStore", "BlockObject", "BlockObjectStoreError", "get_concatenated",
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


# ---- upstream vLLM's auxiliary outputs: blocks by key ----------------------------------------

_BLOCK_MEANINGS = {
    errno.ENOENT: "auxiliary output object does not exist",
    errno.EIO: "auxiliary output object failed its check in artfs (or the cluster did not "
               "answer)",
    errno.ENOSPC: "auxiliary output store cannot retain the requested batch: the artfs "
                  "blocks tree is full (blocks_capacity=; nothing is evicted)",
    errno.EFBIG: "auxiliary output object is larger than artfs takes (max_object=)",
    errno.EBADMSG: "artfs refused a malformed auxiliary output record",
    errno.EINVAL: "artfs refused a malformed auxiliary output record",
    errno.EACCES: "this user may not put blocks on the artfs mount (its mode bits say no)",
    errno.ENOMEM: "artfs holds too much for open transactions (materialize_max=) to take "
                  "this batch",
    errno.EEXIST: "auxiliary output key collides with another's path in artfs (a block "
                  "where its directory would be, or the reverse)",
}
# A .put that failed whole: its daemon was replaced during it (§8), or the
# cluster did not answer; what it committed is whole, and a retry is safe.
_PUT_FAILED = "artfs did not finish the auxiliary output batch (its daemon restarted, or " \
              "the cluster did not answer); putting it again is safe"
# A .get's answer that does not fit in what the daemon holds for all open
# transactions (materialize_max=): ENOMEM, as for .keys/.get.
_GET_TOO_LARGE = "auxiliary output request is larger than artfs holds for open " \
                 "transactions (materialize_max=); ask for fewer keys at once"


def _block_error(code: int, detail: str, *, get: bool = False) -> BlockObjectStoreError:
    """vLLM's exception for a daemon errno of .blocks/."""
    if get and code == errno.ENOMEM:
        meaning = _GET_TOO_LARGE
    elif not get and code == errno.EIO:
        meaning = _PUT_FAILED
    else:
        meaning = _BLOCK_MEANINGS.get(code, "artfs auxiliary output store failed")
    return BlockObjectStoreError(f"{meaning}: {detail} ({errno.errorcode.get(code, code)})")


def _no_blocks(mount: str) -> BlockObjectStoreError:
    return BlockObjectStoreError(
        f"{mount} is not an artfs mount that serves .blocks/ (no daemon there, or one older "
        "than upstream vLLM's auxiliary outputs)")


def _get_concatenated(keys: Sequence[str], mount: str, object_nbytes: int | None) -> bytes:
    keys = list(keys)
    if not keys:
        return b""
    for key in keys:
        problem = blocks.key_problem(key)
        if problem:
            raise BlockObjectStoreError(
                f"auxiliary output object does not exist: {str(key)[:80]!r} ({problem})")
    expect = len(keys) * object_nbytes if object_nbytes else 0
    try:
        data = blocks.get(keys, mount, expect)
    except OSError as e:
        code = e.errno or errno.EIO
        if code == errno.ENOENT and not os.path.isdir(os.path.join(mount, ".blocks")):
            raise _no_blocks(mount) from e
        raise _block_error(code, str(e), get=True) from e
    if expect and len(data) > expect:
        raise BlockObjectStoreError(
            f"auxiliary output objects are larger than {object_nbytes} bytes: {len(keys)} keys "
            f"gave {len(data)} bytes (blocks of another size under these keys)")
    return data


def get_concatenated(keys: Sequence[str], mount: str | None = None) -> bytes:
    """The blocks of keys, concatenated in the order asked (repeats
    allowed), from the artfs mount ($ARTFS_MOUNT, else /mnt/artifacts): one
    .blocks/.get transaction. For a trainer that holds keys that an engine
    reported: numpy.frombuffer(get_concatenated(keys), dtype).reshape(-1,
    layers, top_k) is the request's routed experts, as vLLM's
    materialize_routed_experts makes them. Raises BlockObjectStoreError:
    a key missing (the message says "does not exist") or malformed, a
    block that fails its check, an answer over materialize_max= (ENOMEM)."""
    return _get_concatenated(keys, mount_point(mount), None)


class ArtfsBlockObjectStore:
    """Upstream vLLM's BlockObjectStore (put, get_concatenated, close) over
    the artfs mount's .blocks/ tree (DESIGN.md §10).

    Retention is the deployment's, not the engine's: max_bytes is checked
    as vLLM checks it and otherwise not used (the daemon's blocks_capacity=
    and ttl= bound the tree, shared by every engine on the node), and
    retain_keys and release_keys are accepted and ignored. A full tree
    refuses a put (BlockObjectStoreError, ENOSPC) and evicts nothing, so
    a block is never missing while a request may still ask for it. The
    first block put under a key stays; another put under it returns
    without error, as vLLM's store does. Thread-safe: every call is a
    transaction of its own."""

    def __init__(self, max_bytes: int | None = None, object_nbytes: int | None = None,
                 mount: str | None = None) -> None:
        if object_nbytes is not None and object_nbytes <= 0:
            raise ValueError("auxiliary output object size must be positive")
        if max_bytes is not None and object_nbytes is not None and max_bytes < object_nbytes:
            raise ValueError("auxiliary output store must fit at least one object")
        self.max_bytes = max_bytes
        # A payload is 1 to object_nbytes bytes (a partial tail is shorter),
        # and get_concatenated reads its answer in one call.
        self.object_nbytes = object_nbytes
        self.mount = mount_point(mount)
        if not os.path.isdir(os.path.join(self.mount, ".blocks")):
            raise _no_blocks(self.mount)
        self._closed = False

    def put(self, objects: Sequence[BlockObject], *, retain_keys: Iterable[str] = (),
            release_keys: Iterable[str] = ()) -> None:
        """Puts objects in one .blocks/.put transaction. A key given twice
        is put once, with its last payload (as vLLM's stores do). Keys and
        sizes are checked first, so a malformed object sends nothing; then
        the daemon commits each block on its own, so the blocks beside a
        refused one are committed. The first refusal raises."""
        if self._closed:
            raise RuntimeError("auxiliary output store is closed")
        unique = {obj.key: obj.payload for obj in objects}
        if not unique:
            return
        limit = self.object_nbytes
        for key, payload in unique.items():
            problem = blocks.key_problem(key)
            if problem:
                raise BlockObjectStoreError(
                    f"auxiliary output key {str(key)[:80]!r} cannot be stored in artfs: {problem}")
            size = memoryview(payload).nbytes
            if size <= 0 or (limit is not None and size > limit):
                raise ValueError(f"auxiliary output object {key} is {size} bytes, not 1 to "
                                 f"{limit if limit is not None else 'any'}")
        records = list(unique.items())
        try:
            codes = blocks.put(records, self.mount)
        except OSError as e:
            if e.errno == errno.ENOENT and not os.path.isdir(os.path.join(self.mount, ".blocks")):
                raise _no_blocks(self.mount) from e
            raise _block_error(e.errno or errno.EIO, str(e)) from e
        failed = [(key, code) for (key, _), code in zip(records, codes) if code]
        if failed:
            key, code = failed[0]
            cause = OSError(code, os.strerror(code), os.path.join(self.mount, ".blocks", ".put"))
            raise _block_error(code, f"{key}; {len(failed)} of {len(records)} blocks refused, "
                               "the others committed") from cause

    def get_concatenated(self, keys: Sequence[str]) -> bytes:
        """The blocks of keys, concatenated in the order asked (repeats
        allowed): one .blocks/.get transaction, checked by the daemon
        before the first byte. A missing key raises BlockObjectStoreError
        ("does not exist"), as does a block that fails its check."""
        if self._closed:
            raise RuntimeError("auxiliary output store is closed")
        return _get_concatenated(keys, self.mount, self.object_nbytes)

    def close(self) -> None:
        """Closes the store (later calls raise RuntimeError, as vLLM's do);
        the blocks stay in the mount for every other reader."""
        self._closed = True

    def __enter__(self) -> ArtfsBlockObjectStore:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


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


class _WorkerBlockObjectStore(ArtfsBlockObjectStore):
    """In place of vLLM's BlockObjectStore(*, max_bytes, object_nbytes,
    policy=None) in its auxiliary-output worker, on the mount register()
    found. Eviction policies are the deployment's."""

    def __init__(self, *, max_bytes: int, object_nbytes: int, policy: object = None) -> None:
        super().__init__(max_bytes=max_bytes, object_nbytes=object_nbytes,
                         mount=_registered_mount)


def _use_artifact_connector(mnt: str) -> tuple[str, bool] | None:
    """The seed's artifact connector builds artfs's store and reader: what
    was switched and whether it was already."""
    try:
        from vllm.distributed.artifact_connector import connector
    except ImportError:
        _log.debug("artfs: this vLLM has no artifact connector")
        return None
    if not os.path.isdir(os.path.join(mnt, ".keys")):
        _log.warning("artfs: the daemon at %s serves no .keys/ (too old); vLLM's artifact "
                     "connector keeps its own artifact store", mnt)
        return None
    names = ("LocalSharedMemoryArtifactStore", "LocalSharedMemoryArtifactReader")
    if not all(hasattr(connector, name) for name in names):
        _log.warning("artfs: vLLM's artifact connector does not build %s here; it keeps its "
                     "own artifact store", " or ".join(names))
        return None
    again = connector.LocalSharedMemoryArtifactStore is _ConnectorStore
    connector.LocalSharedMemoryArtifactStore = _ConnectorStore
    connector.LocalSharedMemoryArtifactReader = _ConnectorReader
    return "vLLM's artifact connector stores R3 objects", again


_AUX = "vllm.distributed.aux_output_connector"


def _use_aux_outputs(mnt: str) -> tuple[str, bool] | None:
    """vLLM's auxiliary-output worker builds ArtfsBlockObjectStore. The
    worker imports BlockObjectStore from the store module and calls it by
    that name, so the name is rebound in both: in the store module for a
    worker imported later, in the worker module if it is imported already.
    The worker module itself (torch, the model executor) is not imported
    here."""
    try:
        store = importlib.import_module(f"{_AUX}.store")
    except ImportError:
        _log.debug("artfs: this vLLM has no auxiliary outputs")
        return None
    if not hasattr(store, "BlockObjectStore"):
        _log.warning("artfs: vLLM's auxiliary outputs have no BlockObjectStore here; they keep "
                     "their own store")
        return None
    if not os.path.isdir(os.path.join(mnt, ".blocks")):
        _log.warning("artfs: the daemon at %s serves no .blocks/ (too old); vLLM's auxiliary "
                     "outputs keep their own store", mnt)
        return None
    worker = sys.modules.get(f"{_AUX}.worker")
    again = store.BlockObjectStore is _WorkerBlockObjectStore and (
        worker is None or getattr(worker, "BlockObjectStore", None) is _WorkerBlockObjectStore)
    store.BlockObjectStore = _WorkerBlockObjectStore
    if worker is not None and hasattr(worker, "BlockObjectStore"):
        worker.BlockObjectStore = _WorkerBlockObjectStore
    return "vLLM's auxiliary outputs store routed-expert blocks", again


def register() -> bool:
    """The vllm.general_plugins entry point: when an artfs mount is present
    ($ARTFS_MOUNT, else /mnt/artifacts), vLLM's artifact connector builds
    ArtfsArtifactStore and ArtfsArtifactReader where it built its
    shared-memory store and reader (the daemon must serve .keys/), and
    vLLM's auxiliary-output worker builds ArtfsBlockObjectStore where it
    built its in-process BlockObjectStore (the daemon must serve
    .blocks/). Logs one line saying what it switched; returns whether it
    switched anything. ARTFS_VLLM_DISABLE=1 turns it off. vLLM may call it
    more than once."""
    global _registered_mount
    if os.environ.get(DISABLE_ENV, "") not in ("", "0"):
        _log.debug("artfs: %s is set; vLLM keeps its own stores", DISABLE_ENV)
        return False
    mnt = mount_point(None)
    if not is_artfs_mount(mnt):
        _log.debug("artfs: no artfs mount at %s; vLLM keeps its own stores", mnt)
        return False
    _registered_mount = mnt
    switched = [done for done in (_use_artifact_connector(mnt), _use_aux_outputs(mnt)) if done]
    fresh = [what for what, again in switched if not again]
    if fresh:
        _log.info("artfs: %s in the artfs mount %s (%s=1 turns this off)", " and ".join(fresh),
                  mnt, DISABLE_ENV)
    return bool(switched)
