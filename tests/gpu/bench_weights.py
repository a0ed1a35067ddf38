# SPDX-License-Identifier: Apache-2.0
"""GPU weight benchmarks (issue: attach time, load throughput against the
host's own ceilings, replicated two-GPU load), measured in one run.
Prints a table and writes $OUT/gpu-bench.json."""
import json
import os
import statistics
import subprocess
import sys
import threading
import time

import torch

from conftest import BUILD, GPUS, HERE, MOUNT, Daemon, artfsctl, make_checkpoint, status

OUT = os.environ.get("OUT", "/tmp")
PY = os.path.join(HERE, "..", "..", "contrib", "python")


def files(ckpt):
    return sorted(os.path.join(ckpt, n) for n in os.listdir(ckpt) if n.endswith(".safetensors"))


def data_bytes(ckpt):
    return sum(os.path.getsize(f) for f in files(ckpt))


def evict(ckpt):
    for f in files(ckpt):
        fd = os.open(f, os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def cold_read_seconds(ckpt, threads=4, chunk=64 << 20):
    """The disk's ceiling: the files read cold, several reads in flight."""
    evict(ckpt)
    work = [(f, off) for f in files(ckpt) for off in range(0, os.path.getsize(f), chunk)]
    lock = threading.Lock()

    def reader():
        buf = bytearray(chunk)
        fds = {}
        while True:
            with lock:
                if not work:
                    break
                f, off = work.pop()
            fd = fds.setdefault(f, os.open(f, os.O_RDONLY))
            os.preadv(fd, [buf], off)
        for fd in fds.values():
            os.close(fd)

    t0 = time.perf_counter()
    ts = [threading.Thread(target=reader) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return time.perf_counter() - t0


def h2d_gbps(nbytes=2 << 30):
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda:0")
    best = 0
    for _ in range(3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        best = max(best, nbytes / (time.perf_counter() - t0) / 1e9)
    del src, dst
    torch.cuda.empty_cache()
    return best


def load(wv, ckpt, gpus, cold):
    if cold:
        evict(ckpt)
    t0 = time.perf_counter()
    artfsctl("load", wv, ckpt, "--gpus", gpus)
    wall = time.perf_counter() - t0
    st = status(wv)
    return {"wall_s": wall, "daemon_s": float(st["seconds"]), "bytes": int(st["bytes_total"]),
            "broadcast": st["broadcast"]}


def attach_c(wv, ckpt, runs=5):
    r = subprocess.run([os.path.join(BUILD, "attach_bench"), MOUNT, wv, ckpt, "0", "1", str(runs)],
                       capture_output=True, text=True, check=True)
    times = [float(l.split(":")[-1].split()[0]) for l in r.stdout.splitlines() if l.startswith("run ")]
    phases = [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]
    return {"median_s": statistics.median(times), "runs": times, "last": phases[-1] if phases else None}


CHILD_ATTACH = """
import time; t0 = time.perf_counter()
import torch, artfs
t1 = time.perf_counter()
w = artfs.attach_weights({wv!r}, 0, checkpoint_dir={ckpt!r}, mount={mount!r})
t = next(iter(w.values())); t.view(-1)[:1].cpu()
print(time.perf_counter() - t0, time.perf_counter() - t1, len(w))
"""

CHILD_SAFETENSORS = """
import time; t0 = time.perf_counter()
import torch
from safetensors.torch import load_file
t1 = time.perf_counter()
n = 0
for f in {files!r}:
    n += len(load_file(f, device="cuda:0"))
torch.cuda.synchronize()
print(time.perf_counter() - t0, time.perf_counter() - t1, n)
"""


def child(code, runs=3):
    env = dict(os.environ, PYTHONPATH=PY)
    walls, inner = [], []
    for _ in range(runs):
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                           check=True)
        walls.append(time.perf_counter() - t0)
        inner.append(float(r.stdout.split()[1]))
    return {"process_s": statistics.median(walls), "after_import_s": statistics.median(inner)}


def main():
    d = Daemon().start()
    res = {"gpus": GPUS}
    try:
        hf8 = make_checkpoint("hf8", 8, "--layout", "hf", "--files", "4")
        nb = data_bytes(hf8)
        res["checkpoint_gib"] = nb / (1 << 30)
        res["cold_read_s"] = cold_read_seconds(hf8)
        res["cold_read_gbps"] = nb / res["cold_read_s"] / 1e9
        res["h2d_gbps"] = h2d_gbps()
        # Cold loads alternate one GPU and two, three times each: medians.
        one, two = [], []
        for i in range(3):
            one.append(load(f"b1-{i}", hf8, "0", cold=True))
            if i == 0:
                res["attach_c_8g"] = attach_c("b1-0", hf8)
                res["attach_py_8g"] = child(CHILD_ATTACH.format(wv="b1-0", ckpt=hf8, mount=MOUNT))
            artfsctl("unload", f"b1-{i}")
            if GPUS >= 2:
                two.append(load(f"b2-{i}", hf8, "0,1", cold=True))
                artfsctl("unload", f"b2-{i}")
        res["load_cold_1gpu_runs"] = [x["daemon_s"] for x in one]
        res["load_cold_1gpu"] = sorted(one, key=lambda x: x["daemon_s"])[1]
        if two:
            res["load_cold_2gpu_runs"] = [x["daemon_s"] for x in two]
            res["load_cold_2gpu"] = sorted(two, key=lambda x: x["daemon_s"])[1]
        res["load_warm_1gpu"] = load("b1w", hf8, "0", cold=False)
        artfsctl("unload", "b1w")
        if GPUS >= 2:
            res["load_warm_2gpu"] = load("b2w", hf8, "0,1", cold=False)
            artfsctl("unload", "b2w")
        fl = files(hf8)
        res["safetensors_warm"] = child(CHILD_SAFETENSORS.format(files=fl), runs=2)
        evict(hf8)
        res["safetensors_cold"] = child(CHILD_SAFETENSORS.format(files=fl), runs=1)
        # The largest checkpoint this run makes: in /dev/shm, attach only.
        big_gib = float(os.environ.get("ARTFS_BIG_GIB", "40"))
        os.environ["ARTFS_CKPT"] = "/dev/shm/artfs-big-ckpt"
        import conftest
        conftest.CKPT = "/dev/shm/artfs-big-ckpt"
        big = make_checkpoint("big", big_gib, "--layout", "hf", "--files", "8", "--seed", "9")
        res["big_gib"] = data_bytes(big) / (1 << 30)
        res["load_big_warm"] = load("big", big, "0", cold=False)
        res["attach_c_big"] = attach_c("big", big)
        artfsctl("unload", "big")
    finally:
        d.stop()
    with open(os.path.join(OUT, "gpu-bench.json"), "w") as f:
        json.dump(res, f, indent=1)
    c1 = res["load_cold_1gpu"]
    rows = [
        ("checkpoint", f"{res['checkpoint_gib']:.2f} GiB, 4 files, bf16/fp16/fp32/fp8", ""),
        ("cold disk read ceiling", f"{res['cold_read_gbps']:.2f} GB/s", ""),
        ("pinned H2D ceiling", f"{res['h2d_gbps']:.1f} GB/s", ""),
        ("artfs load, cold, 1 GPU", f"{c1['bytes'] / c1['daemon_s'] / 1e9:.2f} GB/s ({c1['daemon_s']:.2f} s)",
         f"{res['cold_read_s'] / c1['daemon_s']:.2f}x disk ceiling (goal >= 0.9)"),
        ("artfs load, page cache, 1 GPU",
         f"{res['load_warm_1gpu']['bytes'] / res['load_warm_1gpu']['daemon_s'] / 1e9:.2f} GB/s", ""),
    ]
    rows.append(("  cold 1-GPU loads (s)", " ".join(f"{x:.2f}" for x in res["load_cold_1gpu_runs"]), "median above"))
    if "load_cold_2gpu" in res:
        c2 = res["load_cold_2gpu"]
        rows.append(("artfs load, cold, 2 GPUs (" + c2["broadcast"] + ")",
                     f"{c2['daemon_s']:.2f} s", f"{c2['daemon_s'] / c1['daemon_s']:.2f}x one GPU (goal <= 1.15)"))
        rows.append(("  cold 2-GPU loads (s)", " ".join(f"{x:.2f}" for x in res["load_cold_2gpu_runs"]), "median above"))
        w1, w2 = res["load_warm_1gpu"], res["load_warm_2gpu"]
        rows.append(("artfs load, page cache, 2 GPUs", f"{w2['daemon_s']:.2f} s",
                     f"{w2['daemon_s'] / w1['daemon_s']:.2f}x one GPU"))
    rows += [
        ("attach 8 GiB, C, process start", f"{res['attach_c_8g']['median_s']:.3f} s", "goal <= 0.3 s"),
        ("attach 8 GiB, Python, process start", f"{res['attach_py_8g']['process_s']:.3f} s",
         f"after import torch: {res['attach_py_8g']['after_import_s']:.3f} s"),
        (f"attach {res['big_gib']:.0f} GiB, C, process start", f"{res['attach_c_big']['median_s']:.3f} s",
         "goal <= 0.3 s"),
        ("safetensors load_file, page cache", f"{res['safetensors_warm']['process_s']:.2f} s",
         f"after import: {res['safetensors_warm']['after_import_s']:.2f} s"),
        ("safetensors load_file, cold disk", f"{res['safetensors_cold']['process_s']:.2f} s",
         f"after import: {res['safetensors_cold']['after_import_s']:.2f} s"),
    ]
    print("\n%-38s %-28s %s" % ("GPU benchmark", "measured", "against"))
    for r in rows:
        print("%-38s %-28s %s" % r)


if __name__ == "__main__":
    main()
