# SPDX-License-Identifier: Apache-2.0
"""R3 across nodes (DESIGN.md §7): two artfs daemons with stores of their own
(two "nodes" on one machine) over a real Redis Cluster on 127.0.0.1
(contrib/redis-cluster.sh: 3 masters, 1 replica each), every wait bounded."""
import errno
import multiprocessing
import os
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest

from conftest import Mount, publish, read_result, run_processes, transact, wait_for
from envelope import derive_key, encode, npy_bytes, routed_experts

WV = "rollout-7"
HERE = os.path.dirname(os.path.abspath(__file__))
CLUSTER_SH = os.path.join(HERE, "..", "..", "contrib", "redis-cluster.sh")

pytestmark = pytest.mark.skipif(
    not (shutil.which("redis-server") and shutil.which("redis-cli")),
    reason="redis-server/redis-cli missing (apt-get install redis-server redis-tools)")


def key_hex(wv, h):
    return derive_key(wv, h).split("/", 1)[1]


class Cluster:
    def __init__(self, base_dir):
        self.dir = os.path.join(base_dir, "cluster")
        self.base = None

    def start(self):
        lo = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
        top = max(lo - 10010, 12000)
        for attempt in range(12):
            base = 11000 + (os.getpid() * 37 + attempt * 617) % max(top - 11000, 100)
            r = subprocess.run(["sh", CLUSTER_SH, "start", self.dir, str(base)],
                               capture_output=True, text=True, timeout=90)
            if r.returncode == 0:
                self.base = base
                return self
        raise AssertionError("no cluster could be started:\n" + r.stderr)

    def stop(self):
        subprocess.run(["sh", CLUSTER_SH, "stop", self.dir], timeout=30)

    @property
    def seeds(self):
        return f"127.0.0.1:{self.base},127.0.0.1:{self.base + 1}"

    def ports(self):
        return [self.base + i for i in range(6)]

    def pids(self):
        out = []
        for p in self.ports():
            try:
                out.append(int(open(os.path.join(self.dir, f"redis-{p}.pid")).read()))
            except (OSError, ValueError):
                pass
        return out

    def cli(self, *args, port=None):
        return subprocess.run(["redis-cli", "-c", "-h", "127.0.0.1", "-p",
                               str(port or self.base), *args],
                              capture_output=True, timeout=10)

    def masters(self):
        out = self.cli("cluster", "nodes").stdout.decode()
        return [int(l.split()[1].split(":")[1].split("@")[0]) for l in out.splitlines()
                if "master" in l.split()[2] and "fail" not in l.split()[2]]


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(str(tmp_path)).start()
    yield c
    for pid in c.pids():
        try:
            os.kill(pid, signal.SIGCONT)
        except OSError:
            pass
    c.stop()


@pytest.fixture
def nodes(tmp_path, cluster):
    made = []

    def node(name, **options):
        # 3 s: a loaded machine (make check runs two suites, each with its
        # cluster, on two cores; the ASan daemon is slow) must not make a
        # healthy cluster look unreachable. Tests of the timeout set 1.
        opts = {"remote": cluster.seeds, "remote_timeout": "3"}
        opts.update(options)
        m = Mount(tmp_path, name, store=str(tmp_path / f"store-{name}"), **opts).start()
        made.append(m)
        return m

    yield node
    for m in made:
        m.stop()


def request(n=3, rows=16):
    arrays = [routed_experts(rows, seed=i) for i in range(n - 1)] + [routed_experts(5, seed=99)]
    hashes = ["%02x" % (0x40 + i) * 8 for i in range(n)]
    envs, start = [], 0
    for i, (h, a) in enumerate(zip(hashes, arrays)):
        envs.append(encode(WV, h, a, kind="block" if a.shape[0] == rows else "tail",
                           source_token_start=start))
        start += a.shape[0]
    return hashes, arrays, envs


