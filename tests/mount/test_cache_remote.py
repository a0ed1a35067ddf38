# SPDX-License-Identifier: Apache-2.0
"""The write-once tree .cache/ across nodes (DESIGN.md §9, remote=): two
daemons with stores of their own over a real Redis Cluster on 127.0.0.1
(test_remote.py's fixtures). What one node commits the other finds, lists
and reads byte for byte; the first bytes of a name stay across nodes; the
cluster stopped is a miss within remote_timeout; a tampered cluster value is
never served. Every wait bounded."""
import hashlib
import os
import shutil
import signal
import subprocess
import time

import pytest

from test_remote import cluster, nodes, pytestmark  # noqa: F401 (fixtures)
from test_cache import blob, read, write_atomic

CACHE = ".cache"


def cache_key(path):
    return f"artfs:cache:{path}"


def test_files_and_directories_made_on_a_are_found_listed_and_read_on_b(nodes):
    a, b = nodes("a"), nodes("b")
    os.makedirs(a.path(CACHE, "inductor", "ab"))
    files = {"inductor/ab/kernel.py": blob(1, 300_000), "inductor/ab/empty": b"",
             "inductor/top.json": blob(2, 100), "triton.txt": blob(3, 7)}
    write_atomic(a.path(CACHE, "inductor", "ab", "kernel.py"), files["inductor/ab/kernel.py"])
    with open(a.path(CACHE, "inductor", "ab", "empty"), "wb"):
        pass
    with open(a.path(CACHE, "inductor", "top.json"), "wb") as f:
        f.write(files["inductor/top.json"])
    with open(a.path(CACHE, "triton.txt"), "wb") as f:
        f.write(files["triton.txt"])

    # B never saw any of it: a directory exists because a file under it does.
    assert os.path.isdir(b.path(CACHE, "inductor", "ab"))
    assert sorted(os.listdir(b.path(CACHE, "inductor", "ab"))) == ["empty", "kernel.py"]
    assert read(b.path(CACHE, "inductor", "ab", "kernel.py")) == files["inductor/ab/kernel.py"]
    assert read(b.path(CACHE, "inductor", "ab", "empty")) == b""
    # A listing shows what other nodes committed before any lookup of it.
    assert "top.json" in os.listdir(b.path(CACHE, "inductor"))
    assert "triton.txt" in os.listdir(b.path(CACHE))
    for rel, data in files.items():
        assert read(b.path(CACHE, *rel.split("/"))) == data, rel
    m = b.metrics()
    assert m["artfs_cache_remote_hits_total"] == len(files)
    # Kept on B: its own entries from now on (a second read fetches nothing).
    read(b.path(CACHE, "triton.txt"))
    assert b.metrics()["artfs_cache_remote_hits_total"] == len(files)
    assert not os.path.exists(b.path(CACHE, "inductor", "nothing"))


def test_other_bytes_committed_on_b_after_a_keep_a_s(nodes):
    a, b = nodes("a"), nodes("b")
    first, second = blob(10, 5000), blob(11, 6000)
    os.makedirs(a.path(CACHE, "d"))
    with open(a.path(CACHE, "d", "f"), "wb") as f:
        f.write(first)
    # B writes the same name without looking first, both directly and by
    # the tools' pattern (a temporary file renamed onto the name).
    os.makedirs(b.path(CACHE, "d"), exist_ok=True)
    with open(b.path(CACHE, "d", "f2.tmp"), "wb") as f:
        f.write(second)
    fd = os.open(b.path(CACHE, "d", "g"), os.O_CREAT | os.O_WRONLY | os.O_EXCL)
    with open(a.path(CACHE, "d", "g"), "wb") as f:
        f.write(first)
    os.write(fd, second)
    os.close(fd)
    assert read(b.path(CACHE, "d", "g")) == first
    assert read(a.path(CACHE, "d", "g")) == first
    os.replace(b.path(CACHE, "d", "f2.tmp"), b.path(CACHE, "d", "f"))
    assert read(b.path(CACHE, "d", "f")) == first
    assert read(a.path(CACHE, "d", "f")) == first
    assert b.metrics()["artfs_cache_collisions_total"] >= 2
    assert b.wait_log("committed first by another node")


