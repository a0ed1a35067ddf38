# SPDX-License-Identifier: Apache-2.0
"""Flip in place against its alternatives (issue #38), side by side, one run:
an engine with a CUDA graph of its forward captured switches from v1 to v2
(both loaded by the daemon) by

  in place   artfs.torch.flip_in_place: v2's slab mapped at v1's addresses
  rebind     attach v2, artfs.torch.bind, capture the graph again
  copy       a device-to-device copy of v2 into the engine's own storage

timed from the request to every tensor of v2 live (the graph's first replay
on v2 done), with the GPU memory the engine holds beyond the daemon's during
each (sampled while it runs). Prints a table, writes $OUT/flip-in-place.json.

    ARTFS_FLIP_IN_PLACE_GIB="8 64"   sizes; one whose two versions do not fit
                                     the GPU is replaced by the largest that does"""
import gc
import json
import os
import shutil
import threading
import time

import torch

import artfs
import artfs.torch
from bench_flip import D, SHM, layer_tensor, meta_model, write_checkpoint
from conftest import Daemon, MOUNT, artfsctl

OUT = os.environ.get("OUT", "/tmp")
GIB = 1 << 30
LAYER = D * D * 2


class Low:
    """The least free GPU memory seen while it runs (a thread sampling)."""

    def __enter__(self):
        torch.cuda.synchronize()
        self.start = torch.cuda.mem_get_info(0)[0]
        self.low = self.start
        self.on = True
        self.t = threading.Thread(target=self.run)
        self.t.start()
        return self

    def run(self):
        while self.on:
            self.low = min(self.low, torch.cuda.mem_get_info(0)[0])
            time.sleep(0.0002)

    def __exit__(self, *exc):
        torch.cuda.synchronize()
        self.on = False
        self.t.join()
        self.low = min(self.low, torch.cuda.mem_get_info(0)[0])
        self.extra_gib = (self.start - self.low) / GIB


def capture(model, x):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        model(x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g), torch.no_grad():
        out = model(x)
    return g, out


def on_version(model, seed):
    return torch.equal(model.layers[0].weight, layer_tensor(0, seed)) and \
        torch.equal(model.layers[-1].weight, layer_tensor(len(model.layers) - 1, seed))


def one_size(gib, x):
    layers = int(gib * GIB) // LAYER
    r = {"gib": layers * LAYER / GIB}
    v1, v2 = f"fip{gib}-v1", f"fip{gib}-v2"
    for wv, seed in ((v1, 1), (v2, 2)):
        shutil.rmtree(SHM, ignore_errors=True)
        write_checkpoint(SHM, layers, seed)
        artfsctl("load", wv, SHM, "--gpus", "0")
    shutil.rmtree(SHM, ignore_errors=True)

    # In place: bound once, the graph captured once, flips.
    model = meta_model(layers)
    artfs.torch.bind_in_place(model, v1, 0, MOUNT)
    g, out = capture(model, x)
    g.replay()
    with Low() as low:
        t0 = time.perf_counter()
        r["in_place_flip_s"] = artfs.torch.flip_in_place(model, v2)
        g.replay()
        torch.cuda.synchronize()
        r["in_place_live_s"] = time.perf_counter() - t0
    r["in_place_extra_gib"] = low.extra_gib
    assert on_version(model, 2), "in place: not on v2"
    times = []
    for i in range(10):
        times.append(artfs.torch.flip_in_place(model, v1 if i % 2 == 0 else v2))
    r["in_place_flip_median_s"] = sorted(times)[5]
    assert on_version(model, 2)
    g.replay()
    torch.cuda.synchronize()
    ref_v2 = out.clone()

    # Rebind: attach v1 anew, bind, capture again (the graph of v2 is stale).
    other = meta_model(layers)
    w = artfs.attach_weights(v2, 0, mount=MOUNT)
    artfs.torch.bind(other, w)
    del w
    g2, out2 = capture(other, x)
    with Low() as low:
        t0 = time.perf_counter()
        w = artfs.attach_weights(v1, 0, mount=MOUNT)
        artfs.torch.bind(other, w)
        del w
        t1 = time.perf_counter()
        del g2, out2
        g2, out2 = capture(other, x)
        t2 = time.perf_counter()
        g2.replay()
        torch.cuda.synchronize()
        r["rebind_live_s"] = time.perf_counter() - t0
    r["rebind_attach_bind_s"], r["rebind_capture_s"] = t1 - t0, t2 - t1
    r["rebind_extra_gib"] = low.extra_gib
    assert on_version(other, 1), "rebind: not on v1"
    del g2, out2, other
    torch.cuda.empty_cache()

    # Copy: the engine's own storage (a second resident copy), v2 copied in.
    del g, out
    model = None
    gc.collect()  # the module's attachment in place goes with it
    torch.cuda.empty_cache()
    artfsctl("unload", v1)  # room for the engine's own copy
    time.sleep(0.5)
    free_before_own = torch.cuda.mem_get_info(0)[0]
    own = meta_model(layers).to_empty(device="cuda:0")
    r["copy_engine_holds_gib"] = (free_before_own - torch.cuda.mem_get_info(0)[0]) / GIB
    g3, out3 = capture(own, x)
    w = artfs.attach_weights(v2, 0, mount=MOUNT)
    src = [w[f"layers.{i}.weight"] for i in range(layers)]
    with Low() as low, torch.no_grad():
        t0 = time.perf_counter()
        for i, layer in enumerate(own.layers):
            layer.weight.copy_(src[i], non_blocking=True)
        g3.replay()
        torch.cuda.synchronize()
        r["copy_live_s"] = time.perf_counter() - t0
    r["copy_extra_gib"] = low.extra_gib + r["copy_engine_holds_gib"]
    r["copy_gbps"] = layers * LAYER / r["copy_live_s"] / 1e9
    assert on_version(own, 2) and torch.equal(out3, ref_v2), "copy: not v2's output"
    del src, w, g3, out3, own
    torch.cuda.empty_cache()
    artfsctl("unload", v2)
    time.sleep(0.5)
    return r


