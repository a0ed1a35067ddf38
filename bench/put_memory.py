#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""put_memory: what open .put files make the daemon hold (issue #25, item 2).

    /usr/bin/python3 bench/put_memory.py <artfs binary> [files] [records] [materialize_max]

Mounts the daemon given on a scratch mount point and store (defaults:
3 files, 1,000,000 records each, materialize_max=16M), opens that many
.put files at once and feeds each, in turn, writes of 4,096 tiny records
(the same one-row object again and again: each is identical to what is
stored, 0, and adds one 67-byte result line). A file whose write is
refused (ENOMEM, a daemon that bounds the memory) takes no more. With
all of them still open it prints the daemon's resident memory (VmRSS,
VmHWM) against what it had before the first write, the bytes the
daemon says transaction files hold (artfs_materialize_held_bytes) and
the records each file took; then it ends the batches, closes the files
and prints the same again."""
import errno
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "mount"))
from envelope import encode, routed_experts  # noqa: E402

WV = "bench"


def status(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1]) << 10
    return out


def held(mnt):
    with open(os.path.join(mnt, ".artfs", "metrics")) as f:
        for line in f:
            if line.startswith("artfs_materialize_held_bytes "):
                return int(line.split()[1])
    return -1


def mounted(path):
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == path for line in f)


def main():
    daemon = sys.argv[1]
    files = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    records = int(sys.argv[3]) if len(sys.argv) > 3 else 1_000_000
    limit = sys.argv[4] if len(sys.argv) > 4 else "16M"
    base = tempfile.mkdtemp(prefix="put-memory-", dir="/dev/shm")
    mnt = os.path.join(base, "mnt")
    os.mkdir(mnt)
    proc = subprocess.Popen([daemon, "-f", "-o", f"store={base}/store,materialize_max={limit}", mnt],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 20
    while not mounted(mnt):
        assert time.time() < deadline and proc.poll() is None, "artfs did not mount"
        time.sleep(0.02)
    try:
        os.mkdir(os.path.join(mnt, WV))
        rec = b"00\n" + encode(WV, "00", routed_experts(1, layers=1, top_k=1))
        per = 4096
        chunk = rec * per
        before = status(proc.pid)
        fds = [os.open(os.path.join(mnt, WV, ".put"), os.O_RDWR) for _ in range(files)]
        taken = [0] * files
        refused = [None] * files
        t0 = time.time()
        while any(r is None and t < records for r, t in zip(refused, taken)):
            for k, fd in enumerate(fds):
                if refused[k] is not None or taken[k] >= records:
                    continue
                try:
                    os.write(fd, chunk)
                    taken[k] += per
                except OSError as e:
                    refused[k] = errno.errorcode.get(e.errno, str(e.errno))
        fed = time.time() - t0
        during = status(proc.pid)
        during_held = held(mnt)
        for fd in fds:
            try:
                os.fsync(fd)
            except OSError:
                pass
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass
        after = status(proc.pid)
        print(f"daemon {daemon}, {files} files, materialize_max={limit}, "
              f"{len(rec)}-byte records in writes of {per}, fed in {fed:.1f} s")
        print(f"records taken per file: {taken}; refused: {refused}")
        print(f"before the writes: VmRSS {before['VmRSS'] >> 20} MiB")
        print(f"files open:        VmRSS {during['VmRSS'] >> 20} MiB (+{(during['VmRSS'] - before['VmRSS']) >> 20} MiB), "
              f"VmHWM {during['VmHWM'] >> 20} MiB, artfs_materialize_held_bytes {during_held} "
              f"({during_held / (1 << 20):.1f} MiB)")
        print(f"files closed:      VmRSS {after['VmRSS'] >> 20} MiB, artfs_materialize_held_bytes {held(mnt)}")
    finally:
        subprocess.run(["umount", mnt], check=False)
        proc.wait(timeout=30)
        subprocess.run(["rm", "-rf", base], check=False)


if __name__ == "__main__":
    main()