def test_published_on_a_readable_on_b_by_every_path(nodes):
    a, b = nodes("a"), nodes("b")
    hashes, arrays, envs = request()
    os.makedirs(a.path(WV), exist_ok=True)
    for h, e in zip(hashes, envs):
        assert publish(a.path(WV, h), e) == 0
    # B never saw the version: it resolves, and each object comes from the cluster.
    assert read_result(b.path(WV, hashes[0])) == npy_bytes(arrays[0])
    assert os.stat(b.path(WV, hashes[1])).st_size == len(npy_bytes(arrays[1]))
    out = subprocess.run(["getfattr", "-n", "user.artfs.key", "--only-values",
                          b.path(WV, hashes[1])], capture_output=True, text=True).stdout
    assert out == derive_key(WV, hashes[1])
    k2 = key_hex(WV, hashes[2])
    assert read_result(b.path(".keys", k2)) == envs[2]
    # .get and .materialize fetch their misses too (a node C that saw nothing).
    c = nodes("c")
    fd = os.open(c.path(".keys", ".get"), os.O_RDWR)
    os.write(fd, "".join(key_hex(WV, h) + "\n" for h in hashes).encode())
    got = os.pread(fd, 1 << 20, 0)
    os.close(fd)
    assert got == b"".join(envs)
    d = nodes("d")
    os.makedirs(d.path(WV), exist_ok=True)
    fd = os.open(d.path(WV, ".materialize"), os.O_RDWR)
    os.write(fd, ("".join(h + "\n" for h in hashes)).encode())
    got = os.pread(fd, 1 << 20, 0)
    os.close(fd)
    assert got == npy_bytes(np.concatenate(arrays))
    # What was fetched is cached here: served with the cluster gone.
    m = b.metrics()
    assert m["artfs_remote_hits_total"] >= 2
    assert os.path.exists(b.store_file(WV, hashes[0]))
    # Absent everywhere: ENOENT, never cached as absent.
    assert read_result(b.path(WV, "ee" * 8)) == "open:ENOENT"
    assert publish(a.path(WV, "ee" * 8), encode(WV, "ee" * 8, routed_experts(3))) == 0
    assert read_result(b.path(WV, "ee" * 8)) == npy_bytes(routed_experts(3))


def put_batch(m, wv, records):
    """<wv>/.put of (hash, envelope) records: the result lines' words."""
    data = b"".join(h.encode() + b"\n" + e for h, e in records)
    return transact(m.path(wv, ".put"), data).decode().split()


def test_collisions_across_nodes(nodes):
    a, b = nodes("a"), nodes("b")
    os.makedirs(a.path(WV), exist_ok=True)
    os.makedirs(b.path(WV), exist_ok=True)
    h = "77" * 8
    assert publish(a.path(WV, h), encode(WV, h, routed_experts(4, seed=1))) == 0
    # B has nothing of it: its publish meets A's in the cluster.
    got = put_batch(b, WV, [(h, encode(WV, h, routed_experts(4, seed=2)))])
    assert got == [key_hex(WV, h), "EEXIST"]
    assert not os.path.exists(b.store_file(WV, h))  # nothing committed on B
    got = put_batch(b, WV, [(h, encode(WV, h, routed_experts(4, seed=1)))])
    assert got == [key_hex(WV, h), "0"]  # identical: 0, and B holds it now
    assert os.path.exists(b.store_file(WV, h))
    assert read_result(b.path(WV, h)) == npy_bytes(routed_experts(4, seed=1))


def test_a_tampered_remote_value_is_eio_and_never_cached(nodes, cluster):
    a, b = nodes("a"), nodes("b")
    os.makedirs(a.path(WV), exist_ok=True)
    h = "99" * 8
    env = encode(WV, h, routed_experts(4))
    assert publish(a.path(WV, h), env) == 0
    bad = bytearray(env)
    bad[-1] ^= 0x40
    r = subprocess.run(["redis-cli", "-c", "-h", "127.0.0.1", "-p", str(cluster.base), "-x",
                        "set", f"artfs:{key_hex(WV, h)}"], input=bytes(bad),
                       capture_output=True, timeout=10)
    assert r.returncode == 0 and b"OK" in r.stdout, r
    assert read_result(b.path(WV, h)).endswith("EIO")
    assert not os.path.exists(b.store_file(WV, h))
    assert b.wait_log("fails validation")
    assert read_result(a.path(WV, h)) == npy_bytes(routed_experts(4))  # A's own copy


