# SPDX-License-Identifier: Apache-2.0
"""The store boundary of the auxiliary outputs: objects, the error class,
vLLM's in-process store (what artfs.vllm.register() replaces) and the
writer thread that the worker puts through."""
import queue
import threading
from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True)
class BlockObject:
    key: str
    payload: bytes


class BlockObjectStoreError(RuntimeError):
    pass


class BlockObjectStore:
    """Bounded to max_bytes // object_nbytes blocks in this process: the
    least recently used block that no request retains is evicted; a batch
    that cannot fit raises and leaves nothing of itself. The first payload
    put under a key stays. (vLLM keeps the bytes in an anonymous mapping;
    a dict holds them here.)"""

    def __init__(self, *, max_bytes, object_nbytes, policy=None):
        if object_nbytes <= 0:
            raise ValueError("auxiliary output object size must be positive")
        if max_bytes < object_nbytes:
            raise ValueError("auxiliary output store must fit at least one object")
        self.object_nbytes = object_nbytes
        self.num_slots = max_bytes // object_nbytes
        self._blocks = OrderedDict()
        self._references = {}
        self._closed = False

    def put(self, objects, *, retain_keys=(), release_keys=()):
        if self._closed:
            raise RuntimeError("auxiliary output store is closed")
        for key in retain_keys:
            self._references[key] = self._references.get(key, 0) + 1
        for key in release_keys:
            left = self._references[key] - 1
            if left:
                self._references[key] = left
            else:
                del self._references[key]
        batch = {obj.key: obj.payload for obj in objects}
        new = [key for key in batch if key not in self._blocks]
        excess = len(self._blocks) + len(new) - self.num_slots
        victims = [key for key in self._blocks
                   if key not in self._references and key not in batch][:max(excess, 0)]
        if len(victims) < excess:
            raise BlockObjectStoreError("auxiliary output store cannot retain the requested "
                                        f"batch: limit={self.num_slots} objects")
        for key in victims:
            del self._blocks[key]
        for key, payload in batch.items():
            if len(payload) != self.object_nbytes:
                raise ValueError("auxiliary output object has the wrong size")
            self._blocks.setdefault(key, bytes(payload))
            self._blocks.move_to_end(key)

    def get_concatenated(self, keys):
        if self._closed:
            raise RuntimeError("auxiliary output store is closed")
        try:
            out = b"".join(self._blocks[key] for key in keys)
        except KeyError as error:
            raise BlockObjectStoreError(
                "auxiliary output object does not exist; the object may have been evicted "
                f"(limit={self.num_slots} objects)") from error
        for key in keys:
            self._blocks.move_to_end(key)
        return out

    def close(self):
        self._closed = True
        self._blocks.clear()


class BackgroundBlockObjectStore:
    """Puts run in order on one writer thread; a get waits for them. The
    first failure of a put is raised by the next call, as vLLM does."""

    def __init__(self, store, *, max_pending_batches):
        self._store = store
        self._queue = queue.Queue(maxsize=max_pending_batches)
        self._error = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="vllm-aux-output-writer")
        self._thread.start()

    def _run(self):
        while True:
            update = self._queue.get()
            try:
                if update is None:
                    return
                if self._error is None:
                    objects, retain, release = update
                    self._store.put(objects, retain_keys=retain, release_keys=release)
            except BaseException as error:  # noqa: BLE001 (raised by the next call)
                self._error = error
            finally:
                self._queue.task_done()

    def _raise_if_failed(self):
        if self._error is not None:
            raise BlockObjectStoreError("auxiliary output publication failed") from self._error

    def put(self, objects, *, retain_keys=(), release_keys=()):
        retain, release = tuple(retain_keys), tuple(release_keys)
        if not objects and not retain and not release:
            return
        if self._closed:
            raise RuntimeError("auxiliary output store is closed")
        self._queue.put((objects, retain, release))
        self._raise_if_failed()

    def get_concatenated(self, keys):
        self._queue.join()
        self._raise_if_failed()
        return self._store.get_concatenated(keys)

    def close(self):
        if self._closed:
            return
        self._closed = True
        self._queue.join()
        self._queue.put(None)
        self._thread.join()
        self._store.close()
        self._raise_if_failed()
