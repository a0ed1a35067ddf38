#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""batch_bench: vLLM-style put/get through .keys/.put and .keys/.get against
the raw tmpfs store that vLLM's SHM backend uses, in one process, same data.

    /usr/bin/python3 bench/batch_bench.py <mountpoint> <raw_dir> [objects] [rounds] [batch]

  put   artfs: one .keys/.put of `batch` envelopes (open, writev, read the
        result lines, which ends the batch, close), all results 0, as
        artfs.publish_many does
        raw:   per object: temporary file O_EXCL, write, close, link, unlink
  put vs SHM store: the same artfs put against vLLM's shared-memory store's
        put, step for step (shm_put): what artfs.vllm replaces
  get   artfs: one .keys/.get of `batch` keys (open, write keys, read all, close)
        raw:   per object: open, read, close, parse the header, check the key,
               sha256 of the payload
  vllm put: what an engine calls: artfs.vllm.ArtfsArtifactStore.put of
        `batch` objects (its checks of keys and headers, then one .keys/.put),
        against raw put of the same objects
  single: the same per object through <mnt>/<wv>/<hash> (publish, read .npy)
  null:  one FUSE round trip that the daemon answers at once (stat of
         .artfs/control, whose attributes are never cached)

Prints objects/s of each and the ratio artfs/raw per round, then medians.
Objects are (16, 48, 8) |u1, as in r3_bench, and start where consecutive
16-token blocks of a request start (source_token_start 0, 16, ... 1008), so
their headers differ in those digits as a real engine's do (before
2026-12-02 every object started at 0)."""
import hashlib
import json
import os
import statistics
import struct
import sys
import time
import uuid

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "contrib", "python"))
from artfs.vllm import ArtfsArtifactStore  # noqa: E402

WV = "bench"


def key_of(wv, h):
    w = wv.encode()
    return hashlib.sha256(struct.pack(">Q", len(w)) + w + struct.pack(">Q", len(h)) + h).hexdigest()


def envelope(wv, h, arr, start=0):
    key = key_of(wv, h)
    header = json.dumps({
        "dtype": arr.dtype.str, "field": "routed_experts", "key": "vllm-artifact/" + key,
        "kind": "block", "payload_sha256": hashlib.sha256(arr.tobytes()).hexdigest(),
        "schema_version": 3, "shape": list(arr.shape), "source_token_start": start,
    }, sort_keys=True, separators=(",", ":")).encode()
    return key, struct.pack("<I", len(header)) + header + arr.tobytes()


def make(n, seed):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        h = rng.bytes(32)
        arr = rng.integers(0, 256, size=(16, 48, 8), dtype=np.uint8)
        k, e = envelope(WV, h, arr, (i % 64) * 16)
        out.append((h.hex(), k, e))
    return out


def artfs_put(mnt, objs, batch):
    for i in range(0, len(objs), batch):
        part = objs[i:i + batch]
        fd = os.open(os.path.join(mnt, ".keys", ".put"), os.O_RDWR)
        pieces = [e for _, _, e in part]  # gathered by the kernel, as artfs.publish_many does
        assert os.writev(fd, pieces) == sum(map(len, pieces))
        # the result lines, in one read sized as artfs.publish_many sizes it,
        # which ends the batch
        res = os.pread(fd, (len(part) + 1) * 96 + 1, 0).split()
        os.close(fd)
        assert res[1::2] == [b"0"] * len(part), res[:4]


def artfs_get(mnt, objs, batch):
    for i in range(0, len(objs), batch):
        part = objs[i:i + batch]
        fd = os.open(os.path.join(mnt, ".keys", ".get"), os.O_RDWR)
        os.write(fd, "".join(k + "\n" for _, k, _ in part).encode())
        want = sum(len(e) for _, _, e in part)
        got = os.pread(fd, want + 1, 0)
        os.close(fd)
        assert len(got) == want


class _Object:
    __slots__ = ("key", "payload")

    def __init__(self, key, payload):
        self.key, self.payload = key, payload


def vllm_put(store, objs, batch):
    items = [_Object("vllm-artifact/" + k, e) for _, k, e in objs]
    for i in range(0, len(items), batch):
        store.put(items[i:i + batch])


def raw_put(raw, objs):
    for h, _, e in objs:
        tmp = os.path.join(raw, ".tmp." + h)
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o400)
        os.write(fd, e)
        os.close(fd)
        try:
            os.link(tmp, os.path.join(raw, h))
        except FileExistsError:
            pass
        os.unlink(tmp)


def shm_put(raw, objs):
    """What vLLM's shared-memory artifact store does to put each object
    (LocalSharedMemoryArtifactStore, the store artfs.vllm replaces), step
    for step but with os.path where it uses pathlib: the file is named by
    the SHA-256 of the key; if it exists, nothing more (vLLM then compares
    the bytes; every object here is new); else a uniquely named temporary
    file is made with O_EXCL, sized with posix_fallocate, written, closed,
    linked to the name and unlinked."""
    for _, k, e in objs:
        name = hashlib.sha256(("vllm-artifact/" + k).encode()).hexdigest() + ".bin"
        path = os.path.join(raw, name)
        if os.path.exists(path):
            continue
        tmp = os.path.join(raw, f".{name}.{uuid.uuid4().hex}.partial")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.posix_fallocate(fd, 0, len(e))
        os.write(fd, e)
        os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        os.unlink(tmp)


def raw_get(raw, objs):
    for h, k, _ in objs:
        with open(os.path.join(raw, h), "rb") as f:
            data = f.read()
        (hl,) = struct.unpack_from("<I", data)
        head = json.loads(data[4:4 + hl])
        assert head["key"] == "vllm-artifact/" + key_of(WV, bytes.fromhex(h))
        assert hashlib.sha256(data[4 + hl:]).hexdigest() == head["payload_sha256"]


def single_publish(mnt, objs):
    for h, _, e in objs:
        fd = os.open(os.path.join(mnt, WV, h), os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644)
        os.write(fd, e)
        os.close(fd)


def single_read(mnt, objs):
    for h, _, _ in objs:
        with open(os.path.join(mnt, WV, h), "rb") as f:
            f.read()


def clear(path):
    if os.path.isdir(path):
        for n in os.listdir(path):
            os.unlink(os.path.join(path, n))


def timed(fn, *args):
    t = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t


def setup(defaults):
    """<mountpoint> <raw_dir> and the optional counts after them (defaults
    where left out); both places made ready. Returns mnt, raw, *counts."""
    mnt, raw = sys.argv[1], sys.argv[2]
    counts = [int(sys.argv[3 + i]) if len(sys.argv) > 3 + i else d for i, d in enumerate(defaults)]
    os.makedirs(raw, exist_ok=True)
    os.makedirs(os.path.join(mnt, WV), exist_ok=True)
    return (mnt, raw, *counts)


def main():
    mnt, raw, n, rounds, batch = setup((4096, 3, 64))
    rows = {k: [] for k in ("put", "put vs SHM store", "get", "vllm put", "vllm put vs SHM",
                            "single publish", "single read")}
    store = ArtfsArtifactStore(mnt)
    for r in range(rounds):
        objs = make(n, 1000 + r)
        single = make(n, 5000 + r)
        engine = make(n, 9000 + r)
        clear(raw)
        a_put = timed(artfs_put, mnt, objs, batch)
        r_put = timed(raw_put, raw, objs)
        clear(raw)
        s_put = timed(shm_put, raw, objs)
        clear(raw)
        raw_put(raw, objs)  # what raw_get reads
        a_get = timed(artfs_get, mnt, objs, batch)
        r_get = timed(raw_get, raw, objs)
        clear(raw)
        a_vput = timed(vllm_put, store, engine, batch)
        r_vput = timed(raw_put, raw, engine)
        clear(raw)
        s_vput = timed(shm_put, raw, engine)
        clear(raw)
        a_pub = timed(single_publish, mnt, single)
        r_pub = timed(raw_put, raw, single)
        a_rd = timed(single_read, mnt, single)
        r_rd = timed(raw_get, raw, single)
        for name, a, b in (("put", a_put, r_put), ("put vs SHM store", a_put, s_put),
                           ("get", a_get, r_get), ("vllm put", a_vput, r_vput),
                           ("vllm put vs SHM", a_vput, s_vput),
                           ("single publish", a_pub, r_pub), ("single read", a_rd, r_rd)):
            rows[name].append((n / a, n / b))
            print(f"round {r}: {name:16s} artfs {n / a:9.0f} obj/s  raw {n / b:9.0f} obj/s"
                  f"  ratio {b / a:5.2f}")
        for h, _, _ in objs + single + engine:
            for p in (os.path.join(mnt, ".keys", key_of(WV, bytes.fromhex(h))),):
                try:
                    os.unlink(p)
                except FileNotFoundError:
                    pass
    # One null round trip: a GETATTR the daemon answers at once.
    ctl = os.path.join(mnt, ".artfs", "control")
    t = time.perf_counter()
    for _ in range(20000):
        os.stat(ctl)
    null_us = (time.perf_counter() - t) / 20000 * 1e6
    print()
    print(f"objects per round {n}, batch {batch}, rounds {rounds}")
    print(f"{'phase':16s} {'artfs obj/s':>12s} {'raw obj/s':>12s} {'ratio (median)':>15s}")
    for name, vals in rows.items():
        a = statistics.median(x for x, _ in vals)
        b = statistics.median(y for _, y in vals)
        ratio = statistics.median(x / y for x, y in vals)
        print(f"{name:16s} {a:12.0f} {b:12.0f} {ratio:15.2f}")
    print(f"null FUSE round trip (stat of .artfs/control): {null_us:.1f} us")
    clear(raw)


if __name__ == "__main__":
    main()
