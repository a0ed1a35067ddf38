# SPDX-License-Identifier: Apache-2.0
"""The scheduler's and the worker's side of the artifact connector. As in
vLLM, this module imports the shared-memory store and reader by name and
builds them from those names: the scheduler a reader, the worker of rank 0
a store. artfs.vllm.register() rebinds the two names here."""
import uuid

import numpy as np

from vllm.distributed.artifact_connector.buffer import RoutedExpertsArtifactBuffer
from vllm.distributed.artifact_connector.protocol import (
    ArtifactConnectorMetadata,
    ArtifactConnectorOutput,
    ArtifactFinalizeRequest,
    ArtifactFinalizeResult,
)
from vllm.distributed.artifact_connector.request_core import (
    RoutedExpertsRequestCore,
    get_routing_shape_and_dtype,
    materialize_routed_experts,
)
from vllm.distributed.artifact_connector.shm import (
    LocalSharedMemoryArtifactReader,
    LocalSharedMemoryArtifactStore,
    make_shm_store_id,
)


class ArtifactSchedulerConnector:
    def __init__(self, vllm_config):
        config = vllm_config.artifact_config
        store_id = make_shm_store_id(vllm_config.instance_id,
                                     vllm_config.parallel_config.data_parallel_rank)
        self._reader = LocalSharedMemoryArtifactReader(config.shm_dir, store_id)
        self._shape_per_token, dtype = get_routing_shape_and_dtype(vllm_config)
        self._dtype = np.dtype(dtype)
        self._weight_version = "default"
        self._pending_finalizes = {}
        self._inflight_finalizes = {}

    def add_finalize(self, request_id, block_hashes, tail_block_hash, token_end,
                     hash_block_size):
        """Stand-in only: vLLM derives this from its Request (KV block hashes
        and the tail's hash) in request_finished()."""
        request = ArtifactFinalizeRequest(
            request_id=request_id, request_attempt_id=uuid.uuid4().hex,
            weight_version=self._weight_version, block_hashes=list(block_hashes),
            tail_block_hash=tail_block_hash, token_end=token_end,
            hash_block_size=hash_block_size)
        self._pending_finalizes[request_id] = request
        return request

    def build_connector_meta(self):
        if not self._pending_finalizes:
            return None
        finalizes = list(self._pending_finalizes.values())
        self._pending_finalizes.clear()
        self._inflight_finalizes.update((r.request_id, r) for r in finalizes)
        return ArtifactConnectorMetadata(finalizes=finalizes)

    def consume_output(self, output):
        materialized = []
        for result in output.results:
            request = self._inflight_finalizes.pop(result.request_id, None)
            if request is None or request.request_attempt_id != result.request_attempt_id:
                raise RuntimeError(
                    f"worker acknowledged an unknown artifact request: {result.request_id}")
            materialized.append((result.request_id, materialize_routed_experts(
                self._reader, result.keys, expected_shape_per_token=self._shape_per_token,
                expected_dtype=self._dtype, expected_token_end=request.token_end,
                hash_block_size=request.hash_block_size)))
        return materialized

    def set_weight_version(self, weight_version):
        self._weight_version = weight_version

    def shutdown(self):
        self._reader.close()


class ArtifactWorkerConnector:
    def __init__(self, vllm_config, capture_state):
        self._capture_state = capture_state
        self._store = None
        self._buffer = None
        self._request_core = None
        if vllm_config.parallel_config.rank != 0:
            return
        config = vllm_config.artifact_config
        self._store = LocalSharedMemoryArtifactStore(
            config.shm_dir,
            vllm_config.instance_id,
            vllm_config.parallel_config.data_parallel_rank,
            max_bytes=config.max_shm_bytes,
            ttl_seconds=config.shm_ttl_seconds,
        )
        shape_per_token, dtype = get_routing_shape_and_dtype(vllm_config)
        self._buffer = RoutedExpertsArtifactBuffer(np.dtype(dtype), shape_per_token)
        self._request_core = RoutedExpertsRequestCore(self._store, self._buffer)

    def start_step(self, metadata, finished_req_ids=None):
        self._capture_state.clear()
        if self._request_core is None:
            return None
        results = []
        if metadata is not None:
            prepared = [self._request_core.prepare_commit(c) for c in metadata.commits]
            if prepared:
                self._request_core.publish_commits(prepared)
            results = [ArtifactFinalizeResult(request_id=f.request_id,
                                              request_attempt_id=f.request_attempt_id,
                                              keys=self._request_core.finalize(f))
                       for f in metadata.finalizes]
        for request_id in finished_req_ids or ():
            self._buffer.discard(request_id)
        return ArtifactConnectorOutput(results=results) if results else None

    def _capture_step(self, request_id, token_start, rows):
        self._buffer.capture(request_id, token_start, rows)

    def shutdown(self):
        if self._store is not None:
            self._store.close()
