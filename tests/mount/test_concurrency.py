# SPDX-License-Identifier: Apache-2.0
"""The paths added for keys and batches, driven by many processes at once
(run against the normal daemon and its ASan/UBSan build): publishes by key
and by path of the same objects (a key-only object gaining its name),
reads by name and by key, .get, .materialize and unlink beside them;
batches whose headers are laid out in several ways; and artfs.vllm's
store and reader from several threads of each process. Every byte read is
compared; the only refusal allowed is the absence of an object that
another process may just have removed (where nothing is removed, none)."""
import errno
import json
import os
import random
import sys
import threading
import time

import numpy as np
import pytest

from conftest import read_to_end, run_processes, transact, wait_for
from envelope import derive_key, encode, header_fields, npy_bytes, pack, routed_experts

PACKAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "contrib", "python")
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


def read(path):
    with open(path, "rb") as f:
        return f.read()


def count_failure(counts, op, e, absent):
    """An OSError of op: an errno in absent counts as the object missing,
    any other is an error of the test."""
    if e.errno in absent:
        counts["absent"] += 1
    else:
        counts["errors"].append((op, errno.errorcode.get(e.errno, e.errno)))


def all_went_well(results, min_ops):
    """The workers' counts: enough operations, nothing wrong, no error."""
    assert sum(r["ops"] for r in results) > min_ops, results
    assert [w for r in results for w in r["wrong"]] == [], results
    assert [e for r in results for e in r["errors"]] == [], results


def books_balance(mnt, objects):
    """Once the last releases are in (bounded wait), the store holds
    exactly `objects` objects, one file each, and nothing reserved."""
    deadline = time.time() + 10
    while time.time() < deadline and mnt.metrics()["artfs_bytes_reserved"]:
        time.sleep(0.05)
    m = mnt.metrics()
    assert m["artfs_objects"] == objects and m["artfs_bytes_reserved"] == 0, m
    assert sum(len(f) for _, _, f in os.walk(os.path.join(mnt.store, "v"))) == objects


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
            # Removed by another process since the lookup: ENOENT, or ESTALE
            # when it went again between the kernel's one retry and its open.
            count_failure(counts, op, e, (errno.ENOENT, errno.ESTALE))
    q.put(counts)


def test_keys_batches_and_removals_from_many_processes(mnt):
    os.makedirs(mnt.path(WV))
    data = b"".join(h.encode() + b"\n" + steady_envelope(i, h) for i, h in enumerate(STEADY))
    assert transact(mnt.path(WV, ".put"), data).split()[1::2] == [b"0"] * 4
    results = run_processes(worker, [(mnt.mountpoint, s, 6) for s in range(8)])
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


# ---- batches whose headers are laid out in several ways ----------------------------
# A batch takes a record's header from the layout of the record before when
# only the hex digits of key and payload_sha256 differ (src/format/envelope.c).
# Here every hash has one envelope of its own, in one of four layouts, and
# batches mix them: the fast path is taken, missed and taken again within a
# batch, from many processes at once.

LWV = "layouts"
GOOD = ["%02x" % i + "7e" * 5 for i in range(48)]
BAD = ["%02x" % i + "ba" * 5 for i in range(8)]   # only ever sent with a damaged payload


def layout_envelope(h):
    i = int(h[:2], 16)
    arr = routed_experts(4 + i % 3, seed=1000 + i)                    # three header lengths
    fields = header_fields(LWV, h, arr)
    if i % 4 == 3:
        return pack(fields, arr.tobytes(), canonical=False)           # indented JSON: parsed
    if i % 4 == 2:
        fields["source_token_start"] = 4 * i                          # other digits, same keys
    return pack(fields, arr.tobytes())


def damaged_envelope(h):
    env = bytearray(layout_envelope(h))
    env[-1] ^= 0xff                    # header as laid out before it, payload not its checksum
    return bytes(env)


def layout_npy(h):
    i = int(h[:2], 16)
    return npy_bytes(routed_experts(4 + i % 3, seed=1000 + i))


