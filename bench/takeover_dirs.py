#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""takeover_dirs: what a daemon that takes over spends finding again the
directories the kernel holds (src/ns/revive.c, revive_directories), two
builds taking turns on one host.

    /usr/bin/python3 bench/takeover_dirs.py <artfs-before> <artfs-after> [dirs] [kills]

Each build is mounted fresh over an empty store; `dirs` directories
(default 20,000: 1 per 100 in 200 parents) are made under .cache/ and
listed (the kernel holds an id of each), then the daemon is killed `kills`
times (default 5), each 1.2 s after the last stat (the kernel's entries
expired, so the stat waits for the next daemon). Per kill: the time from
the kill to the first stat of a held directory answered by the next
daemon (its start: the store's scan of .cache/, then the mapping of the
directory ids), and the next daemon's own figure for the mapping (its log
line "takeover: N directories ... in X ms"). Prints the medians of each
build and their ratio."""
import os
import re
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "mount"))
from conftest import Mount  # noqa: E402


def one(daemon, dirs, kills):
    os.environ["ARTFS_DAEMON"] = daemon
    import conftest
    conftest.DAEMON = daemon
    m = Mount(tempfile.mkdtemp(prefix="artfs-takeover-")).start()
    gaps, own = [], []
    try:
        root = m.path(".cache", "many")
        os.mkdir(root)
        per = 100
        for i in range(max(1, dirs // per)):
            os.mkdir(os.path.join(root, f"d{i}"))
            for j in range(per - 1):
                os.mkdir(os.path.join(root, f"d{i}", f"e{j}"))
        held = sum(1 for _ in os.walk(root))
        probe = os.path.join(root, "d0", "e0")
        for _ in range(kills):
            time.sleep(1.2)  # past the kernel's entries (1 s): the stat asks the next daemon
            t0 = time.perf_counter()
            pid = m.kill_daemon()
            m.wait_daemon_other_than(pid)
            os.stat(probe)
            gaps.append((time.perf_counter() - t0) * 1e3)
        time.sleep(0.3)
        own = [float(x) for x in re.findall(r"takeover: \d+ directories .* in ([0-9.]+) ms", m.log())]
    finally:
        m.stop(check=False)
    return held, gaps, own


def main():
    before, after = sys.argv[1], sys.argv[2]
    dirs = int(sys.argv[3]) if len(sys.argv) > 3 else 20000
    kills = int(sys.argv[4]) if len(sys.argv) > 4 else 5
    res = {}
    for name, d in (("before", before), ("after", after)):
        held, gaps, own = one(d, dirs, kills)
        res[name] = statistics.median(gaps)
        print(f"{name}: {held} directories held; kill -> first stat answered: median "
              f"{res[name]:.1f} ms (min {min(gaps):.1f}, max {max(gaps):.1f}, {kills} kills); "
              f"the daemon's own finding again: "
              f"{'median %.1f ms' % statistics.median(own) if own else 'not logged'}")
    print(f"after/before (kill -> first stat): {res['after'] / res['before']:.2f}")


if __name__ == "__main__":
    main()
