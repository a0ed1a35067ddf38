#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""parallel_publish: many processes publish single objects into one version
at once, through the mount and into the raw tmpfs store (vLLM's SHM backend's
algorithm), same data, same process count.

    /usr/bin/python3 bench/parallel_publish.py <mountpoint> <raw_dir> [procs] [per_proc] [rounds]

Each round starts procs processes together (a barrier), each publishing
per_proc objects of (16, 48, 8) |u1 as <wv>/<hash> (open O_CREAT|O_EXCL,
write, close == 0), then the same into the raw store (temporary file O_EXCL,
write, close, link, unlink). Prints the aggregate objects/s of both and the
ratio artfs/raw per round, then medians."""
import multiprocessing as mp
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import batch_bench as bb  # noqa: E402  (setup, make, single_publish, raw_put, clear)


def worker(mnt, raw, objs, start, done):
    start.wait()
    t = time.perf_counter()
    bb.single_publish(mnt, objs)
    a = time.perf_counter() - t
    start.wait()
    t = time.perf_counter()
    bb.raw_put(raw, objs)
    done.put((a, time.perf_counter() - t))


def main():
    mnt, raw, procs, per, rounds = bb.setup((16, 500, 3))
    ratios, rates = [], []
    for r in range(rounds):
        bb.clear(raw)
        parts = [bb.make(per, 100000 * r + p + int(time.time()) % 100000 * 1000) for p in range(procs)]
        start, done = mp.Barrier(procs + 1), mp.Queue()
        ps = [mp.Process(target=worker, args=(mnt, raw, parts[p], start, done)) for p in range(procs)]
        for p in ps:
            p.start()
        t = time.perf_counter()
        start.wait()   # artfs phase begins
        start.wait()   # every process is done with artfs
        a_wall = time.perf_counter() - t
        t = time.perf_counter()
        got = [done.get(timeout=600) for _ in ps]
        r_wall = time.perf_counter() - t
        for p in ps:
            p.join()
        # Each phase ends with its slowest process.
        a = max(x for x, _ in got)
        b = max(y for _, y in got)
        n = procs * per
        ratios.append(b / a)
        rates.append((n / a, n / b))
        print(f"round {r}: {procs} processes x {per}: artfs {n / a:9.0f} obj/s  raw {n / b:9.0f} obj/s"
              f"  ratio {b / a:5.2f}  (walls {a_wall:.3f} s, {r_wall:.3f} s)")
    print(f"median: artfs {statistics.median(x for x, _ in rates):.0f} obj/s  "
          f"raw {statistics.median(y for _, y in rates):.0f} obj/s  ratio {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