def layout_worker(mnt, seed, seconds, q):
    rng = random.Random(seed)
    envs = {h: layout_envelope(h) for h in GOOD}
    keys = {h: derive_key(LWV, h).split("/", 1)[1] for h in GOOD + BAD}
    counts = {"ops": 0, "wrong": [], "absent": 0, "errors": []}
    deadline = time.time() + seconds
    while time.time() < deadline:
        counts["ops"] += 1
        op = rng.randrange(4)
        try:
            if op < 2:     # a batch by key (0) or by path (1), maybe with a damaged record
                hs = rng.sample(GOOD, 20)
                bad = rng.choice(BAD) if rng.random() < 0.5 else None
                if bad:
                    hs.insert(rng.randrange(len(hs) + 1), bad)
                recs = [damaged_envelope(h) if h == bad else envs[h] for h in hs]
                if op == 0:
                    out = transact(os.path.join(mnt, ".keys", ".put"), b"".join(recs))
                else:
                    out = transact(os.path.join(mnt, LWV, ".put"),
                                   b"".join(h.encode() + b"\n" + r for h, r in zip(hs, recs)))
                want = "".join(f"{keys[h]} {'EBADMSG' if h == bad else '0'}\n" for h in hs)
                if out.decode() != want:
                    counts["wrong"].append(("put", op, out[:200]))
            elif op == 2:  # reads by path and by key, every byte compared
                for h in rng.sample(GOOD, 4):
                    if rng.random() < 0.5:
                        got, exp = read(os.path.join(mnt, LWV, h)), layout_npy(h)
                    else:
                        got, exp = read(os.path.join(mnt, ".keys", keys[h])), envs[h]
                    if got != exp:
                        counts["wrong"].append(("read", h))
            else:          # .get of several keys
                hs = rng.sample(GOOD, 6)
                got = transact(os.path.join(mnt, ".keys", ".get"),
                               "".join(keys[h] + "\n" for h in hs).encode())
                if got != b"".join(envs[h] for h in hs):
                    counts["wrong"].append(("get", hs))
        except OSError as e:
            count_failure(counts, op, e, (errno.ENOENT,))  # not published yet by anyone
    q.put(counts)


def test_batches_of_mixed_header_layouts_from_many_processes(mnt):
    os.makedirs(mnt.path(LWV))
    all_went_well(run_processes(layout_worker, [(mnt.mountpoint, s, 5) for s in range(8)]), 80)
    # Every good envelope once more by path, in one batch: 0 each (identical,
    # or a key-only object gaining its name); then each reads back exactly,
    # by key and by path, and no damaged one exists.
    keys = {h: derive_key(LWV, h).split("/", 1)[1] for h in GOOD + BAD}
    out = transact(mnt.path(LWV, ".put"),
                   b"".join(h.encode() + b"\n" + layout_envelope(h) for h in GOOD))
    assert out.decode() == "".join(f"{keys[h]} 0\n" for h in GOOD)
    for h in GOOD:
        assert read(mnt.path(".keys", keys[h])) == layout_envelope(h)
        assert read(mnt.path(LWV, h)) == layout_npy(h)
    for h in BAD:
        assert not os.path.exists(mnt.path(".keys", keys[h]))
        assert not os.path.exists(mnt.path(LWV, h))
    books_balance(mnt, len(GOOD))
    assert sum(len(f) for _, _, f in os.walk(os.path.join(mnt.store, "tmp"))) == 0


# What an engine calls: artfs.vllm.ArtfsArtifactStore.put (its header checks
# answered from the layout of the headers before, kept by the store and
# shared by the threads that use it) beside ArtfsArtifactReader.get, from
# many processes of two threads each. Objects start where a request's
# blocks start (other digits), come in three header lengths, some written
# with spaces (checked by a parse, never learnt); a header that JSON cannot
# read (a start with a leading zero) refuses its whole put, and nothing of
# that put is sent.
VWV = "vput"
VGOOD = ["%02x" % i + "5a" * 6 for i in range(40)]
VBAD = ["%02x" % i + "b0" * 6 for i in range(6)]     # only ever sent unreadable


def vput_envelope(h):
    i = int(h[:2], 16)
    arr = routed_experts(4 + i % 3, seed=2000 + i)
    fields = header_fields(VWV, h, arr, source_token_start=16 * i)
    return pack(fields, arr.tobytes(), canonical=i % 5 != 4)