def test_the_cluster_stopped_is_a_miss_within_the_timeout(nodes, cluster):
    a, b = nodes("a", remote_timeout="1"), nodes("b", remote_timeout="1")
    with open(b.path(CACHE, "local"), "wb") as f:
        f.write(b"mine")
    with open(a.path(CACHE, "shared"), "wb") as f:
        f.write(b"from a")
    for pid in cluster.pids():
        os.kill(pid, signal.SIGSTOP)
    try:
        t0 = time.time()
        assert not os.path.exists(b.path(CACHE, "shared"))
        assert time.time() - t0 < 3  # remote_timeout=1: loosely bounded
        # The next misses do not each wait for the cluster (a compile makes
        # hundreds): the tree answers from this node alone for a while.
        before = b.metrics()["artfs_remote_errors_total"]
        for i in range(20):
            assert not os.path.exists(b.path(CACHE, f"missing{i}"))
        assert b.metrics()["artfs_remote_errors_total"] - before <= 2
        assert "the cluster does not answer; .cache/ answers from this node alone" in b.log()
        assert read(b.path(CACHE, "local")) == b"mine"
        t0 = time.time()
        assert "local" in os.listdir(b.path(CACHE))
        assert time.time() - t0 < 3 * 2
        # A commit still succeeds here: the cluster is the tool's bonus.
        t0 = time.time()
        with open(b.path(CACHE, "new"), "wb") as f:
            f.write(b"while down")
        assert time.time() - t0 < 3
        assert read(b.path(CACHE, "new")) == b"while down"
    finally:
        for pid in cluster.pids():
            os.kill(pid, signal.SIGCONT)
    assert b.metrics()["artfs_remote_errors_total"] >= 1


def test_a_tampered_cluster_value_is_never_served(nodes, cluster):
    a, b = nodes("a"), nodes("b")
    data = blob(20, 4096)
    with open(a.path(CACHE, "t"), "wb") as f:
        f.write(data)
    bad = bytearray(hashlib.sha256(data).digest() + data)
    bad[-1] ^= 0x40
    r = subprocess.run(["redis-cli", "-c", "-h", "127.0.0.1", "-p", str(cluster.base), "-x",
                        "set", cache_key("t")], input=bytes(bad),
                       capture_output=True, timeout=10)
    assert r.returncode == 0 and b"OK" in r.stdout, r
    assert not os.path.exists(b.path(CACHE, "t"))
    assert b.wait_log("fails its SHA-256 check")
    assert "t" not in os.listdir(b.path(CACHE))
    assert b.metrics()["artfs_cache_remote_hits_total"] == 0
    assert read(a.path(CACHE, "t")) == data  # A's own copy
    # Too short to hold a digest: not served either.
    r = subprocess.run(["redis-cli", "-c", "-h", "127.0.0.1", "-p", str(cluster.base),
                        "set", cache_key("short"), "abc"], capture_output=True, timeout=10)
    assert r.returncode == 0
    assert not os.path.exists(b.path(CACHE, "short"))


def test_a_directory_renamed_into_place_on_a_is_what_b_finds(nodes):
    """DeepGEMM's pattern: a temporary directory, filled, renamed into place."""
    a, b = nodes("a"), nodes("b")
    os.makedirs(a.path(CACHE, "deep_gemm", "tmp.1234", "sub"))
    files = {"k.cubin": blob(30, 2000), "sub/meta": blob(31, 50)}
    for rel, data in files.items():
        with open(a.path(CACHE, "deep_gemm", "tmp.1234", *rel.split("/")), "wb") as f:
            f.write(data)
    os.rename(a.path(CACHE, "deep_gemm", "tmp.1234"), a.path(CACHE, "deep_gemm", "kernel"))
    assert os.listdir(b.path(CACHE, "deep_gemm")) == ["kernel"]
    for rel, data in files.items():
        assert read(b.path(CACHE, "deep_gemm", "kernel", *rel.split("/"))) == data, rel
    assert sorted(os.listdir(b.path(CACHE, "deep_gemm", "kernel"))) == ["k.cubin", "sub"]


