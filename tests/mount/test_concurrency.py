"""The paths added for keys and batches, driven by many processes at once
(run against the normal daemon and its ASan/UBSan build): publishes by key
and by path of the same objects (a key-only object gaining its name),
reads by name and by key, .get, .materialize and unlink beside them.
Every byte read is compared; the only refusal allowed is the absence of an
object that another process may just have removed."""
import errno
import multiprocessing
import os
import random
import time

import numpy as np

from envelope import derive_key, encode, npy_bytes, routed_experts

WV = "conc"
POOL = ["%02x" % i * 4 for i in range(24)]          # published, read and removed
STEADY = ["%02x" % (0xa0 + i) * 4 for i in range(4)]  # a request, never removed


def key_hex(h):
    return derive_key(WV, h).split("/", 1)[1]


def envelope(h):
    seed = int(h[:2], 16)
    return encode(WV, h, routed_experts(8, seed=seed), source_token_start=0)


def steady_envelope(i, h):
    return encode(WV, h, routed_experts(8, seed=100 + i), source_token_start=8 * i)


def transact(path, data):
    fd = os.open(path, os.O_RDWR)
    try:
        os.write(fd, data)
        try:
            os.fsync(fd)
        except OSError:
            pass
        out = bytearray()
        while True:
            b = os.pread(fd, 1 << 20, len(out))
            if not b:
                return bytes(out)
            out += b
    finally:
        try:
            os.close(fd)
        except OSError:
            pass


def read(path):
    with open(path, "rb") as f:
        return f.read()


def worker(mnt, seed, seconds, q):
    rng = random.Random(seed)
    counts = {"ops": 0, "wrong": 0, "absent": 0, "errors": []}
    want_npy = {h: npy_bytes(routed_experts(8, seed=int(h[:2], 16))) for h in POOL}
    want_env = {h: envelope(h) for h in POOL}
    request = "".join(h + "\n" for h in STEADY).encode()
    want_mat = npy_bytes(np.concatenate([routed_experts(8, seed=100 + i) for i in range(4)]))
    deadline = time.time() + seconds
    while time.time() < deadline:
        h = rng.choice(POOL)
        op = rng.randrange(7)
        counts["ops"] += 1
        try:
            if op == 0:    # publish by key (a key-only object, or identical: 0)
                out = transact(os.path.join(mnt, ".keys", ".put"), want_env[h]).split()
                if out[1:] != [b"0"]:
                    counts["errors"].append(("put-key", out))
            elif op == 1:  # publish by path: gains the name, or identical
                out = transact(os.path.join(mnt, WV, ".put"), h.encode() + b"\n" + want_env[h]).split()
                if out[1:] != [b"0"]:
                    counts["errors"].append(("put-path", out))
            elif op == 2:
                got = read(os.path.join(mnt, WV, h))
                counts["wrong"] += got != want_npy[h]
            elif op == 3:
                got = read(os.path.join(mnt, ".keys", key_hex(h)))
                counts["wrong"] += got != want_env[h]
            elif op == 4:
                hs = rng.sample(POOL, 3)
                got = transact(os.path.join(mnt, ".keys", ".get"),
                               "".join(key_hex(x) + "\n" for x in hs).encode())
                counts["wrong"] += got != b"".join(want_env[x] for x in hs)
            elif op == 5:
                path = os.path.join(mnt, ".keys", key_hex(h)) if rng.random() < 0.5 \
                    else os.path.join(mnt, WV, h)
                os.unlink(path)
            else:
                got = transact(os.path.join(mnt, WV, ".materialize"), request)
                counts["wrong"] += got != want_mat
        except OSError as e:
            if e.errno == errno.ENOENT:
                counts["absent"] += 1
            else:
                counts["errors"].append((op, errno.errorcode.get(e.errno, e.errno)))
    q.put(counts)


def test_keys_batches_and_removals_from_many_processes(mnt):
    os.makedirs(mnt.path(WV))
    data = b"".join(h.encode() + b"\n" + steady_envelope(i, h) for i, h in enumerate(STEADY))
    assert transact(mnt.path(WV, ".put"), data).split()[1::2] == [b"0"] * 4
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(mnt.mountpoint, s, 6, q)) for s in range(8)]
    for p in procs:
        p.start()
    results = [q.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    assert sum(r["ops"] for r in results) > 200, results
    assert sum(r["wrong"] for r in results) == 0, results
    assert [e for r in results for e in r["errors"]] == [], results
    # The books balance: what is listed is what the store holds, and each
    # listed object reads back exactly.
    # (a close returns before the daemon has handled its release, which
    # gives a result's memory back: wait for the last ones, bounded)
    deadline = time.time() + 10
    while True:
        m = mnt.metrics()
        if (m["artfs_bytes_reserved"] == 0 and m["artfs_materialize_held_bytes"] == 0) \
                or time.time() > deadline:
            break
        time.sleep(0.05)
    keys = os.listdir(mnt.path(".keys"))
    assert m["artfs_objects"] == len(keys)
    assert m["artfs_bytes_reserved"] == 0 and m["artfs_materialize_held_bytes"] == 0, m
    for h in POOL:
        k = key_hex(h)
        if k in keys:
            assert read(mnt.path(".keys", k)) == envelope(h)
    files = sum(len(f) for _, _, f in os.walk(os.path.join(mnt.store, "v")))
    assert files == len(keys)
