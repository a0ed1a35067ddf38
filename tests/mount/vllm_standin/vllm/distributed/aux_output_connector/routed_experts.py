# SPDX-License-Identifier: Apache-2.0
"""Keys, publication and materialization of routed-expert blocks: the
calls that vLLM's worker makes of its store."""
import numpy as np

from vllm.distributed.aux_output_connector.store import BlockObject


def routed_experts_keys(block_hashes, aux_output_namespace):
    return [f"vllm-artifact/{aux_output_namespace}/{h.hex()}" for h in block_hashes]


def publish_routed_experts(store, *, batches, block_size, retain_keys=(), release_keys=()):
    """batches: (a request's keys, [(first token of a block, its rows)]);
    one put of every block, each under the key of its index."""
    objects = []
    for keys, blocks in batches:
        for block_start, rows in blocks:
            if block_start < 0 or block_start % block_size:
                raise ValueError("auxiliary output block start is not hash-block aligned")
            index = block_start // block_size
            if index >= len(keys):
                raise ValueError("auxiliary output block has no corresponding key")
            if len(rows) != block_size:
                raise ValueError("auxiliary output block length does not match hash block size")
            objects.append(BlockObject(key=keys[index],
                                       payload=np.ascontiguousarray(rows).tobytes()))
    store.put(objects, retain_keys=retain_keys, release_keys=release_keys)


def materialize_routed_experts(store, aux_output_keys, *, shape_per_token, dtype):
    if not aux_output_keys:
        raise ValueError("routed-experts auxiliary output key list must not be empty")
    payload = store.get_concatenated(aux_output_keys)
    return np.frombuffer(payload, dtype=dtype).reshape((-1, *shape_per_token))
