#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""restart_bench: what a client sees when artfs's daemon restarts under the
same mount (DESIGN.md §8), measured from the outside.

    /usr/bin/python3 bench/restart_bench.py <artfs> <artfsctl> [store] [kills] [upgrades]

Mounts <artfs> (a holder, which runs the daemon) on a scratch mount point
over `store` (default: a new empty one in /dev/shm; give a store that
bench/scale_bench wrote to measure at a million objects) and then:

  gap       kills the serving daemon `kills` times (default 20), SIGKILL,
            while one thread asks the daemon something every moment (stat
            of .artfs/control, whose attributes are never cached, so each
            is a round trip): the gap is the longest wait, counted from the
            kill on, of a question asked around it (the dying daemon may
            still answer the first ones; the one it leaves waits for the
            next daemon); p50, p99 and max
  readers   the same kills while 4 threads read objects by path (open, read
            to the end, close) that exist in the store: the slowest read
  put       after a kill of a daemon that has counted the store (served a
            while), the first 6,400 objects published as 100
            .keys/.put batches of 64 by the new daemon, then 6,400 more;
            objects/s of each, against a raw store's put of the same objects
            in the same process (one file each: temporary file O_EXCL,
            write, close, link, unlink, as vLLM's shared-memory store does)
  upgrade   `artfsctl upgrade` `upgrades` times (default 5): its duration,
            from the command's start to the new daemon serving
  holder    the holder's VmRSS and VmHWM, and its daemon's, at the end

ARTFS_BENCH_SETTLE=<s> (default 0.3) is how long each daemon serves before
it is killed: on a GPU host, past the warm-up delay (ARTFS_WARMUP_DELAY_MS,
2 s) a daemon has made its CUDA contexts and pinned buffers, whose release
by the kernel is what a holder that waits for SIGCHLD waits for. The log
lines of the holder say how it learnt of each death (lifeline or SIGCHLD).
"""
import hashlib
import json
import os
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

WV = "bench"


def mounted(path):
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == path for line in f)


def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except FileNotFoundError:
        return []


def rss(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1])
    return out


def daemon_of(holder, other_than=None, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        c = children(holder)
        if len(c) == 1 and c[0] != other_than:
            return c[0]
        time.sleep(0.001)
    raise RuntimeError(f"no daemon under holder {holder}")


def envelope(i, wv=WV, rows=16):
    payload = bytes((i * 7 + k) & 0xFF for k in range(rows * 48 * 8))
    h = hashlib.sha256(b"h%d" % i).digest()[:16]
    w = wv.encode()
    key = hashlib.sha256(struct.pack(">Q", len(w)) + w + struct.pack(">Q", len(h)) + h).hexdigest()
    header = json.dumps({
        "dtype": "|u1", "field": "routed_experts", "key": "vllm-artifact/" + key, "kind": "block",
        "payload_sha256": hashlib.sha256(payload).hexdigest(), "schema_version": 3,
        "shape": [rows, 48, 8], "source_token_start": 0,
    }, sort_keys=True, separators=(",", ":")).encode()
    return h.hex(), key, struct.pack("<I", len(header)) + header + payload


# ---- the gap ------------------------------------------------------------------------------

class Asker(threading.Thread):
    """Asks the daemon (stat of .artfs/control, whose attributes the kernel
    never caches) in a loop; notes when each question was asked and when
    its answer came."""
    def __init__(self, mnt):
        super().__init__(daemon=True)
        self.path = os.path.join(mnt, ".artfs", "control")
        self.answers = []  # (asked, answered)
        self.stop = False
        self.errors = 0

    def run(self):
        while not self.stop:
            t0 = time.monotonic()
            try:
                os.stat(self.path)
            except OSError:
                self.errors += 1
            self.answers.append((t0, time.monotonic()))


class Reader(threading.Thread):
    def __init__(self, mnt, names):
        super().__init__(daemon=True)
        self.mnt, self.names = mnt, names
        self.worst, self.reads, self.errors, self.stop = 0.0, 0, 0, False

    def run(self):
        i = 0
        while not self.stop:
            path = os.path.join(self.mnt, WV, self.names[i % len(self.names)])
            i += 1
            t0 = time.monotonic()
            try:
                with open(path, "rb") as f:
                    while f.read(1 << 20):
                        pass
            except OSError:
                self.errors += 1
            self.worst = max(self.worst, time.monotonic() - t0)
            self.reads += 1


def measure_gaps(mnt, holder, kills, names, settle):
    asker = Asker(mnt)
    readers = [Reader(mnt, names) for _ in range(4)] if names else []
    asker.start()
    for r in readers:
        r.start()
    time.sleep(0.5)
    gaps = []
    for _ in range(kills):
        pid = daemon_of(holder)
        n = len(asker.answers)
        t_kill = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        daemon_of(holder, other_than=pid)
        time.sleep(settle)
        # The gap: the longest wait, from the kill on, of a question asked
        # around it (the dead daemon may have answered the first ones after
        # the kill; the one it did not answer waited for the next daemon).
        gaps.append(max(end - max(asked, t_kill) for asked, end in asker.answers[n:]
                        if end > t_kill))
    asker.stop = True
    for r in readers:
        r.stop = True
    asker.join()
    for r in readers:
        r.join()
    return gaps, asker.errors, readers


# ---- put after a restart -------------------------------------------------------------------

def put_batches(mnt, envs):
    path = os.path.join(mnt, ".keys", ".put")
    t0 = time.perf_counter()
    for b in range(0, len(envs), 64):
        fd = os.open(path, os.O_RDWR)
        os.write(fd, b"".join(envs[b:b + 64]))
        lines = os.pread(fd, 1 << 20, 0).decode().split()
        os.close(fd)
        assert lines[1::2] == ["0"] * len(envs[b:b + 64]), lines[:4]
    return len(envs) / (time.perf_counter() - t0)


def raw_put(d, envs, keys):
    os.makedirs(d, exist_ok=True)
    t0 = time.perf_counter()
    for k, e in zip(keys, envs):
        tmp = os.path.join(d, f".tmp.{k}")
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        os.write(fd, e)
        os.close(fd)
        try:
            os.link(tmp, os.path.join(d, k))
        except FileExistsError:
            pass
        os.unlink(tmp)
    return len(envs) / (time.perf_counter() - t0)


def metric(mnt, name):
    with open(os.path.join(mnt, ".artfs", "metrics")) as f:
        for line in f:
            if line.startswith(name + " "):
                return int(float(line.split()[1]))
    return None


def measure_put(mnt, holder, base):
    made = [envelope(base + i, wv="put") for i in range(12800)]
    envs = [e for _, _, e in made]
    keys = [k for _, k, _ in made]
    # A daemon that has served a while: its count of the store is done.
    deadline = time.time() + 300
    while metric(mnt, "artfs_store_sizing") and time.time() < deadline:
        time.sleep(0.05)
    pid = daemon_of(holder)
    os.kill(pid, signal.SIGKILL)
    daemon_of(holder, other_than=pid)
    first = put_batches(mnt, envs[:6400])
    warm = put_batches(mnt, envs[6400:])
    raw_dir = tempfile.mkdtemp(prefix="raw-", dir="/dev/shm")
    raw = raw_put(raw_dir, envs[:6400], keys[:6400])
    subprocess.run(["rm", "-rf", raw_dir], check=False)
    return first, warm, raw


def measure_upgrades(mnt, artfsctl, n):
    times = []
    for _ in range(n):
        t0 = time.monotonic()
        r = subprocess.run([artfsctl, "-m", mnt, "upgrade"], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(r.stdout + r.stderr)
        times.append(time.monotonic() - t0)
        time.sleep(0.3)
    return times


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]


def main():
    artfs, artfsctl = sys.argv[1], sys.argv[2]
    store = sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] else None
    kills = int(sys.argv[4]) if len(sys.argv) > 4 else 20
    upgrades = int(sys.argv[5]) if len(sys.argv) > 5 else 5
    base = tempfile.mkdtemp(prefix="restart-bench-", dir="/dev/shm")
    mnt = os.path.join(base, "mnt")
    os.mkdir(mnt)
    store = store or os.path.join(base, "store")
    log = open(os.path.join(base, "artfs.log"), "w")
    holder = subprocess.Popen([artfs, "-f", "-o", f"store={store},capacity=64G", mnt],
                              stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 120
        while not mounted(mnt):
            assert time.time() < deadline and holder.poll() is None, "artfs did not mount"
            time.sleep(0.01)
        os.stat(os.path.join(mnt, ".artfs", "control"))  # served
        objects = 0
        with open(os.path.join(mnt, ".artfs", "metrics")) as f:
            for line in f:
                if line.startswith("artfs_objects "):
                    objects = int(line.split()[1])
        os.makedirs(os.path.join(mnt, WV), exist_ok=True)
        names = sorted(os.listdir(os.path.join(mnt, WV)))[:2000]
        if not names:  # an empty store: some objects to read
            for i in range(256):
                h, _, e = envelope(i)
                with open(os.path.join(mnt, WV, h), "wb") as f:
                    f.write(e)
            names = sorted(os.listdir(os.path.join(mnt, WV)))
        print(f"artfs {artfs}, store {store}: {objects} objects at the start")
        settle = float(os.environ.get("ARTFS_BENCH_SETTLE", "0.3"))
        gaps, errors, readers = measure_gaps(mnt, holder.pid, kills, names, settle)
        with open(os.path.join(base, "artfs.log"), errors="replace") as f:
            text = f.read()
        early = text.count("past its last system call")
        print(f"each daemon served {settle:.1f} s before its kill; the holder learnt of "
              f"{early} of {kills} deaths from the lifeline, of the others from SIGCHLD")
        print(f"gap, kill -> the question it left answered ({kills} kills): p50 {pct(gaps, 50) * 1e3:.1f} ms, "
              f"p99 {pct(gaps, 99) * 1e3:.1f} ms, max {max(gaps) * 1e3:.1f} ms "
              f"(mean {statistics.mean(gaps) * 1e3:.1f}); errors seen by the asker: {errors}")
        print(f"readers across the kills: {sum(r.reads for r in readers)} reads, "
              f"{sum(r.errors for r in readers)} errors, slowest {max(r.worst for r in readers) * 1e3:.1f} ms")
        # New keys (a store that an earlier run filled holds those of a
        # fixed base: a publish of a key it may hold waits for the count).
        first, warm, raw = measure_put(mnt, holder.pid, (1 << 24) + int(time.time()) % 1000 * 16384)
        print(f"put after a kill: first 6,400 {first:,.0f} obj/s ({first / raw:.2f}x raw), "
              f"next 6,400 {warm:,.0f} obj/s ({warm / raw:.2f}x raw); raw store {raw:,.0f} obj/s; "
              f"first/next {first / warm:.2f}")
        ups = measure_upgrades(mnt, artfsctl, upgrades)
        print(f"upgrade ({upgrades}): p50 {pct(ups, 50) * 1e3:.0f} ms, max {max(ups) * 1e3:.0f} ms")
        h, d = rss(holder.pid), rss(daemon_of(holder.pid))
        print(f"holder {holder.pid}: VmRSS {h['VmRSS']} KiB, VmHWM {h['VmHWM']} KiB; "
              f"its daemon: VmRSS {d['VmRSS']} KiB")
    finally:
        subprocess.run(["umount", mnt], check=False)
        try:
            holder.wait(timeout=60)
        except subprocess.TimeoutExpired:
            holder.kill()
        log.close()
        if os.environ.get("ARTFS_BENCH_LOG"):  # keep the daemons' log
            subprocess.run(["cp", os.path.join(base, "artfs.log"), os.environ["ARTFS_BENCH_LOG"]],
                           check=False)
        if len(sys.argv) <= 3 or not sys.argv[3]:
            subprocess.run(["rm", "-rf", base], check=False)
        else:
            subprocess.run(["rm", "-rf", mnt, os.path.join(base, "artfs.log")], check=False)


if __name__ == "__main__":
    main()
