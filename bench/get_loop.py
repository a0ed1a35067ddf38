#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
""".keys/.get of 64 only, for a fixed time: batch_bench.py's objects
published once, then read back in batches until the time is up.

    /usr/bin/python3 bench/get_loop.py <mountpoint> [objects] [seconds]

Prints "get-only: <obj/s> obj/s over <s> s". For A/B runs of builds taking
turns on one host (each mounted fresh), as in bench/RESULTS, 2026-12-07;
this script's batch_bench.py may be replaced by an older one both builds
speak (PYTHONPATH)."""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import batch_bench as b  # noqa: E402


def main():
    mnt = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 4096
    secs = float(sys.argv[3]) if len(sys.argv) > 3 else 5.0
    os.makedirs(os.path.join(mnt, b.WV), exist_ok=True)
    objs = b.make(n, 77)
    b.artfs_put(mnt, objs, 64)
    t0, done = time.perf_counter(), 0
    while time.perf_counter() - t0 < secs:
        b.artfs_get(mnt, objs, 64)
        done += n
    dt = time.perf_counter() - t0
    print(f"get-only: {done / dt:.0f} obj/s over {dt:.1f} s")


if __name__ == "__main__":
    main()