def vput_unreadable(h):
    i = int(h[:2], 16)
    arr = routed_experts(5, seed=3000 + i)
    fields = header_fields(VWV, h, arr, source_token_start=16 * (i + 1))
    header = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
    header = header.replace(b'"source_token_start":', b'"source_token_start":0')
    return pack(header, arr.tobytes())


def vput_worker(mnt, seed, seconds, q):
    sys.path.insert(0, PACKAGE)
    from artfs.vllm import (ArtfsArtifactReader, ArtfsArtifactStore, ArtifactCorruptionError,
                            ArtifactNotFoundError)

    class Obj:
        def __init__(self, key, payload):
            self.key, self.payload = key, payload

    good = {h: Obj(derive_key(VWV, h), vput_envelope(h)) for h in VGOOD}
    bad = {h: Obj(derive_key(VWV, h), vput_unreadable(h)) for h in VBAD}
    store, reader = ArtfsArtifactStore(mnt), ArtfsArtifactReader(mnt)
    deadline = time.time() + seconds
    lock = threading.Lock()
    counts = {"ops": 0, "wrong": [], "absent": 0, "errors": []}

    def thread(rng):
        while time.time() < deadline:
            op = rng.randrange(3)
            try:
                if op == 0:    # a put of good objects only
                    store.put([good[h] for h in rng.sample(VGOOD, 12)])
                elif op == 1:  # one unreadable header among them: refused, nothing sent
                    objs = [good[h] for h in rng.sample(VGOOD, 11)]
                    objs.insert(rng.randrange(12), bad[rng.choice(VBAD)])
                    try:
                        store.put(objs)
                        with lock:
                            counts["wrong"].append(("put accepted an unreadable header",))
                    except ArtifactCorruptionError as e:
                        if "not a schema-3 envelope" not in str(e):
                            with lock:
                                counts["wrong"].append(("refusal", str(e)[:200]))
                else:          # a get, every byte compared
                    hs = rng.sample(VGOOD, 6)
                    got = reader.get([good[h].key for h in hs])
                    if got != [good[h].payload for h in hs]:
                        with lock:
                            counts["wrong"].append(("get", hs))
                with lock:
                    counts["ops"] += 1
            except ArtifactNotFoundError:  # not put by anyone yet
                with lock:
                    counts["absent"] += 1
            except Exception as e:  # noqa: BLE001 (reported to the test)
                with lock:
                    counts["errors"].append((op, repr(e)[:200]))

    threads = [threading.Thread(target=thread, args=(random.Random(seed * 10 + k),))
               for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    q.put(counts)


def test_vllm_store_puts_and_gets_from_many_processes_and_threads(mnt):
    results = run_processes(vput_worker, [(mnt.mountpoint, s, 5) for s in range(8)])
    assert sum(r["ops"] for r in results) > 80, results
    assert [w for r in results for w in r["wrong"]] == [], results
    assert [e for r in results for e in r["errors"]] == [], results
    keys = {h: derive_key(VWV, h).split("/", 1)[1] for h in VGOOD + VBAD}
    for h in VGOOD:  # some may never have been drawn: put each once more
        out = transact(mnt.path(".keys", ".put"), vput_envelope(h))
        assert out.decode() == f"{keys[h]} 0\n"
    got = transact(mnt.path(".keys", ".get"), "".join(keys[h] + "\n" for h in VGOOD).encode())
    assert got == b"".join(vput_envelope(h) for h in VGOOD)
    for h in VBAD:
        assert not os.path.exists(mnt.path(".keys", keys[h]))
    m = mnt.metrics()
    assert m["artfs_objects"] == len(VGOOD), m
    assert m["artfs_bytes_reserved"] == 0, m
    assert wait_for(lambda: mnt.metrics()["artfs_uploads_in_flight"] == 0)  # released after close


# Large writes: each begins a flush that stages its records while the rest
# of the write is read, and records commit in runs (src/r3/put*.c, publish.c).
# Many processes put the same keys at once, by key and by path, in batches
# of up to 128 records of several KiB cut into writes of odd sizes, some
# keys twice in one batch, while others remove objects and read them: every
# record of every batch must be 0 (identical content, or a new commit), and
# everything that stays reads back byte for byte.
SWV = "stream"
SKEYS = ["%02x" % i + "c3" * 7 for i in range(160)]


def stream_envelope(h):
    i = int(h[:2], 16)
    arr = routed_experts(16 + i % 5, seed=4000 + i)                 # ~6-8 KiB records
    return encode(SWV, h, arr, source_token_start=16 * (i % 64))


def stream_worker(mnt, seed, seconds, q):
    rng = random.Random(seed)
    envs = {h: stream_envelope(h) for h in SKEYS}
    keys = {h: derive_key(SWV, h).split("/", 1)[1] for h in SKEYS}
    counts = {"ops": 0, "wrong": [], "absent": 0, "errors": []}
    deadline = time.time() + seconds
    while time.time() < deadline:
        counts["ops"] += 1
        op = rng.randrange(5)
        try:
            if op < 3:     # a batch by key (0, 1) or by path (2)
                # 23 to 63 records, or exactly one queue (64: its last
                # record fills the queue, and the reply comes before the
                # flush), or two (128: the full queue flushes when the
                # next record begins)
                hs = rng.sample(SKEYS, rng.choice((rng.randrange(20, 61), 61, 125)))
                hs += rng.sample(hs, 3)                               # three keys twice
                rng.shuffle(hs)
                if op < 2:
                    data = b"".join(envs[h] for h in hs)
                    path = os.path.join(mnt, ".keys", ".put")
                else:
                    data = b"".join(h.encode() + b"\n" + envs[h] for h in hs)
                    path = os.path.join(mnt, SWV, ".put")
                # The batch ends with fsync, with the read of its lines, or
                # with a close right after the last write, whose reply comes
                # before its records are committed: close must wait for them.
                end = rng.choice(("fsync", "read", "close"))
                fd = os.open(path, os.O_RDWR)
                try:
                    off = 0
                    while off < len(data):
                        n = rng.choice((33000, 65537, 150001, 1 << 20, len(data)))
                        os.write(fd, data[off:off + n])
                        off += n
                    if end == "fsync":
                        os.fsync(fd)
                    out = read_to_end(fd) if end != "close" else None
                finally:
                    os.close(fd)  # raises the batch's errno when end == "close"
                want = "".join(f"{keys[h]} 0\n" for h in hs)
                if out is not None and out.decode() != want:
                    counts["wrong"].append(("put", op, out[:200]))
            elif op == 3:  # remove a few, by key or by path
                for h in rng.sample(SKEYS, 3):
                    try:
                        os.unlink(os.path.join(mnt, ".keys", keys[h]) if rng.random() < 0.5
                                  else os.path.join(mnt, SWV, h))
                    except OSError as e:
                        count_failure(counts, op, e, (errno.ENOENT, errno.ESTALE))
            else:          # reads by key, every byte compared
                for h in rng.sample(SKEYS, 4):
                    try:
                        if read(os.path.join(mnt, ".keys", keys[h])) != envs[h]:
                            counts["wrong"].append(("read", h))
                    except OSError as e:
                        count_failure(counts, op, e, (errno.ENOENT, errno.ESTALE))
        except OSError as e:
            counts["errors"].append((op, errno.errorcode.get(e.errno, e.errno)))
    q.put(counts)


@pytest.mark.parametrize("threads", [None, 2])
def test_large_batches_of_the_same_keys_from_many_processes(make_mount, threads):
    """With libfuse's default of threads and with two: then a batch that
    hands the reading of requests to the other thread finds none to spare
    while the other runs one too, and requests wait for one to end."""
    mnt = make_mount(**({"max_threads": threads} if threads else {}))
    os.makedirs(mnt.path(SWV))
    all_went_well(run_processes(stream_worker, [(mnt.mountpoint, s, 6) for s in range(8)]), 40)
    # Every key once more in one batch by path: 0 each; then each reads
    # back exactly by key and by path, and the books balance.
    keys = {h: derive_key(SWV, h).split("/", 1)[1] for h in SKEYS}
    out = transact(mnt.path(SWV, ".put"), b"".join(h.encode() + b"\n" + stream_envelope(h) for h in SKEYS))
    assert out.decode() == "".join(f"{keys[h]} 0\n" for h in SKEYS)
    for h in SKEYS:
        assert read(mnt.path(".keys", keys[h])) == stream_envelope(h)
        i = int(h[:2], 16)
        assert read(mnt.path(SWV, h)) == npy_bytes(routed_experts(16 + i % 5, seed=4000 + i))
    books_balance(mnt, len(SKEYS))
