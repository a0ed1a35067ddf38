# SPDX-License-Identifier: Apache-2.0
"""The write-once tree .blocks/ across nodes (DESIGN.md §10, §7): two
daemons with stores of their own over a real Redis Cluster on 127.0.0.1
(test_remote.py's fixtures). An engine puts on A, a trainer gets by key on
B (misses fetched in one pipelined round per node, checked, kept); the
first bytes of a key stay across nodes; with the cluster stopped a put
fails (EIO, nothing committed) and a miss is EIO, within remote_timeout; a
tampered cluster value is never served. Every wait bounded."""
import errno
import os
import signal
import subprocess
import time

from test_remote import cluster, nodes, pytestmark  # noqa: F401 (fixtures)
from test_blocks import BLOCKS, block, get, key, put, read


def test_blocks_put_on_a_are_got_and_read_on_b(nodes, cluster):
    a, b = nodes("a"), nodes("b")
    pairs = [(key(i, ns=str(i % 2)), block(i)) for i in range(64)]
    pairs.append(("r3-tail:" + "cd" * 32, block(99, 700)))
    rc, lines = put(a, pairs)
    assert rc == 0 and [s for _, s in lines] == ["0"] * len(pairs)
    rounds = cluster_rounds(b)
    order = list(range(len(pairs)))[::-1] + [0, 0]
    assert get(b, [pairs[i][0] for i in order]) == b"".join(pairs[i][1] for i in order)
    # One pipelined round per cluster node for all 65 misses (three masters).
    assert cluster_rounds(b) - rounds <= 6
    m = b.metrics()
    assert m["artfs_blocks_remote_hits_total"] == len(pairs)
    assert m["artfs_blocks_files"] == len(pairs)
    # Kept on B: a second get asks nothing of the cluster.
    rounds = cluster_rounds(b)
    assert get(b, [pairs[5][0]]) == pairs[5][1]
    assert cluster_rounds(b) == rounds
    # A block B never held is readable by its path: its directories exist
    # in the cluster because a block under them does.
    c = nodes("c")
    assert read(c.path(BLOCKS, *pairs[7][0].split("/"))) == pairs[7][1]
    assert os.path.isdir(c.path(BLOCKS, "vllm-artifact", "1"))
    assert not os.path.exists(c.path(BLOCKS, "vllm-artifact", "0", "00" * 32))
    assert get(c, [key(1000)]) == errno.ENOENT


def cluster_rounds(m):
    return m.metrics().get("artfs_remote_rounds_total", 0)


def test_the_first_bytes_of_a_key_stay_across_nodes(nodes):
    a, b = nodes("a"), nodes("b")
    k = key(1)
    assert put(a, [(k, block(1))])[0] == 0
    # B puts other bytes under the key without having seen it: 0, and B
    # keeps A's bytes (what other nodes serve), counted and logged.
    assert put(b, [(k, block(2))]) == (0, [[k, "0"]])
    assert get(b, [k]) == block(1)
    assert read(b.path(BLOCKS, k)) == block(1)
    assert b.metrics()["artfs_blocks_collisions_total"] == 1
    assert b.wait_log("put first by another node with other bytes")


def test_with_the_cluster_stopped_a_put_fails_and_commits_nothing(nodes, cluster):
    a, b = nodes("a", remote_timeout="1"), nodes("b", remote_timeout="1")
    assert put(a, [(key(1), block(1))])[0] == 0
    assert put(b, [(key(2), block(2))])[0] == 0
    for pid in cluster.pids():
        os.kill(pid, signal.SIGSTOP)
    try:
        t0 = time.time()
        rc, lines = put(b, [(key(3), block(3))])
        assert rc == errno.EIO and lines == [[key(3), "EIO"]]
        assert time.time() - t0 < 3  # remote_timeout=1: loosely bounded
        assert get(b, [key(3)]) == errno.EIO  # not here, cluster unreachable: EIO
        t0 = time.time()
        assert get(b, [key(1)]) == errno.EIO  # a miss that cannot be asked: EIO
        assert time.time() - t0 < 3
        assert get(b, [key(2)]) == block(2)  # what B holds is served
        assert "refuses puts and misses (EIO)" in b.log()
    finally:
        for pid in cluster.pids():
            os.kill(pid, signal.SIGCONT)
    assert b.metrics()["artfs_blocks_files"] == 1
    # Once the cluster answers again (after the tree's pause), all works.
    deadline = time.time() + 20
    while put(b, [(key(3), block(3))])[0] != 0:
        assert time.time() < deadline, b.log()
        time.sleep(0.5)
    assert get(a, [key(3), key(2)]) == block(3) + block(2)


def test_a_tampered_cluster_value_is_never_served(nodes, cluster):
    a, b = nodes("a"), nodes("b")
    k = key(5)
    assert put(a, [(k, block(5))])[0] == 0
    # The value is the block's SHA-256 then its bytes: one byte changed.
    got = subprocess.run(["redis-cli", "-c", "-h", "127.0.0.1", "-p", str(cluster.base),
                          "--no-raw", "getrange", f"artfs:blk:{k}", "0", "0"],
                         capture_output=True, timeout=10)
    assert got.returncode == 0
    r = subprocess.run(["redis-cli", "-c", "-h", "127.0.0.1", "-p", str(cluster.base),
                        "setrange", f"artfs:blk:{k}", "40", "X"],
                       capture_output=True, timeout=10)
    assert r.returncode == 0 and r.stdout.strip() != b"0", r
    assert get(b, [k]) == errno.ENOENT  # a value that fails its check is no block
    assert not os.path.exists(b.path(BLOCKS, k))
    assert b.wait_log("fails its SHA-256 check")
    assert b.metrics()["artfs_blocks_files"] == 0
