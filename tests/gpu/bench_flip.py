# SPDX-License-Identifier: Apache-2.0
"""Flip benchmark (issue #10): a trainer writes v2, the daemon loads it (or
takes it GPU-direct), the engine rebinds and runs its first forward pass on
v2; each phase timed, with the host->device, device->device and peer-to-peer
ceilings measured in the same run. Prints a table, writes $OUT/flip-bench.json.

    ARTFS_FLIP_GIB="8 64"   sizes of the host-memory flips ("" for none)
    ARTFS_FLIP_COLD=0       skip the cold-disk and page-cache loads
    ARTFS_FLIP_SHM=DIR      where the trainer writes (default /dev/shm/artfs-flip)"""
import json
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import nn

import artfs
import artfs.torch
from bench_weights import cold_read_seconds, data_bytes, evict, h2d_gbps
from conftest import GPUS, MOUNT, Daemon, artfsctl, make_checkpoint, status

OUT = os.environ.get("OUT", "/tmp")
D = 8192                      # a layer is D x D bf16: 128 MiB
SHM = os.environ.get("ARTFS_FLIP_SHM", "/dev/shm/artfs-flip")  # where the trainer writes
WRITERS = 8                   # the trainer's save: layers written by 8 threads


class Stack(nn.Module):
    def __init__(self, layers):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(D, D, bias=False) for _ in range(layers))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def meta_model(layers):
    with torch.device("meta"):
        return Stack(layers).to(torch.bfloat16)


def copy_gbps(src, dst, nbytes=4 << 30):
    a = torch.empty(nbytes, dtype=torch.uint8, device=src)
    b = torch.empty(nbytes, dtype=torch.uint8, device=dst)
    best = 0.0
    for _ in range(5):
        torch.cuda.synchronize(src), torch.cuda.synchronize(dst)
        t0 = time.perf_counter()
        b.copy_(a, non_blocking=True)
        torch.cuda.synchronize(src), torch.cuda.synchronize(dst)
        best = max(best, nbytes / (time.perf_counter() - t0) / 1e9)
    del a, b
    torch.cuda.empty_cache()
    return best


def layer_tensor(i, seed, device="cuda:0"):
    g = torch.Generator(device=device).manual_seed(seed * 100003 + i)
    return (torch.randn(D, D, device=device, dtype=torch.bfloat16, generator=g) * 0.01)


def write_checkpoint(path, layers, seed):
    """The trainer's save: one safetensors file written layer by layer."""
    os.makedirs(path, exist_ok=True)
    size = D * D * 2
    header = {f"layers.{i}.weight": {"dtype": "BF16", "shape": [D, D],
                                     "data_offsets": [i * size, (i + 1) * size]} for i in range(layers)}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    start = 8 + len(h)
    fd = os.open(os.path.join(path, "model.safetensors"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.pwrite(fd, len(h).to_bytes(8, "little") + h, 0)

        def write(first):  # layers first, first+W, ... on one thread
            for i in range(first, layers, WRITERS):
                os.pwrite(fd, layer_tensor(i, seed).view(torch.uint8).cpu().numpy().data, start + i * size)

        with ThreadPoolExecutor(WRITERS) as ex:
            list(ex.map(write, range(WRITERS)))
    finally:
        os.close(fd)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"architectures": ["Stack"]}, f)


def forward_check(model, x, seed):
    """The first forward pass, and that it ran on the new weights."""
    t0 = time.perf_counter()
    with torch.no_grad():
        y = model(x)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    w0 = layer_tensor(0, seed)
    assert torch.equal(model.layers[0].weight, w0), "the model is not on the new weights"
    return dt, y