def test_the_cluster_stopped_local_hits_served_misses_and_publishes_eio(nodes, cluster):
    a, b = nodes("a", remote_timeout="1"), nodes("b", remote_timeout="1")
    os.makedirs(a.path(WV), exist_ok=True)
    h = "aa" * 8
    assert publish(a.path(WV, h), encode(WV, h, routed_experts(4))) == 0
    for pid in cluster.pids():
        os.kill(pid, signal.SIGSTOP)
    try:
        assert read_result(a.path(WV, h)) == npy_bytes(routed_experts(4))
        t0 = time.time()
        assert read_result(b.path(WV, h)).endswith("EIO")
        assert time.time() - t0 < 4  # remote_timeout=1, with slack for a busy machine
        t0 = time.time()
        # A new name is asked of the cluster first: EIO already at open.
        assert publish(a.path(WV, "ab" * 8), encode(WV, "ab" * 8, routed_experts(4))) \
            in ("open:EIO", "close:EIO", "write:EIO")
        assert time.time() - t0 < 4
        assert not os.path.exists(a.store_file(WV, "ab" * 8))
    finally:
        for pid in cluster.pids():
            os.kill(pid, signal.SIGCONT)
    assert a.metrics()["artfs_remote_errors_total"] >= 1


def test_a_full_cluster_is_enospc(nodes, cluster):
    a = nodes("a")
    os.makedirs(a.path(WV), exist_ok=True)
    for port in cluster.ports():
        cluster.cli("config", "set", "maxmemory-policy", "noeviction", port=port)
        cluster.cli("config", "set", "maxmemory", "1", port=port)
    try:
        got = publish(a.path(WV, "bb" * 8), encode(WV, "bb" * 8, routed_experts(4)))
        assert got == "close:ENOSPC", got
        assert not os.path.exists(a.store_file(WV, "bb" * 8))
    finally:
        for port in cluster.ports():
            cluster.cli("config", "set", "maxmemory", "0", port=port)


def test_a_master_killed_mid_stream_loses_no_committed_object(nodes, cluster):
    a, b = nodes("a", remote_timeout="3"), nodes("b", remote_timeout="3")
    os.makedirs(a.path(WV), exist_ok=True)
    committed = []
    victim = cluster.masters()[0]
    killed = False
    deadline = time.time() + 20
    i = 0
    while time.time() < deadline and i < 200:
        h = "%04x" % i + "cc" * 6
        r = publish(a.path(WV, h), encode(WV, h, routed_experts(2, seed=i)))
        if r == 0:
            committed.append((h, i))
        i += 1
        if i == 20 and not killed:
            pid = int(open(os.path.join(cluster.dir, f"redis-{victim}.pid")).read())
            os.kill(pid, signal.SIGKILL)
            killed = True
    assert killed and len(committed) >= 20
    # After the failover every close() == 0 is readable on B.
    assert wait_for(lambda: read_result(b.path(WV, committed[-1][0])) != "open:EIO", timeout=30)
    for h, seed in committed:
        assert read_result(b.path(WV, h)) == npy_bytes(routed_experts(2, seed=seed)), h