def main():
    d = Daemon().start()
    total = torch.cuda.mem_get_info(0)[1]
    res = {"device": torch.cuda.get_device_name(0), "total_gib": total / GIB, "sizes": {}}
    x = torch.randn(4, D, device="cuda:0", dtype=torch.bfloat16)
    try:
        for gib in os.environ.get("ARTFS_FLIP_IN_PLACE_GIB", "8 64").split():
            gib = int(gib)
            fits = int((total / GIB - 6) / 2) // 8 * 8  # two versions and the contexts
            if gib > fits:
                res.setdefault("replaced", []).append(f"{gib} GiB: two versions do not fit "
                                                      f"{total / GIB:.0f} GiB; {fits} GiB instead")
                gib = fits
            res["sizes"][str(gib)] = one_size(gib, x)
            print(json.dumps(res["sizes"][str(gib)]), flush=True)
    finally:
        with open(os.path.join(OUT, "flip-in-place.json"), "w") as f:
            json.dump(res, f, indent=1)
        d.stop()
    report(res)


def report(res):
    print(f"\nflip in place on {res['device']} ({res['total_gib']:.0f} GiB)")
    for note in res.get("replaced", []):
        print("  " + note)
    print("%-10s %-12s %-16s %-22s %s" % ("size", "way", "request -> live", "parts", "engine's GPU memory"))
    for gib, r in res["sizes"].items():
        print("%-10s %-12s %-16s %-22s %s" % (f"{r['gib']:.0f} GiB", "in place",
                                              f"{r['in_place_live_s'] * 1e3:.2f} ms",
                                              f"flip {r['in_place_flip_s'] * 1e3:.2f} ms (median "
                                              f"{r['in_place_flip_median_s'] * 1e3:.2f})",
                                              f"+{r['in_place_extra_gib']:.2f} GiB"))
        print("%-10s %-12s %-16s %-22s %s" % ("", "rebind", f"{r['rebind_live_s'] * 1e3:.1f} ms",
                                              f"attach+bind {r['rebind_attach_bind_s'] * 1e3:.1f}, "
                                              f"capture {r['rebind_capture_s'] * 1e3:.1f} ms",
                                              f"+{r['rebind_extra_gib']:.2f} GiB"))
        print("%-10s %-12s %-16s %-22s %s" % ("", "D2D copy", f"{r['copy_live_s'] * 1e3:.1f} ms",
                                              f"{r['copy_gbps']:.0f} GB/s",
                                              f"+{r['copy_extra_gib']:.2f} GiB (its own copy)"))


if __name__ == "__main__":
    main()
