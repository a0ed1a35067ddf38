# SPDX-License-Identifier: Apache-2.0
"""artfs from Python: R3 objects as numpy arrays, preloaded GPU weights as
torch tensors that alias the daemon's slabs (no copy).

    import artfs
    arr = artfs.read_r3("default", "3da2892d...")            # numpy.ndarray
    req = artfs.materialize("default", [h0, h1, tail], token_end=40)
    artfs.publish_many("default", [(h0, envelope0), (h1, envelope1)])
    weights = artfs.attach_weights("default", rank=0, checkpoint_dir="/models/x")
    weights["model.embed_tokens.weight"]                       # torch.Tensor on cuda
    artfs.use_cache()          # torch.compile, Triton, vLLM... cache in .cache/

Modules: artfs.envelope (keys and envelopes, without I/O), artfs.r3
(publish, batches, reads through the mount; the envelope's names too),
artfs.weights (GPU weights), artfs.blocks (raw blocks by key in .blocks/),
artfs.vllm (vLLM's artifact store protocol and upstream vLLM's
auxiliary-output store over artfs, and the vllm.general_plugins entry
point), artfs.cache (the environment that points the usual tools at the
write-once tree .cache/).
"""
from .cache import env as cache_env
from .cache import use as use_cache
from .envelope import EnvelopeError, decode_envelope, encode_envelope, key_of
from .mount import DEFAULT_MOUNT, is_artfs_mount, mount_point
from .r3 import PutResult, get_envelopes, materialize, publish, publish_many, r3_attributes, read_r3
from .weights import (AttachedWeights, InPlaceWeights, PublishTensor, _jansson_compact,
                      attach_in_place, attach_weights, fingerprint, manifest_fingerprint, pack_publish,
                      publish_blob)

__version__ = "0.1.0"

__all__ = ["DEFAULT_MOUNT", "mount_point", "is_artfs_mount",
           "key_of", "encode_envelope", "decode_envelope", "EnvelopeError",
           "publish", "publish_many", "PutResult", "get_envelopes",
           "read_r3", "r3_attributes", "materialize",
           "fingerprint", "attach_weights", "AttachedWeights", "manifest_fingerprint",
           "attach_in_place", "InPlaceWeights",
           "PublishTensor", "pack_publish", "publish_blob",
           "cache_env", "use_cache"]