def test_batch_put_with_a_cluster_and_config_lists_the_options(nodes):
    a, b = nodes("a"), nodes("b")
    envs = [encode(WV, "%02x" % i * 8, routed_experts(3, seed=i)) for i in range(8)]
    fd = os.open(a.path(".keys", ".put"), os.O_RDWR)
    os.write(fd, b"".join(envs))
    os.fsync(fd)
    lines = os.pread(fd, 1 << 16, 0).decode().splitlines()
    os.close(fd)
    assert [l.split()[1] for l in lines] == ["0"] * 8
    keys = [l.split()[0] for l in lines]
    fd = os.open(b.path(".keys", ".get"), os.O_RDWR)
    os.write(fd, "".join(k + "\n" for k in keys).encode())
    assert os.pread(fd, 1 << 20, 0) == b"".join(envs)
    os.close(fd)
    cfg = open(a.path(".artfs", "config")).read()
    for opt in ("remote = 127.0.0.1:", "remote_prefix = artfs", "remote_ttl = 3600",
                "remote_timeout = 3", "remote_auth = "):
        assert opt in cfg, cfg
    assert "artfs_remote_latency_seconds_bucket" in open(a.path(".artfs", "metrics")).read()


def test_batch_put_pipelines_queued_and_streamed_records(nodes):
    """A .put larger than one queue, with a record too large to buffer
    (streamed to its publish) and a key twice: every record goes to the
    cluster in a few pipelined rounds, not one round trip each, and B reads
    every one of them."""
    a, b = nodes("a"), nodes("b")
    os.makedirs(a.path(WV), exist_ok=True)
    records = [("%04x" % i, routed_experts(2, seed=i)) for i in range(150)]
    records.insert(70, ("beef03", routed_experts(2800, seed=5)))
    records.append(records[3])
    data = b"".join(h.encode() + b"\n" + encode(WV, h, arr) for h, arr in records)
    before = a.metrics()
    fd = os.open(a.path(WV, ".put"), os.O_RDWR)
    for off in range(0, len(data), 50000):
        os.write(fd, data[off:off + 50000])
    os.fsync(fd)
    lines = os.pread(fd, 1 << 20, 0).decode().splitlines()
    os.close(fd)
    assert lines == [f"{key_hex(WV, h)} 0" for h, _ in records]
    m = a.metrics()
    assert m["artfs_remote_puts_total"] - before["artfs_remote_puts_total"] == 151
    assert m["artfs_remote_rounds_total"] - before["artfs_remote_rounds_total"] <= 3 * 8
    for h, arr in records[60:80] + records[-3:]:
        assert read_result(b.path(WV, h)) == npy_bytes(arr), h


def test_auth_with_a_password_file(nodes, cluster, tmp_path):
    for port in cluster.ports():
        cluster.cli("config", "set", "masterauth", "s3cret", port=port)
        cluster.cli("config", "set", "requirepass", "s3cret", port=port)
    pw = tmp_path / "redis.pass"
    pw.write_text("s3cret\n")
    os.chmod(pw, 0o600)
    a = nodes("a", remote_auth=str(pw))
    b = nodes("b", remote_auth=str(pw))
    nopw = nodes("n")
    os.makedirs(a.path(WV), exist_ok=True)
    h = "ad" * 8
    assert publish(a.path(WV, h), encode(WV, h, routed_experts(4))) == 0
    assert read_result(b.path(WV, h)) == npy_bytes(routed_experts(4))
    # Without the password the cluster answers nothing: EIO, never ENOENT.
    assert read_result(nopw.path(WV, h)).endswith("EIO")


