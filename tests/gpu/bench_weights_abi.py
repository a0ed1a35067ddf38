# SPDX-License-Identifier: Apache-2.0
"""Issue #27's figures, before and after the VMM slabs, in one run: the build
of the commit before them ($ARTFS_OLD_BUILD, with its own Python client and
tests/gpu in $ARTFS_OLD_BUILD/python and /gpu) and this one ($ARTFS_BUILD)
take turns on the same checkpoints in /dev/shm:

- load rate (page cache, 8 and 64 GiB) and GPU memory held per version
  (the device's free memory before and after a load, against its bytes);
- attach, process start to every tensor usable (bench/attach_bench), 8 and
  64 GiB;
- the serving daemon SIGKILLed with the 64 GiB version loaded: the time
  until the next daemon answers its status as ready, and the next attach;
  the old build has lost the version, and its figure is a reload;
- the flips of tests/gpu/bench_flip.py (GPU-direct publish and an 8 GiB
  host flip), each build with its own client.

Prints a table; writes $OUT/weights-abi.json.
    ARTFS_ABI_BIG_GIB=64   the large version's size"""
import json
import os
import statistics
import subprocess
import sys
import time

import torch

import conftest
from conftest import HERE, MOUNT, Daemon, artfsctl, make_checkpoint, status

OUT = os.environ.get("OUT", "/tmp")
TOP = os.path.abspath(os.path.join(HERE, "..", ".."))
NEW = conftest.BUILD
OLD = os.environ.get("ARTFS_OLD_BUILD", os.path.join(NEW, "old"))
BIG = float(os.environ.get("ARTFS_ABI_BIG_GIB", "64"))
BUILDS = {"old": (OLD, os.path.join(OLD, "python"), os.path.join(OLD, "gpu")),
          "new": (NEW, os.path.join(TOP, "contrib", "python"), HERE)}


def free_mib():
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info(0)[0] / (1 << 20)


def settle_free(before, timeout=30):
    """The device's free memory once it stops rising (unload frees late)."""
    end = time.monotonic() + timeout
    last = free_mib()
    while time.monotonic() < end:
        time.sleep(0.2)
        now = free_mib()
        if abs(now - last) < 1 and now >= before - 64:
            return now
        last = now
    return last


def load(wv, ckpt):
    free0 = free_mib()
    t0 = time.perf_counter()
    artfsctl("load", wv, ckpt, "--gpus", "0")
    wall = time.perf_counter() - t0
    st = status(wv)
    nbytes = int(st["bytes_total"])
    held = (free0 - free_mib()) * (1 << 20)
    return {"wall_s": wall, "daemon_s": float(st["seconds"]), "bytes": nbytes,
            "gbps": nbytes / float(st["seconds"]) / 1e9, "gpu_held_bytes": held,
            "gpu_held_over_bytes": held / nbytes}


