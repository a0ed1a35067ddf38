# SPDX-License-Identifier: Apache-2.0
"""The Python client (contrib/python/artfs) on what needs no GPU: R3 reads,
attributes, materialize, and attach_weights refusing without a mount."""
import errno
import os
import sys

import numpy as np
import pytest

from conftest import publish
from envelope import encode, routed_experts

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "contrib", "python"))
import artfs  # noqa: E402

WV = "default"


def test_read_r3_attributes_and_materialize(mnt):
    os.mkdir(mnt.path(WV))
    blocks = [routed_experts(16, seed=1), routed_experts(16, seed=2), routed_experts(5, seed=3)]
    names = ["aa", "bb", "cc"]
    for i, (h, a) in enumerate(zip(names, blocks)):
        kind = "block" if len(a) == 16 else "tail"
        assert publish(mnt.path(WV, h), encode(WV, h, a, kind=kind, source_token_start=16 * i)) == 0
    assert artfs.is_artfs_mount(mnt.mountpoint)
    assert not artfs.is_artfs_mount("/tmp")
    assert np.array_equal(artfs.read_r3(WV, "aa", mount=mnt.mountpoint), blocks[0])
    assert np.array_equal(artfs.read_r3(WV, bytes.fromhex("bb"), mount=mnt.mountpoint), blocks[1])
    attrs = artfs.r3_attributes(WV, "cc", mount=mnt.mountpoint)
    assert attrs["kind"] == "tail" and attrs["shape"] == "5,48,8" and attrs["source_token_start"] == "32"
    got = artfs.materialize(WV, names, token_end=37, mount=mnt.mountpoint)
    assert np.array_equal(got, np.concatenate(blocks))
    with pytest.raises(OSError) as e:
        artfs.materialize(WV, names, token_end=36, mount=mnt.mountpoint)
    assert e.value.errno == errno.EBADMSG
    with pytest.raises(FileNotFoundError):
        artfs.read_r3(WV, "dd", mount=mnt.mountpoint)


def test_attach_without_a_mount_and_without_a_checkpoint_refuses(tmp_path):
    with pytest.raises(OSError) as e:
        artfs.attach_weights(WV, 0, mount=str(tmp_path))
    assert e.value.errno == errno.ENODEV


def test_quantization_config_hashes_like_jansson():
    # jansson's json_dumps(JSON_SORT_KEYS | JSON_COMPACT): sorted keys, no
    # spaces, reals as %.17g, raw UTF-8.
    qc = {"quant_method": "fp8", "weight_block_size": [128, 128], "scale": 0.1,
          "activation_scheme": "dynamic", "note": "é/\n", "ok": True, "none": None}
    assert artfs._jansson_compact(qc) == (
        '{"activation_scheme":"dynamic","none":null,"note":"é/\\n","ok":true,'
        '"quant_method":"fp8","scale":0.10000000000000001,"weight_block_size":[128,128]}')
