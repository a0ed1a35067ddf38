#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""put_phases: where a batch `.keys/.put` spends its time, for one or more
daemons mounted in turn, against the raw tmpfs store in the same round.

    /usr/bin/python3 bench/put_phases.py <raw_dir> <name>=<mountpoint>[,fsync]... [--objects N] [--rounds R]

Each round, for each mount in turn: N objects in batches of 64, as
batch_bench's put does (open, one writev, read the result lines, which
ends the batch, close; with ",fsync" after the mount point, fsync before
the read, as clients did before reads ended batches and as a daemon from
before then needs), each phase timed on the client, batch after batch;
then the raw put of the same objects (batch_bench's raw store) and vLLM's
shared-memory store's put of them (batch_bench.shm_put). With --cold,
each batch is followed at once by the raw and the shared-memory put of
its own 64 objects instead: batches come now and then, as from an engine
between its steps, and the daemon's threads have gone to sleep by the
next one (then every phase pays a wake-up). Prints per mount the median
over rounds of each phase in µs per batch, objects/s, and the ratios to
the raw store and to the shared-memory store. The mounts take turns so that a noisy machine is noisy
for all of them alike."""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import batch_bench as bb  # noqa: E402

PHASES = ("open", "writev", "fsync", "read", "close")


def put_phases(mnt, objs, raw, batch=64, fsync=False, cold=False):
    """Puts objs in batches, then the raw and the shared-memory store's put
    of the same objects (into raw/raw and raw/shm; with cold, those of each
    batch right after it); returns the seconds of each phase, summed, and
    those of the two baselines."""
    tot = dict.fromkeys(PHASES, 0.0)
    raw_s = shm_s = 0.0
    for d in ("raw", "shm"):
        os.makedirs(os.path.join(raw, d), exist_ok=True)
        bb.clear(os.path.join(raw, d))
    for i in range(0, len(objs), batch):
        part = objs[i:i + batch]
        pieces = [e for _, _, e in part]
        t0 = time.perf_counter()
        fd = os.open(os.path.join(mnt, ".keys", ".put"), os.O_RDWR)
        t1 = time.perf_counter()
        assert os.writev(fd, pieces) == sum(map(len, pieces))
        t2 = time.perf_counter()
        if fsync:
            os.fsync(fd)
        t3 = time.perf_counter()
        lines = os.pread(fd, (len(part) + 1) * 96 + 1, 0).split()
        t4 = time.perf_counter()
        os.close(fd)
        t5 = time.perf_counter()
        assert lines[1::2] == [b"0"] * len(part), lines[:8]
        for name, a, b in zip(PHASES, (t0, t1, t2, t3, t4), (t1, t2, t3, t4, t5)):
            tot[name] += b - a
        if cold:
            r, m = baselines(raw, part)
            raw_s += r
            shm_s += m
    if not cold:
        raw_s, shm_s = baselines(raw, objs)
    for d in ("raw", "shm"):
        bb.clear(os.path.join(raw, d))
    return tot, raw_s, shm_s


def baselines(raw, objs):
    """Seconds of the raw and of the shared-memory store's put of objs."""
    t0 = time.perf_counter()
    bb.raw_put(os.path.join(raw, "raw"), objs)
    t1 = time.perf_counter()
    bb.shm_put(os.path.join(raw, "shm"), objs)
    return t1 - t0, time.perf_counter() - t1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("raw")
    ap.add_argument("mounts", nargs="+", help="name=mountpoint")
    ap.add_argument("--objects", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cold", action="store_true", help="baselines after each batch")
    a = ap.parse_args()
    mounts = [m.split("=", 1) for m in a.mounts]
    fsyncs = {name: mnt.endswith(",fsync") for name, mnt in mounts}
    mounts = [(name, mnt.removesuffix(",fsync")) for name, mnt in mounts]
    os.makedirs(a.raw, exist_ok=True)
    rows = {name: [] for name, _ in mounts}
    batches = a.objects // 64
    for r in range(a.rounds):
        for name, mnt in mounts:
            objs = bb.make(a.objects, 7000 + r)
            ph, raw_s, shm_s = put_phases(mnt, objs, a.raw, fsync=fsyncs[name], cold=a.cold)
            total = sum(ph.values())
            rows[name].append((ph, a.objects / total, raw_s / total, shm_s / total))
            print(f"round {r} {name:10s} " + " ".join(f"{p} {ph[p] / batches * 1e6:6.0f}" for p in PHASES)
                  + f"  us/batch; {a.objects / total:8.0f} obj/s; x raw {raw_s / total:5.2f}"
                  + f"; x shm {shm_s / total:5.2f}", flush=True)
            for _, k, _ in objs:
                os.unlink(os.path.join(mnt, ".keys", k))
    print()
    print(f"medians over {a.rounds} rounds, {a.objects} objects, batches of 64, us per batch")
    print(f"{'daemon':10s} " + " ".join(f"{p:>7s}" for p in PHASES)
          + f" {'total':>7s} {'obj/s':>8s} {'x raw':>6s} {'x shm':>6s}")
    for name, vals in rows.items():
        med = {p: statistics.median(v[0][p] for v in vals) / batches * 1e6 for p in PHASES}
        tot = statistics.median(sum(v[0].values()) for v in vals) / batches * 1e6
        print(f"{name:10s} " + " ".join(f"{med[p]:7.0f}" for p in PHASES)
              + f" {tot:7.0f} {statistics.median(v[1] for v in vals):8.0f}"
              + f" {statistics.median(v[2] for v in vals):6.2f} {statistics.median(v[3] for v in vals):6.2f}")


if __name__ == "__main__":
    main()