def attach(build, wv, ckpt, runs):
    r = subprocess.run([os.path.join(build, "attach_bench"), MOUNT, wv, ckpt, "0", "1", str(runs)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return {"error": r.stderr.strip()[-400:]}
    times = [float(l.split(":")[-1].split()[0]) for l in r.stdout.splitlines() if l.startswith("run ")]
    return {"median_s": statistics.median(times), "max_s": max(times), "runs": times}


def serving_pid(holder):
    with open(f"/proc/{holder}/task/{holder}/children") as f:
        kids = f.read().split()
    return int(kids[0]) if len(kids) == 1 else None


def kill_and_serve(d, build, wv, ckpt):
    """SIGKILL of the serving daemon with wv loaded: kill -> status ready
    through the next daemon; then an attach; or, where the version is gone,
    kill -> reload done."""
    pid = serving_pid(d.proc.pid)
    t0 = time.perf_counter()
    os.kill(pid, 9)
    end = time.monotonic() + 60
    st = None
    while time.monotonic() < end:
        pid2 = serving_pid(d.proc.pid)
        if pid2 and pid2 != pid:
            st = status(wv)
            break
        time.sleep(0.0005)
    first_answer = time.perf_counter() - t0
    if st and st.get("state") == "ready":
        return {"kept": True, "kill_to_ready_s": first_answer, "attach": attach(build, wv, ckpt, 3)}
    t1 = time.perf_counter()
    r = artfsctl("load", wv, ckpt, "--gpus", "0", check=False)
    return {"kept": False, "status_after_kill": st, "kill_to_answer_s": first_answer,
            "reload_s": time.perf_counter() - t1, "kill_to_ready_s": time.perf_counter() - t0,
            "reload_rc": r.returncode, "reload_err": r.stderr.strip()[-300:]}


def flip(name):
    build, py, gpu = BUILDS[name]
    out = f"/tmp/abi-flip-{name}"
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ, ARTFS_BUILD=build, PYTHONPATH=os.pathsep.join([py, gpu]), OUT=out,
               ARTFS_FLIP_GIB="8", ARTFS_FLIP_COLD="0")
    r = subprocess.run([sys.executable, os.path.join(gpu, "bench_flip.py")], capture_output=True,
                       text=True, env=env)
    try:
        with open(os.path.join(out, "flip-bench.json")) as f:
            res = json.load(f)
    except (OSError, ValueError):
        res = {}
    res["rc"] = r.returncode
    if r.returncode != 0:
        res["stderr"] = r.stderr[-2000:]
    return res


def one_build(name, small, big):
    build = BUILDS[name][0]
    conftest.BUILD = build
    d = Daemon().start()
    res = {}
    try:
        base = free_mib()
        res["load_8"] = [load(f"{name}-8-{i}", small) for i in range(2)]
        res["attach_8"] = attach(build, f"{name}-8-0", small, 5)
        for i in range(2):
            artfsctl("unload", f"{name}-8-{i}")
        res["free_after_unload_8_mib"] = settle_free(base) - base
        res["load_big"] = load(f"{name}-big", big)
        res["attach_big"] = attach(build, f"{name}-big", big, 3)
        res["kills"] = [kill_and_serve(d, build, f"{name}-big", big) for _ in range(3)]
        artfsctl("unload", f"{name}-big")
        res["free_after_unload_big_mib"] = settle_free(base) - base
    finally:
        d.stop()
    res["flip"] = flip(name)
    return res


def main():
    conftest.CKPT = "/dev/shm/artfs-abi-ckpt"
    small = make_checkpoint("hf8", 8, "--layout", "hf", "--files", "4")
    big = make_checkpoint("big", BIG, "--layout", "hf", "--files", "8", "--seed", "9")
    res = {"big_gib": BIG}
    for name in ("old", "new"):
        res[name] = one_build(name, small, big)
        print(name, json.dumps(res[name]), flush=True)
    with open(os.path.join(OUT, "weights-abi.json"), "w") as f:
        json.dump(res, f, indent=1)
    report(res)


def fmt_attach(a):
    return f"{a['median_s']:.3f} s (max {a['max_s']:.3f})" if "median_s" in a else a.get("error", "?")


def report(res):
    rows = []
    for key, what in (("load_8", "load 8 GiB, page cache"), ):
        for name in ("old", "new"):
            rows.append((f"{what}, {name}", " ".join(f"{x['gbps']:.1f}" for x in res[name][key]) + " GB/s",
                         f"GPU held / bytes {res[name][key][0]['gpu_held_over_bytes']:.4f}"))
    for name in ("old", "new"):
        lb = res[name]["load_big"]
        rows.append((f"load {res['big_gib']:.0f} GiB /dev/shm, {name}", f"{lb['gbps']:.1f} GB/s ({lb['daemon_s']:.2f} s)",
                     f"GPU held / bytes {lb['gpu_held_over_bytes']:.4f}"))
    for name in ("old", "new"):
        rows.append((f"attach 8 GiB, {name}", fmt_attach(res[name]["attach_8"]), "goal <= 0.3 s"))
        rows.append((f"attach {res['big_gib']:.0f} GiB, {name}", fmt_attach(res[name]["attach_big"]), "goal <= 0.3 s"))
    for name in ("old", "new"):
        for k in res[name]["kills"]:
            if k["kept"]:
                rows.append((f"kill -9 -> {res['big_gib']:.0f} GiB ready, {name}", f"{k['kill_to_ready_s']:.3f} s",
                             "then attach " + fmt_attach(k["attach"])))
            else:
                rows.append((f"kill -9 -> {res['big_gib']:.0f} GiB ready, {name}", f"{k['kill_to_ready_s']:.3f} s",
                             f"version lost (status {k['status_after_kill']}); reload {k['reload_s']:.2f} s"))
        rows.append((f"GPU free after unloads, {name}",
                     f"{res[name]['free_after_unload_8_mib']:+.0f} / {res[name]['free_after_unload_big_mib']:+.0f} MiB",
                     "against before the loads"))
    for name in ("old", "new"):
        f = res[name]["flip"]
        if f.get("rc") != 0 or "direct_same_8" not in f:
            rows.append((f"flips, {name}", "FAILED", f.get("stderr", "")[-200:].replace("\n", " ")))
            continue
        ds, h8 = f["direct_same_8"], f.get("host_8", {})
        rows.append((f"GPU-direct publish 8 GiB, {name}", f"{ds['publish_s']:.3f} s", f"copy {ds['copy_gbps']:.0f} GB/s"))
        if h8:
            rows.append((f"flip 8 GiB host, {name}", f"load {h8['load_s']:.3f} s ({h8['load_gbps']:.1f} GB/s)",
                         f"load start -> forward on v2 {h8['total_s']:.3f} s"))
    print("\n%-40s %-30s %s" % ("issue #27: before (old) and after (new)", "measured", ""))
    for r in rows:
        print("%-40s %-30s %s" % r)


if __name__ == "__main__":
    main()