def host_flip(gib, x):
    layers = int(gib * (1 << 30)) // (D * D * 2)
    shutil.rmtree(SHM, ignore_errors=True)
    r = {"gib": layers * D * D * 2 / (1 << 30)}
    t0 = time.perf_counter()
    write_checkpoint(SHM, layers, 1)
    r["trainer_write_v1_s"] = time.perf_counter() - t0
    artfsctl("load", f"f{gib}-v1", SHM, "--gpus", "0")
    model = meta_model(layers)
    w = artfs.attach_weights(f"f{gib}-v1", 0, checkpoint_dir=SHM, mount=MOUNT)
    artfs.torch.bind(model, w)
    del w
    forward_check(model, x, 1)
    # The trainer writes v2 over v1's files (tmpfs holds one of them at 64 GiB).
    t0 = time.perf_counter()
    write_checkpoint(SHM, layers, 2)
    r["trainer_write_v2_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    artfsctl("load", f"f{gib}-v2", SHM, "--gpus", "0")
    t1 = time.perf_counter()
    w = artfs.attach_weights(f"f{gib}-v2", 0, checkpoint_dir=SHM, mount=MOUNT)
    artfs.torch.bind(model, w)
    del w
    t2 = time.perf_counter()
    r["forward_s"], _ = forward_check(model, x, 2)
    r["load_s"], r["rebind_s"] = t1 - t0, t2 - t1
    r["total_s"] = time.perf_counter() - t0
    st = status(f"f{gib}-v2")
    r["daemon_load_s"] = float(st["seconds"])
    r["daemon_alloc_s"] = float(st["alloc_seconds"])
    r["bytes"] = int(st["bytes_total"])
    r["load_gbps"] = r["bytes"] / r["daemon_load_s"] / 1e9
    before = torch.cuda.mem_get_info(0)[0]
    artfsctl("unload", f"f{gib}-v1")
    time.sleep(1)
    r["v1_freed_gib"] = (torch.cuda.mem_get_info(0)[0] - before) / (1 << 30)
    del model
    artfsctl("unload", f"f{gib}-v2")
    shutil.rmtree(SHM, ignore_errors=True)
    return r


def direct_flip(gib, x, target):
    layers = int(gib * (1 << 30)) // (D * D * 2)
    r = {"gib": layers * D * D * 2 / (1 << 30), "target": target}
    trainer = {f"layers.{i}.weight": layer_tensor(i, 3) for i in range(layers)}
    model = meta_model(layers)
    torch.cuda.synchronize()
    wv = f"d{gib}-{target}"
    t0 = time.perf_counter()
    artfs.torch.publish_weights(wv, trainer, 0, MOUNT, target_device=target, architecture="Stack")
    t1 = time.perf_counter()
    r["publish_s"] = t1 - t0
    st = status(wv)
    r["copy_s"] = float(st["copy_seconds"])
    r["open_s"] = float(st.get("open_seconds", "nan"))
    r["alloc_s"] = float(st.get("alloc_seconds", "nan"))
    r["bytes"] = int(st["bytes_total"])
    r["copy_gbps"] = r["bytes"] / r["copy_s"] / 1e9
    r["publish_gbps"] = r["bytes"] / r["publish_s"] / 1e9
    if target == 0:
        w = artfs.attach_weights(wv, 0, mount=MOUNT)
        artfs.torch.bind(model, w)
        del w
        t2 = time.perf_counter()
        r["rebind_s"] = t2 - t1
        r["forward_s"], _ = forward_check(model, x, 3)
        r["total_s"] = time.perf_counter() - t0
    del trainer, model
    torch.cuda.empty_cache()
    artfsctl("unload", wv)
    return r


def main():
    d = Daemon().start()
    res = {"gpus": GPUS}
    x = torch.randn(4, D, device="cuda:0", dtype=torch.bfloat16)
    try:
        res["h2d_gbps"] = h2d_gbps()
        res["d2d_gbps"] = copy_gbps("cuda:0", "cuda:0")
        if GPUS >= 2:
            res["p2p_gbps"] = copy_gbps("cuda:0", "cuda:1")
        res["direct_same_8"] = direct_flip(8, x, 0)  # a warm-up: first GEMMs, contexts
        res["direct_same_8"] = direct_flip(8, x, 0)
        if GPUS >= 2:
            res["direct_other_8"] = direct_flip(8, x, 1)
        if os.environ.get("ARTFS_FLIP_COLD", "1") != "0":
            # Cold disk: the disk read by parallel readers, then a cold load.
            hf8 = make_checkpoint("hf8", 8, "--layout", "hf", "--files", "4")
            nb = data_bytes(hf8)
            res["cold_read_gbps"] = nb / cold_read_seconds(hf8, threads=8)
            evict(hf8)
            artfsctl("load", "cold", hf8, "--gpus", "0")
            res["cold_load_gbps"] = int(status("cold")["bytes_total"]) / float(status("cold")["seconds"]) / 1e9
            artfsctl("unload", "cold")
            res["warm_load_gbps"] = []
            for i in range(2):
                artfsctl("load", f"warm{i}", hf8, "--gpus", "0")
                res["warm_load_gbps"].append(int(status(f"warm{i}")["bytes_total"]) /
                                             float(status(f"warm{i}")["seconds"]) / 1e9)
                artfsctl("unload", f"warm{i}")
        for gib in os.environ.get("ARTFS_FLIP_GIB", "8 64").split():
            res[f"host_{gib}"] = host_flip(int(gib), x)
            print(json.dumps(res[f"host_{gib}"]), flush=True)
    finally:
        with open(os.path.join(OUT, "flip-bench.json"), "w") as f:
            json.dump(res, f, indent=1)
        d.stop()
    report(res)


def report(res):
    h2d = res["h2d_gbps"]
    rows = [("pinned H2D ceiling", f"{h2d:.1f} GB/s", ""),
            ("D2D ceiling (GPU 0)", f"{res['d2d_gbps']:.0f} GB/s", "")]
    if "p2p_gbps" in res:
        rows.append(("P2P ceiling (GPU 0 -> 1)", f"{res['p2p_gbps']:.0f} GB/s", ""))
    if "cold_read_gbps" in res:
        rows.append(("cold disk read, 8 readers", f"{res['cold_read_gbps'] / 1e9:.2f} GB/s", ""))
        rows.append(("load cold 8 GiB", f"{res['cold_load_gbps']:.2f} GB/s",
                     f"{res['cold_load_gbps'] * 1e9 / res['cold_read_gbps']:.2f}x disk (goal >= 0.9)"))
    for g in res.get("warm_load_gbps", []):
        rows.append(("load 8 GiB, page cache", f"{g:.1f} GB/s", f"{g / h2d:.2f}x H2D (goal >= 0.8)"))
    for k in [k for k in res if k.startswith("host_")]:
        r = res[k]
        rows.append((f"flip {r['gib']:.0f} GiB {os.path.dirname(SHM)}: load", f"{r['load_s']:.3f} s",
                     f"daemon {r['load_gbps']:.1f} GB/s = {r['load_gbps'] / h2d:.2f}x H2D (goal >= 0.8)"))
        rows.append(("  rebind / first forward", f"{r['rebind_s']:.3f} / {r['forward_s']:.3f} s",
                     f"trainer write v2 {r['trainer_write_v2_s']:.1f} s"))
        rows.append(("  load start -> forward on v2", f"{r['total_s']:.3f} s",
                     "goal <= 2 s at 64 GiB" + f"; v1 freed {r['v1_freed_gib']:.1f} GiB"))
    r = res["direct_same_8"]
    rows.append(("GPU-direct 8 GiB same GPU: publish", f"{r['publish_s']:.3f} s",
                 f"copy {r['copy_s']:.4f} s, {r['copy_gbps']:.0f} GB/s = "
                 f"{r['copy_gbps'] / res['d2d_gbps']:.2f}x D2D (goal publish <= 0.1 s)"))
    rows.append(("  publish start -> forward on v2", f"{r['total_s']:.3f} s",
                 f"rebind {r['rebind_s']:.3f}, forward {r['forward_s']:.3f} (goal <= 0.2 s)"))
    if "direct_other_8" in res:
        r = res["direct_other_8"]
        rows.append(("GPU-direct 8 GiB GPU 0 -> 1", f"{r['publish_s']:.3f} s",
                     f"copy {r['copy_gbps']:.0f} GB/s = {r['copy_gbps'] / res['p2p_gbps']:.2f}x P2P; "
                     f"whole call {r['publish_gbps'] / res['p2p_gbps']:.2f}x (goal >= 0.8)"))
    for k in ("direct_same_8", "direct_other_8"):
        if k in res:
            r = res[k]
            rows.append((f"  {k}: open / alloc / copy", f"{r['open_s']:.4f} / {r['alloc_s']:.4f} / "
                         f"{r['copy_s']:.4f} s", "daemon's phases of the call"))
    print("\n%-40s %-20s %s" % ("flip benchmark", "measured", "against"))
    for row in rows:
        print("%-40s %-20s %s" % row)


if __name__ == "__main__":
    main()
