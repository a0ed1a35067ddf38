"""Host-memory loads (issue #10): the registered path (the source's pages
pinned in place with cudaHostRegister, copied by the GPU) against the pread
path (reader threads into pinned buffers), in one run, with the pinned H2D
ceiling and the disk's measured alongside; a check that each path's bytes
equal safetensors'; and GPU-direct publish with its phases. Each setting
is a daemon of its own (ARTFS_LOAD_PATH, ARTFS_REG_WORKERS,
ARTFS_REG_WINDOW_MB). Prints a table, writes $OUT/hostload.json.

    ARTFS_SWEEP="read 4:256 8:512 16:512"   settings (workers:window MiB)"""
import json
import os
import time

import torch

import conftest
from bench_weights import cold_read_seconds, data_bytes, evict, h2d_gbps
from conftest import GPUS, Daemon, artfsctl, engine, make_checkpoint, status, MOUNT

OUT = os.environ.get("OUT", "/tmp")
SETTINGS = os.environ.get("ARTFS_SWEEP", "read 4:256 8:256 8:512 8:1024 16:512").split()
ENV = ("ARTFS_LOAD_PATH", "ARTFS_REG_WORKERS", "ARTFS_REG_WINDOW_MB")


def daemon(setting):
    for k in ENV:
        os.environ.pop(k, None)
    if setting == "read":
        os.environ["ARTFS_LOAD_PATH"] = "read"
    elif setting != "auto":
        w, m = setting.split(":")
        os.environ.update(ARTFS_LOAD_PATH="register", ARTFS_REG_WORKERS=w, ARTFS_REG_WINDOW_MB=m)
    d = Daemon().start()
    time.sleep(1.5)  # its GPU warm-up, off the clock
    return d


def load(wv, ckpt, gpus="0"):
    artfsctl("load", wv, ckpt, "--gpus", gpus)
    st = status(wv)
    r = {"s": float(st["seconds"]), "bytes": int(st["bytes_total"]), "path": st.get("host_path"),
         "threads": st.get("load_threads"), "broadcast": st["broadcast"]}
    r["gbps"] = r["bytes"] / r["s"] / 1e9
    return r


def compare(wv, ckpt, rank):
    p = engine("compare", MOUNT, wv, str(rank), ckpt)
    out, err = p.communicate(timeout=600)
    return out.startswith("OK") and p.returncode == 0, (out + err)[-400:]


def warm(ckpt):
    for f in sorted(os.listdir(ckpt)):
        with open(os.path.join(ckpt, f), "rb") as fh:
            while fh.read(64 << 20):
                pass


def main():
    res = {"gpus": GPUS, "h2d_gbps": h2d_gbps()}
    hf8 = make_checkpoint("hf8", 8, "--layout", "hf", "--files", "4")
    conftest.CKPT = "/dev/shm/artfs-hostload"
    shm8 = make_checkpoint("shm8", 8, "--layout", "hf", "--files", "4", "--seed", "5")
    nb = data_bytes(shm8)
    res["sweep"] = {}
    for s in SETTINGS:
        d = daemon(s)
        try:
            warm(hf8)
            r = {"shm": [load(f"s{i}", shm8) for i in range(2)], "cache": [load("c", hf8)]}
            for i in range(2):
                artfsctl("unload", f"s{i}")
            artfsctl("unload", "c")
        finally:
            d.stop()
        res["sweep"][s] = r
        print(s, json.dumps(r), flush=True)
    d = daemon("auto")
    try:
        res["auto_shm"] = load("a1", shm8)
        res["check_shm_1gpu"] = compare("a1", shm8, 0)
        artfsctl("unload", "a1")
        if GPUS >= 2:
            res["auto_shm_2gpu"] = load("a2", shm8, "0,1")
            res["check_shm_2gpu"] = compare("a2", shm8, 1)
            artfsctl("unload", "a2")
        warm(hf8)
        res["auto_cache"] = load("a3", hf8)
        res["check_cache"] = compare("a3", hf8, 0)
        artfsctl("unload", "a3")
        res["cold_read_gbps"] = data_bytes(hf8) / cold_read_seconds(hf8, threads=8) / 1e9
        evict(hf8)
        res["auto_cold"] = load("a4", hf8)
        artfsctl("unload", "a4")
        res["check_cold"] = None
        if GPUS >= 2:
            ranks = 2
            sh = make_checkpoint(f"sharded{ranks}", 4, "--layout", "sharded", "--ranks", str(ranks),
                                 "--files", "2", "--seed", "2")
            res["auto_sharded"] = load("a5", sh, "0,1")
            res["check_sharded"] = [compare("a5", sh, r) for r in range(ranks)]
            artfsctl("unload", "a5")
        # GPU-direct publish: the daemon warmed its GPUs when it started.
        from bench_flip import copy_gbps, direct_flip
        x = torch.randn(4, 8192, device="cuda:0", dtype=torch.bfloat16)
        res["d2d_gbps"] = copy_gbps("cuda:0", "cuda:0")
        res["direct_same_8"] = [direct_flip(8, x, 0) for _ in range(2)]
        if GPUS >= 2:
            res["p2p_gbps"] = copy_gbps("cuda:0", "cuda:1")
            res["direct_other_8"] = [direct_flip(8, x, 1) for _ in range(3)]
    finally:
        d.stop()
        with open(os.path.join(OUT, "hostload.json"), "w") as f:
            json.dump(res, f, indent=1)
    h2d = res["h2d_gbps"]
    print(f"\npinned H2D ceiling {h2d:.1f} GB/s; checkpoint {nb / (1 << 30):.2f} GiB in /dev/shm")
    print("%-12s %-34s %s" % ("setting", "/dev/shm 8 GiB (GB/s, x H2D)", "page cache 8 GiB"))
    for s, r in res["sweep"].items():
        print("%-12s %-34s %s" % (s, " ".join(f"{x['gbps']:.1f} ({x['gbps'] / h2d:.2f}x)" for x in r["shm"]),
                                  " ".join(f"{x['gbps']:.1f} ({x['gbps'] / h2d:.2f}x) {x['path']}"
                                           for x in r["cache"])))
    for k in ("auto_shm", "auto_shm_2gpu", "auto_cache", "auto_cold", "auto_sharded"):
        if k in res:
            r = res[k]
            print(f"{k:14s} {r['gbps']:.1f} GB/s {r['s']:.3f} s path={r['path']} threads={r['threads']} "
                  f"bcast={r['broadcast']}")
    print(f"cold disk read, 8 readers {res['cold_read_gbps']:.2f} GB/s; cold load "
          f"{res['auto_cold']['gbps'] / res['cold_read_gbps']:.2f}x disk")
    for k in ("check_shm_1gpu", "check_shm_2gpu", "check_cache", "check_sharded"):
        if k in res:
            print(k, res[k])
    for k in ("direct_same_8", "direct_other_8"):
        for r in res.get(k, []):
            ceil = res["d2d_gbps"] if k == "direct_same_8" else res["p2p_gbps"]
            print(f"{k}: call {r['publish_s']:.4f} s = {r['publish_gbps'] / ceil:.2f}x; open {r['open_s']:.4f} "
                  f"alloc {r['alloc_s']:.4f} copy {r['copy_s']:.4f} ({r['copy_gbps'] / ceil:.2f}x)")


if __name__ == "__main__":
    main()
