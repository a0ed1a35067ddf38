# SPDX-License-Identifier: Apache-2.0
"""The output worker's data plane, reduced to its store: as in vLLM, this
module imports BlockObjectStore from the store module by name and builds
BlockObjectStore(max_bytes=..., object_nbytes=...) from that name, behind
the writer thread. artfs.vllm.register() rebinds the name (here when this
module is imported already, in the store module otherwise)."""
import numpy as np

from vllm.distributed.aux_output_connector.routed_experts import (
    materialize_routed_experts,
    publish_routed_experts,
    routed_experts_keys,
)
from vllm.distributed.aux_output_connector.store import (
    BackgroundBlockObjectStore,
    BlockObjectStore,
)


class AuxOutputWorkerConnector:
    """Stand-in only: vLLM derives the shape, dtype, block size and
    max_bytes from its config, the model and the KV cache config, and
    captures rows on the GPU."""

    def __init__(self, *, shape_per_token, dtype, block_size, max_bytes=None, num_blocks=64,
                 max_num_seqs=4):
        self.shape_per_token = tuple(shape_per_token)
        self.dtype = np.dtype(dtype)
        self.block_size = block_size
        self._generation = 0
        block_nbytes = block_size * int(np.prod(self.shape_per_token)) * self.dtype.itemsize
        if max_bytes is None:
            max_bytes = num_blocks * block_nbytes
        self._store = BackgroundBlockObjectStore(
            BlockObjectStore(max_bytes=max_bytes, object_nbytes=block_nbytes),
            max_pending_batches=2 * max_num_seqs,
        )

    def keys(self, block_hashes):
        return routed_experts_keys(block_hashes, str(self._generation))

    def publish(self, keys, rows, *, retain_keys=(), release_keys=()):
        """The full blocks of one request's rows, from its first token."""
        blocks = [(start, rows[start:start + self.block_size])
                  for start in range(0, len(rows) - self.block_size + 1, self.block_size)]
        publish_routed_experts(self._store, batches=[(keys, blocks)],
                               block_size=self.block_size, retain_keys=retain_keys,
                               release_keys=release_keys)

    def materialize(self, keys):
        return materialize_routed_experts(self._store, keys,
                                          shape_per_token=self.shape_per_token, dtype=self.dtype)

    def reset(self):
        """A prefix-cache reset: a new key namespace."""
        self._generation += 1

    def close(self):
        if self._store is not None:
            self._store.close()
            self._store = None