def test_rm_rf_on_a_node_stays_done(nodes):
    """An operator clears a directory on A: it does not come back from the
    cluster, on A or on a node that never saw it; B keeps the copies it
    fetched before until it removes them too; a file written again after
    is found everywhere again."""
    a, b = nodes("a"), nodes("b")
    os.makedirs(a.path(CACHE, "ind", "ab"))
    for i in range(5):
        write_atomic(a.path(CACHE, "ind", "ab", f"k{i}"), blob(40 + i, 1000))
    write_atomic(a.path(CACHE, "keep"), blob(50, 10))
    assert sorted(os.listdir(b.path(CACHE, "ind", "ab"))) == [f"k{i}" for i in range(5)]
    r = subprocess.run(["rm", "-rf", a.path(CACHE, "ind")], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert os.listdir(a.path(CACHE)) == ["keep"]
    assert not os.path.exists(a.path(CACHE, "ind", "ab", "k0"))
    c = nodes("c")
    assert os.listdir(c.path(CACHE)) == ["keep"]
    assert not os.path.exists(c.path(CACHE, "ind"))
    assert read(b.path(CACHE, "ind", "ab", "k3")) == blob(43, 1000)  # B's own copy
    r = subprocess.run(["rm", "-rf", b.path(CACHE, "ind")], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(b.path(CACHE))) == ["keep"]
    # Written again on B: every node finds it again.
    os.makedirs(b.path(CACHE, "ind", "ab"))
    write_atomic(b.path(CACHE, "ind", "ab", "k0"), blob(60, 900))
    for m in (a, c):
        assert os.listdir(m.path(CACHE, "ind", "ab")) == ["k0"]
        assert read(m.path(CACHE, "ind", "ab", "k0")) == blob(60, 900)


def _fetch_all(root, names, sizes, q):
    """Reads every name (fetched from the cluster by whichever reader asks
    first), comparing each byte; what went wrong, as a list."""
    bad = []
    for rnd in range(3):
        for i, name in enumerate(names):
            try:
                data = read(os.path.join(root, name))
            except OSError as e:
                bad.append(f"{name}: {e}")
                continue
            if data != blob(100 + i, sizes[i]):
                bad.append(f"{name}: other bytes")
    q.put(bad)


def test_many_readers_on_b_fetch_the_same_entries_at_once(nodes):
    """8 processes on B read the same 12 files that A committed, all at
    once: each is fetched, checked and kept once, and every reader gets
    exactly A's bytes."""
    from conftest import run_processes
    a, b = nodes("a"), nodes("b")
    os.makedirs(a.path(CACHE, "shared", "k"))
    sizes = [1000 + 37_000 * i for i in range(12)]
    names = [f"k/f{i}" for i in range(12)]
    for i, name in enumerate(names):
        write_atomic(a.path(CACHE, "shared", name), blob(100 + i, sizes[i]))
    out = run_processes(_fetch_all, [(b.path(CACHE, "shared"), names, sizes)] * 8, timeout=240)
    assert out == [[]] * 8
    assert sorted(os.listdir(b.path(CACHE, "shared", "k"))) == sorted(f"f{i}" for i in range(12))
    stored = os.listdir(os.path.join(b.store, "cache", "shared", "k"))
    assert sorted(stored) == sorted(f"f{i}" for i in range(12))  # each kept once
    assert b.metrics()["artfs_cache_remote_hits_total"] >= 12


def _churn_node(root, role, seed, q):
    """On one node's mount: a writer (files named for their bytes), a
    reader (every name listed: missing, or exactly its bytes) or a remover
    (rm -rf of whole directories), 12 rounds. Errors a removal racing a
    write or a read explains (ENOENT, ENOTEMPTY, and EEXIST from makedirs)
    are expected; any other, and any wrong byte, is returned."""
    import errno as E
    bad = []
    ok = (E.ENOENT, E.ENOTEMPTY)
    for rnd in range(12):
        d = os.path.join(root, f"d{rnd % 3}")
        try:
            if role == "writer":
                sub = os.path.join(d, f"s{seed}")
                try:
                    os.makedirs(sub, exist_ok=True)
                except FileExistsError:
                    # mkdir found it and a remover took it before makedirs
                    # looked whether it is a directory
                    continue
                write_atomic(os.path.join(sub, f"f{rnd}"), blob(seed * 100 + rnd, 3000 + seed),
                             tmp_name=f".tmp.{os.getpid()}")
            elif role == "remover":
                shutil.rmtree(d, ignore_errors=True)
            else:
                for top, _, files in os.walk(root):
                    for f in files:
                        if f.startswith(".tmp."):
                            continue  # another process's, being renamed
                        s_, r_ = int(os.path.basename(top)[1:]), int(f[1:])
                        try:
                            data = read(os.path.join(top, f))
                        except OSError as e:
                            if e.errno not in ok:
                                bad.append(f"read {top}/{f}: {e}")
                            continue
                        if data != blob(s_ * 100 + r_, 3000 + s_):
                            bad.append(f"{top}/{f}: other bytes")
        except OSError as e:
            if e.errno not in ok:
                bad.append(f"{role} {seed} round {rnd}: {e}")
        time.sleep(0.01)
    q.put(bad)


def test_removals_beside_writers_and_readers_on_two_nodes(nodes):
    """rm -rf on both nodes while writers on both commit into the same
    directories and readers read every name: no error a removal does not
    explain, every byte read is its writer's, on either node, then and
    after."""
    from conftest import run_processes
    a, b = nodes("a"), nodes("b")
    ra, rb = a.path(CACHE, "churn"), b.path(CACHE, "churn")
    os.makedirs(ra)
    args = [(ra, "writer", 1), (rb, "writer", 2), (ra, "writer", 3), (rb, "writer", 4),
            (ra, "remover", 0), (rb, "remover", 0), (ra, "reader", 0), (rb, "reader", 0)]
    out = run_processes(_churn_node, args, timeout=240)
    assert out == [[]] * len(args)
    for m in (a, b):
        for top, _, files in os.walk(m.path(CACHE, "churn")):
            for f in files:
                if f.startswith(".tmp."):
                    # a temporary name the other node committed and had not
                    # renamed yet when a listing here fetched it: its bytes
                    # are a writer's, under a name no tool asks for
                    continue
                s_, r_ = int(os.path.basename(top)[1:]), int(f[1:])
                assert read(os.path.join(top, f)) == blob(s_ * 100 + r_, 3000 + s_)
