#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""start_scan: how long a daemon's start takes to list .cache/ in the store
(src/trees/disk.c, wdisk_scan), two builds taking turns on one store.
Every start and every takeover after a crash or an upgrade does this
before the daemon serves, so it is the mount's stall at a restart.

    /usr/bin/python3 bench/start_scan.py <artfs-before> <artfs-after> [dirs] [rounds] [store]

Makes the store once through a mount of <artfs-after>: `dirs` directories
(default 100,000: 99 in each of dirs/100 parents) and 20 small files in
each parent (default store /dev/shm/artfs-start-scan, kept for later runs
when given). Then starts each build `rounds` times (default 4) in turn and
prints the time from its log line "daemon ... started" to "cache: N files
... in the store", and the medians and their ratio."""
import datetime
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "mount"))
import conftest  # noqa: E402
from conftest import Mount  # noqa: E402


def make_store(daemon, store, dirs):
    conftest.DAEMON = daemon
    m = Mount(tempfile.mkdtemp(prefix="artfs-scan-"), store=store).start()
    try:
        root = m.path(".cache", "many")
        os.mkdir(root)

        def parent(i):
            d = os.path.join(root, f"d{i}")
            os.mkdir(d)
            for j in range(99):
                os.mkdir(os.path.join(d, f"e{j}"))
            for j in range(20):
                with open(os.path.join(d, f"f{j}"), "wb") as f:
                    f.write(b"y" * 64)
        with ThreadPoolExecutor(8) as ex:
            list(ex.map(parent, range(max(1, dirs // 100))))
    finally:
        m.stop(check=False)


def one_start(daemon, store):
    """ms from the daemon's start to the end of its scan of .cache/."""
    mnt = tempfile.mkdtemp(prefix="artfs-scan-mnt-")
    log = os.path.join(mnt + ".log")
    with open(log, "w") as out:
        p = subprocess.Popen([daemon, "-f", "-o", f"store={store}", mnt], stdout=out,
                             stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and "serving" not in open(log).read():
            time.sleep(0.02)
        lines = [ln for ln in open(log) if " started" in ln or "cache:" in ln]
        ts = [datetime.datetime.fromisoformat(ln.split()[0].rstrip("Z")) for ln in lines]
        return (ts[-1] - ts[0]).total_seconds() * 1e3, lines[-1].split("info: ")[-1].strip()
    finally:
        subprocess.run(["umount", mnt], check=False)
        p.wait(timeout=60)
        os.rmdir(mnt)
        os.unlink(log)


def main():
    before, after = sys.argv[1], sys.argv[2]
    dirs = int(sys.argv[3]) if len(sys.argv) > 3 else 100000
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 4
    store = sys.argv[5] if len(sys.argv) > 5 else "/dev/shm/artfs-start-scan"
    keep = len(sys.argv) > 5
    if not os.path.isdir(os.path.join(store, "cache")):
        make_store(after, store, dirs)
    ms = {"before": [], "after": []}
    try:
        for _ in range(rounds):
            for name, daemon in (("before", before), ("after", after)):
                t, what = one_start(daemon, store)
                ms[name].append(t)
                print(f"{name}: {t:.0f} ms ({what})", flush=True)
    finally:
        if not keep:
            shutil.rmtree(store, ignore_errors=True)
    b, a = statistics.median(ms["before"]), statistics.median(ms["after"])
    print(f"median before {b:.0f} ms, after {a:.0f} ms, after/before {a / b:.2f}")


if __name__ == "__main__":
    main()
