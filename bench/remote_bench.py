#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""remote_bench: R3 across nodes through a Redis Cluster (DESIGN.md §7).

    /usr/bin/python3 bench/remote_bench.py <artfs binary> <workdir> [blocks] [rounds]

(workdir holds the daemons' stores: put it on tmpfs, e.g. /dev/shm/rbench,
as the daemon's default store is.)

Starts a loopback cluster (contrib/redis-cluster.sh) and three daemons on
their own stores: A (publishes), B (reads through the cluster), L (no
cluster, the local baseline). Per round:

  materialize  `blocks` blocks of one request, published on A with one
               <wv>/.put; then timed: B materializes them (every object a
               local miss, fetched in one pipelined round per cluster node,
               validated, cached), and A materializes the same request
               (all local). Ratio remote rate / local rate.
  remote read  first read of single objects on B that only A holds:
               p50 and p99 of open+read+close.
  publish      single-object publishes and 64-record .put batches on A
               (with remote=) and on L (without), objects/s and ratio.
Everything is stopped at the end."""
import hashlib
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
CLUSTER = os.path.join(HERE, "..", "contrib", "redis-cluster.sh")
WV = "bench"


def key_of(wv, h):
    w = wv.encode()
    return hashlib.sha256(struct.pack(">Q", len(w)) + w + struct.pack(">Q", len(h)) + h).hexdigest()


def envelope(wv, h, arr, kind, start):
    header = json.dumps({
        "dtype": arr.dtype.str, "field": "routed_experts", "key": "vllm-artifact/" + key_of(wv, h),
        "kind": kind, "payload_sha256": hashlib.sha256(arr.tobytes()).hexdigest(),
        "schema_version": 3, "shape": list(arr.shape), "source_token_start": start,
    }, sort_keys=True, separators=(",", ":")).encode()
    return struct.pack("<I", len(header)) + header + arr.tobytes()


def mount(binary, base, name, opts):
    mnt = os.path.join(base, name)
    os.makedirs(mnt, exist_ok=True)
    o = ",".join([f"store={base}/store-{name}", "capacity=8G"] + opts)
    subprocess.run([binary, "-o", o, mnt], check=True)
    for _ in range(200):
        if os.path.ismount(mnt):
            return mnt
        time.sleep(0.02)
    raise SystemExit(f"{name} did not mount")


def put(mnt, records):
    fd = os.open(os.path.join(mnt, WV, ".put"), os.O_RDWR)
    os.write(fd, b"".join(h.hex().encode() + b"\n" + e for h, e in records))
    os.fsync(fd)
    res = os.pread(fd, 1 << 22, 0).split()
    os.close(fd)
    assert res[1::2] == [b"0"] * len(records), res[:6]


def materialize(mnt, hashes):
    fd = os.open(os.path.join(mnt, WV, ".materialize"), os.O_RDWR)
    os.write(fd, "".join(h.hex() + "\n" for h in hashes).encode())
    out = bytearray()
    while True:
        b = os.pread(fd, 1 << 20, len(out))
        if not b:
            break
        out += b
    os.close(fd)
    return bytes(out)


def main():
    binary, work = sys.argv[1], sys.argv[2]
    blocks = int(sys.argv[3]) if len(sys.argv) > 3 else 2048
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    os.makedirs(work, exist_ok=True)
    cdir = os.path.join(work, "cluster")
    base_port = 14100 + (os.getpid() % 80) * 10
    subprocess.run(["sh", CLUSTER, "start", cdir, str(base_port)], check=True, timeout=120)
    seeds = f"remote=127.0.0.1:{base_port}"
    mounts = []
    try:
        a = mount(binary, work, "a", [seeds]); mounts.append(a)
        b = mount(binary, work, "b", [seeds]); mounts.append(b)
        loc = mount(binary, work, "l", []); mounts.append(loc)
        for m in mounts:
            os.makedirs(os.path.join(m, WV), exist_ok=True)
        rng = np.random.default_rng(7)
        ratios, mrates, lrates = [], [], []
        for r in range(rounds):
            hashes = [rng.bytes(16) for _ in range(blocks)]
            arrs = [rng.integers(0, 256, size=(16, 48, 8), dtype=np.uint8) for _ in range(blocks)]
            recs = [(h, envelope(WV, h, x, "block", 16 * i))
                    for i, (h, x) in enumerate(zip(hashes, arrs))]
            for i in range(0, blocks, 256):
                put(a, recs[i:i + 256])
            t = time.perf_counter(); got_b = materialize(b, hashes); tb = time.perf_counter() - t
            t = time.perf_counter(); got_a = materialize(a, hashes); ta = time.perf_counter() - t
            assert got_a == got_b and len(got_a) > blocks * 6144
            ratios.append(ta / tb)
            mrates.append(blocks / tb)
            lrates.append(blocks / ta)
            print(f"round {r}: materialize {blocks} blocks: remote {tb * 1e3:.1f} ms, "
                  f"local {ta * 1e3:.1f} ms, ratio {ta / tb:.2f}")
        # single remote-object reads
        singles = []
        for i in range(400):
            h = rng.bytes(16)
            e = envelope(WV, h, rng.integers(0, 256, size=(16, 48, 8), dtype=np.uint8), "block", 0)
            singles.append((h, e))
        put(a, singles)
        lat = []
        for h, _ in singles:
            t = time.perf_counter()
            with open(os.path.join(b, WV, h.hex()), "rb") as f:
                f.read()
            lat.append((time.perf_counter() - t) * 1e6)
        lat.sort()
        # publish rates, single and batch, with and without the cluster
        def single_rate(m, n=500):
            objs = [(rng.bytes(16), None) for _ in range(n)]
            objs = [(h, envelope(WV, h, rng.integers(0, 256, size=(16, 48, 8), dtype=np.uint8),
                                 "block", 0)) for h, _ in objs]
            t = time.perf_counter()
            for h, e in objs:
                fd = os.open(os.path.join(m, WV, h.hex()), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
                os.write(fd, e)
                os.close(fd)
            return n / (time.perf_counter() - t)

        def batch_rate(m, n=2048):
            objs = [rng.bytes(16) for _ in range(n)]
            objs = [(h, envelope(WV, h, rng.integers(0, 256, size=(16, 48, 8), dtype=np.uint8),
                                 "block", 0)) for h in objs]
            t = time.perf_counter()
            for i in range(0, n, 64):
                put(m, objs[i:i + 64])
            return n / (time.perf_counter() - t)
        s_r, s_l = single_rate(a), single_rate(loc)
        b_r, b_l = batch_rate(a), batch_rate(loc)
        print()
        print(f"materialize {blocks} blocks through the cluster / locally: "
              f"ratio median {statistics.median(ratios):.2f} "
              f"(remote {statistics.median(mrates):.0f} blocks/s, local {statistics.median(lrates):.0f})")
        print(f"single remote-object first read on B: p50 {lat[len(lat) // 2]:.0f} us, "
              f"p99 {lat[int(len(lat) * 0.99)]:.0f} us ({len(lat)} reads)")
        print(f"single publish: with remote= {s_r:.0f} obj/s, without {s_l:.0f} obj/s, "
              f"ratio {s_r / s_l:.2f}")
        print(f".put of 64: with remote= {b_r:.0f} obj/s, without {b_l:.0f} obj/s, "
              f"ratio {b_r / b_l:.2f}")
    finally:
        for m in mounts:
            subprocess.run(["umount", m])
        subprocess.run(["sh", CLUSTER, "stop", cdir])
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
