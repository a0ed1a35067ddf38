# SPDX-License-Identifier: Apache-2.0
"""An RL stack on upstream vLLM across nodes (DESIGN.md §10, §7; doc/r3.md):
vLLM's auxiliary-output worker (the stand-in in vllm_standin/) puts its
routed-expert blocks through artfs.vllm's plugin on node A; a trainer
process without vLLM on node B reads them by key with
artfs.vllm.get_concatenated, fetched from a real Redis Cluster on
127.0.0.1 (test_remote.py's fixtures), every byte compared. Every wait
bounded."""
import errno
import hashlib
import os
import subprocess
import sys
import textwrap

import numpy as np

from test_python_blocks import PACKAGE, hashes, plugin  # noqa: F401 (a fixture)
from test_remote import cluster, nodes, pytestmark  # noqa: F401 (fixtures, skip without redis)

import artfs.vllm  # noqa: E402
from artfs.vllm import ArtfsBlockObjectStore  # noqa: E402
from vllm.distributed.aux_output_connector.worker import AuxOutputWorkerConnector  # noqa: E402

TRAINER = textwrap.dedent("""
    import hashlib, sys
    import numpy as np
    import artfs.vllm
    keys = sys.stdin.read().split()
    rows = np.frombuffer(artfs.vllm.get_concatenated(keys), np.uint16).reshape(-1, 48, 8)
    print(artfs.vllm.VLLM_BLOCK_CLASSES, rows.shape[0], hashlib.sha256(rows.tobytes()).hexdigest())
    try:
        artfs.vllm.get_concatenated(keys[:1] + ["vllm-artifact/0/" + "00" * 32])
    except artfs.vllm.BlockObjectStoreError as e:
        print("does not exist" in str(e), e.__cause__.errno)
""")


def test_an_engine_on_a_and_a_trainer_on_b(plugin, nodes, monkeypatch):  # noqa: F811
    a, b = nodes("a"), nodes("b")
    monkeypatch.delenv(artfs.vllm.DISABLE_ENV, raising=False)
    monkeypatch.setenv("ARTFS_MOUNT", a.mountpoint)
    assert artfs.vllm.register() is True
    engine = AuxOutputWorkerConnector(shape_per_token=(48, 8), dtype="uint16", block_size=16)
    assert isinstance(engine._store._store, ArtfsBlockObjectStore)
    rng = np.random.default_rng(7)
    rows = rng.integers(0, 512, (20 * 16, 48, 8), dtype=np.uint16)
    keys = engine.keys(hashes(20, seed=7))
    engine.publish(keys, rows)
    np.testing.assert_array_equal(engine.materialize(keys[:3]), rows[:48])
    engine.close()
    ask = keys[::-1] + keys[:2]
    out = subprocess.run([sys.executable, "-c", TRAINER], input="\n".join(ask),
                         env=dict(os.environ, PYTHONPATH=PACKAGE, ARTFS_MOUNT=b.mountpoint),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    want = b"".join(rows[int(i) * 16:(int(i) + 1) * 16].tobytes()
                    for i in [keys.index(k) for k in ask])
    assert out.stdout.split() == ["False", str(len(ask) * 16), hashlib.sha256(want).hexdigest(),
                                  "True", str(errno.ENOENT)]
    assert b.metrics()["artfs_blocks_remote_hits_total"] == len(keys)
