# SPDX-License-Identifier: Apache-2.0
"""The .cache/ tree (DESIGN.md §9) against plain tmpfs, in one script: a
tool's write pattern (temporary name, write whole, close, rename) for N
files of a size, then reads of them: the first opens after a daemon start
(each file is hashed before its first byte) and warm opens (the digest
kept). Prints files/s and MB/s of each and the ratio to tmpfs; asserts no
time (a shared, noisy machine).

    python3 bench/cache_bench.py <artfs binary> [files] [size] [rounds]
"""
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time

ART = sys.argv[1] if len(sys.argv) > 1 else "./artfs"
FILES = int(sys.argv[2]) if len(sys.argv) > 2 else 400
SIZE = int(sys.argv[3]) if len(sys.argv) > 3 else 64 * 1024
ROUNDS = int(sys.argv[4]) if len(sys.argv) > 4 else 3


def mounted(path):
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == path for line in f)


def start(mnt, store):
    subprocess.run([ART, "-o", f"store={store},cache_capacity=4G", mnt], check=True)
    deadline = time.time() + 20
    while not mounted(mnt) and time.time() < deadline:
        time.sleep(0.02)


def stop(mnt):
    subprocess.run(["umount", mnt], check=True)
    deadline = time.time() + 20
    while mounted(mnt) and time.time() < deadline:
        time.sleep(0.02)


def write_all(root, data):
    t = time.perf_counter()
    for i in range(FILES):
        d = os.path.join(root, f"{i % 16:02x}")
        os.makedirs(d, exist_ok=True)
        tmp = os.path.join(d, f".{os.getpid()}.tmp")
        with open(tmp, "wb") as f:
            f.write(data[i])
        os.replace(tmp, os.path.join(d, f"entry{i}"))
    return time.perf_counter() - t


def read_all(root, data):
    t = time.perf_counter()
    for i in range(FILES):
        with open(os.path.join(root, f"{i % 16:02x}", f"entry{i}"), "rb") as f:
            assert f.read() == data[i]
    return time.perf_counter() - t


def main():
    data = [hashlib.sha256(str(i).encode()).digest() * (SIZE // 32) for i in range(FILES)]
    base = tempfile.mkdtemp(dir="/dev/shm")
    mnt, store, raw = (os.path.join(base, n) for n in ("mnt", "store", "raw"))
    os.makedirs(mnt)
    rows = {"write": [], "read-first": [], "read-warm": []}
    try:
        for r in range(ROUNDS):
            shutil.rmtree(raw, ignore_errors=True)
            shutil.rmtree(store, ignore_errors=True)
            os.makedirs(raw)
            start(mnt, store)
            tw = write_all(os.path.join(mnt, ".cache", f"r{r}"), data)
            rw = write_all(raw, data)
            stop(mnt)  # the next opens are the first after a start: hashed
            subprocess.run(["sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"], check=False)
            start(mnt, store)
            tf = read_all(os.path.join(mnt, ".cache", f"r{r}"), data)
            rf = read_all(raw, data)
            tr = read_all(os.path.join(mnt, ".cache", f"r{r}"), data)
            rr = read_all(raw, data)
            stop(mnt)
            rows["write"].append((tw, rw))
            rows["read-first"].append((tf, rf))
            rows["read-warm"].append((tr, rr))
    finally:
        if mounted(mnt):
            subprocess.run(["umount", "-l", mnt])
        shutil.rmtree(base, ignore_errors=True)
    mb = FILES * SIZE / 1e6
    print(f"# {FILES} files of {SIZE} bytes, {ROUNDS} rounds, median of each; tmpfs baseline "
          f"in the same rounds")
    print(f"{'case':12} {'artfs files/s':>14} {'MB/s':>8} {'tmpfs files/s':>14} {'MB/s':>8} "
          f"{'time ratio':>11}")
    for case, pairs in rows.items():
        a = sorted(p[0] for p in pairs)[len(pairs) // 2]
        b = sorted(p[1] for p in pairs)[len(pairs) // 2]
        print(f"{case:12} {FILES / a:14.0f} {mb / a:8.1f} {FILES / b:14.0f} {mb / b:8.1f} "
              f"{a / b:10.2f}x")


if __name__ == "__main__":
    main()