def test_readers_see_no_error_while_slots_move(nodes, cluster):
    a, b = nodes("a", remote_timeout="3"), nodes("b", remote_timeout="3")
    os.makedirs(a.path(WV), exist_ok=True)
    hashes = ["%04x" % i + "5e" * 6 for i in range(1500)]
    envs = [encode(WV, h, routed_experts(2, seed=i)) for i, h in enumerate(hashes)]
    fd = os.open(a.path(WV, ".put"), os.O_RDWR)
    os.write(fd, b"".join(h.encode() + b"\n" + e for h, e in zip(hashes, envs)))
    os.fsync(fd)
    os.close(fd)
    out = cluster.cli("cluster", "nodes").stdout.decode().splitlines()
    masters = [l.split()[0] for l in out if "master" in l.split()[2]]
    mover = subprocess.Popen(
        ["redis-cli", "--cluster", "reshard", f"127.0.0.1:{cluster.base}",
         "--cluster-from", masters[0], "--cluster-to", masters[1],
         "--cluster-slots", "3000", "--cluster-yes", "--cluster-pipeline", "10"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # Every object a local miss on B, fetched while its slot may move.
        for i, h in enumerate(hashes):
            assert read_result(b.path(WV, h)) == npy_bytes(routed_experts(2, seed=i)), h
    finally:
        mover.wait(timeout=120)
    assert mover.returncode == 0
    m = b.metrics()
    assert m["artfs_remote_errors_total"] == 0
    # B learnt the slot map before the move: it was redirected, and said nothing.
    assert sum(v for k, v in m.items() if k.startswith("artfs_remote_redirects_total")) > 0, m


def _remote_reader(mnt, wv, hashes, seed, q):
    import random
    rng = random.Random(seed)
    wrong = errors = 0
    order = list(range(len(hashes)))
    rng.shuffle(order)
    for i in order:
        h = hashes[i]
        try:
            if i % 3 == 0:  # by key, as the envelope
                got = read_result(os.path.join(mnt, ".keys", key_hex(wv, h)))
                wrong += got != encode(wv, h, routed_experts(2, seed=i))
            else:
                got = read_result(os.path.join(mnt, wv, h))
                wrong += got != npy_bytes(routed_experts(2, seed=i))
        except OSError:
            errors += 1
    fd = os.open(os.path.join(mnt, ".keys", ".get"), os.O_RDWR)
    pick = rng.sample(range(len(hashes)), 20)
    os.write(fd, "".join(key_hex(wv, hashes[i]) + "\n" for i in pick).encode())
    got = os.pread(fd, 1 << 20, 0)
    os.close(fd)
    wrong += got != b"".join(encode(wv, hashes[i], routed_experts(2, seed=i)) for i in pick)
    q.put((wrong, errors))


def test_many_readers_fetch_the_same_misses_at_once(nodes):
    """Six processes on B read, by name and by key, and .get the same objects
    that only A holds: each miss is fetched, checked and cached by several
    requests at once (by name and as key-only objects gaining their name)."""
    a, b = nodes("a"), nodes("b")
    os.makedirs(a.path(WV), exist_ok=True)
    hashes = ["%04x" % i + "c4" * 6 for i in range(120)]
    lines = put_batch(a, WV, [(h, encode(WV, h, routed_experts(2, seed=i)))
                              for i, h in enumerate(hashes)])
    assert lines[1::2] == ["0"] * len(hashes)
    results = run_processes(_remote_reader, [(b.mountpoint, WV, hashes, s) for s in range(6)])
    assert results == [(0, 0)] * 6, results
    # One object per key on B, each once in the store.
    assert b.metrics()["artfs_objects"] == len(hashes)
    files = sum(len(f) for _, _, f in os.walk(os.path.join(b.store, "v")))
    assert files == len(hashes)


def get_envelopes(mnt, keys):
    """One .keys/.get of keys on the mount mnt: the envelopes, in order."""
    fd = os.open(os.path.join(mnt, ".keys", ".get"), os.O_RDWR)
    try:
        os.write(fd, "".join(k + "\n" for k in keys).encode())
        return os.pread(fd, 1 << 22, 0)
    finally:
        os.close(fd)


def _remote_batcher(mnt, wv, hashes, seed, start, q):
    import random
    rng = random.Random(seed)
    want_mat = npy_bytes(np.concatenate([routed_experts(2, seed=i) for i in range(len(hashes))]))
    request = "".join(h + "\n" for h in hashes).encode()
    keys = [key_hex(wv, h) for h in hashes]
    want = {k: encode(wv, h, routed_experts(2, seed=i), source_token_start=2 * i)
            for i, (h, k) in enumerate(zip(hashes, keys))}
    start.wait(timeout=60)
    wrong, errors = 0, []
    for _ in range(3):
        try:
            if rng.random() < 0.5:
                fd = os.open(os.path.join(mnt, wv, ".materialize"), os.O_RDWR)
                os.write(fd, request)
                got = os.pread(fd, 1 << 22, 0)
                os.close(fd)
                wrong += got != want_mat
            else:
                pick = rng.sample(keys, 40)
                wrong += get_envelopes(mnt, pick) != b"".join(want[k] for k in pick)
        except OSError as e:
            errors.append(errno.errorcode.get(e.errno, e.errno))
    q.put((wrong, errors))


def test_many_batches_fetch_the_same_misses_at_once(nodes):
    """Six processes on B start together and .materialize a request, or .get
    keys, whose objects only A holds: every batch fetches its misses and is
    served from the bytes it fetched, while the others cache the same keys
    (by name and as key-only objects gaining their name); every byte is
    compared, and B ends with one object and one file per key."""
    a, b = nodes("a"), nodes("b")
    os.makedirs(a.path(WV), exist_ok=True)
    os.makedirs(b.path(WV), exist_ok=True)
    hashes = ["%04x" % i + "d5" * 6 for i in range(96)]
    lines = put_batch(a, WV, [(h, encode(WV, h, routed_experts(2, seed=i), source_token_start=2 * i))
                              for i, h in enumerate(hashes)])
    assert lines[1::2] == ["0"] * len(hashes)
    start = multiprocessing.get_context("fork").Barrier(6)
    results = run_processes(_remote_batcher, [(b.mountpoint, WV, hashes, s, start) for s in range(6)])
    assert results == [(0, [])] * 6, results
    assert b.metrics()["artfs_objects"] <= len(hashes)
    files = sum(len(f) for _, _, f in os.walk(os.path.join(b.store, "v")))
    assert files == b.metrics()["artfs_objects"]


def _remote_putter(mnts, wv, hashes, seed, start, q):
    import random
    rng = random.Random(seed)
    keys = [key_hex(wv, h) for h in hashes]
    envs = [encode(wv, h, routed_experts(3, seed=i), source_token_start=3 * i)
            for i, h in enumerate(hashes)]
    start.wait(timeout=60)
    wrong, errors = 0, []
    for _ in range(4):
        mnt = rng.choice(mnts)
        pick = rng.sample(range(len(hashes)), 40)
        try:
            if rng.random() < 0.5:  # by key, in one write
                out = transact(os.path.join(mnt, ".keys", ".put"), b"".join(envs[i] for i in pick))
            else:                   # by path
                out = transact(os.path.join(mnt, wv, ".put"),
                               b"".join(hashes[i].encode() + b"\n" + envs[i] for i in pick))
            wrong += out.decode() != "".join(f"{keys[i]} 0\n" for i in pick)
            other = rng.choice(mnts)  # every record read back, on either node
            got = get_envelopes(other, [keys[i] for i in pick])
            wrong += got != b"".join(envs[i] for i in pick)
        except OSError as e:
            errors.append(errno.errorcode.get(e.errno, e.errno))
    q.put((wrong, errors))


def test_many_processes_put_the_same_keys_through_both_nodes(nodes):
    """Six processes start together and put batches of the same keys (by key
    and by path, identical content) through A or B, each batch first to the
    cluster in one round and then committed here in order, and read every
    record back through .get on either node: every line is 0, every byte is
    the envelope put, and each node ends with at most one object and one
    file per key."""
    a, b = nodes("a"), nodes("b")
    for m in (a, b):
        os.makedirs(m.path(WV), exist_ok=True)
    hashes = ["%04x" % i + "e6" * 6 for i in range(80)]
    start = multiprocessing.get_context("fork").Barrier(6)
    results = run_processes(_remote_putter, [([a.mountpoint, b.mountpoint], WV, hashes, s, start)
                                             for s in range(6)])
    assert results == [(0, [])] * 6, results
    for m in (a, b):
        objects = m.metrics()["artfs_objects"]
        assert objects <= len(hashes)
        assert sum(len(f) for _, _, f in os.walk(os.path.join(m.store, "v"))) == objects
