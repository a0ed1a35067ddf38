# SPDX-License-Identifier: Apache-2.0
"""Host-memory loads (issue #10) by the number of reader threads, 8 GiB from
/dev/shm (three loads, the first one right after the mount) and from the
page cache, with the pinned H2D ceiling of the same run; every setting's
bytes compared with safetensors'. Each setting is a daemon of its own
(ARTFS_LOAD_READERS; "auto" is the daemon's own choice). Prints a table,
writes $OUT/hostload.json.

    ARTFS_HOSTLOAD_ONE=1               also a one-file checkpoint written as
                                       bench_flip.py's trainer writes it, and
                                       loads each unloaded before the next
    ARTFS_SWEEP="auto 8 12 16 24 32"   settings: reader threads, or
                                       threads:MiB with the read size (chunk);
                                       "+pread" after either: files in memory
                                       read with pread, not out of a mapping"""
import json
import os
import time

import conftest
from bench_weights import data_bytes, h2d_gbps
from conftest import Daemon, artfsctl, engine, make_checkpoint, status, MOUNT

OUT = os.environ.get("OUT", "/tmp")
SETTINGS = os.environ.get("ARTFS_SWEEP", "auto 8 12 16 24 32").split()


KNOBS = ("ARTFS_LOAD_READERS", "ARTFS_LOAD_CHUNK_MIB", "ARTFS_LOAD_PREAD")


def daemon(setting):
    """setting: READERS[:CHUNK_MIB][+pread], READERS "auto" for the daemon's choice."""
    setting, _, how = setting.partition("+")
    readers, _, chunk = setting.partition(":")
    for k in KNOBS:
        os.environ.pop(k, None)
    if how == "pread":
        os.environ["ARTFS_LOAD_PREAD"] = "1"
    if readers != "auto":
        os.environ["ARTFS_LOAD_READERS"] = readers
    if chunk:
        os.environ["ARTFS_LOAD_CHUNK_MIB"] = chunk
    d = Daemon().start()
    time.sleep(2.5)  # its GPU warm-up (contexts, pinned buffers), off the clock
    return d


def load(wv, ckpt):
    artfsctl("load", wv, ckpt, "--gpus", "0")
    st = status(wv)
    r = {"s": float(st["seconds"]), "alloc_s": float(st["alloc_seconds"]),
         "bytes": int(st["bytes_total"]), "threads": int(st["load_threads"])}
    r["gbps"] = r["bytes"] / r["s"] / 1e9
    return r


def compare(wv, ckpt):
    p = engine("compare", MOUNT, wv, "0", ckpt)
    out, err = p.communicate(timeout=600)
    return out.startswith("OK") and p.returncode == 0


def warm(ckpt):
    for f in sorted(os.listdir(ckpt)):
        with open(os.path.join(ckpt, f), "rb") as fh:
            while fh.read(64 << 20):
                pass


def main():
    res = {"h2d_gbps": h2d_gbps(), "sweep": {}}
    hf8 = make_checkpoint("hf8", 8, "--layout", "hf", "--files", "4")
    conftest.CKPT = "/dev/shm/artfs-hostload"
    shm8 = make_checkpoint("shm8", 8, "--layout", "hf", "--files", "4", "--seed", "5")
    one8 = None
    if os.environ.get("ARTFS_HOSTLOAD_ONE") == "1":  # one file, written as bench_flip's trainer does
        from bench_flip import write_checkpoint
        one8 = "/dev/shm/artfs-hostload/one8"
        write_checkpoint(one8, 64, 7)
    try:
        for s in SETTINGS:
            d = daemon(s)
            try:
                warm(hf8)
                r = {"shm": [load(f"s{i}", shm8) for i in range(3)], "cache": [load("c", hf8)]}
                if one8:  # loaded and unloaded in turn, as in a flip
                    for name, ck in (("one", one8), ("shm_unloaded", shm8)):
                        r[name] = []
                        for i in range(3):
                            r[name].append(load(f"{name}{i}", ck))
                            artfsctl("unload", f"{name}{i}")
                r["same_bytes"] = compare("s2", shm8) and compare("c", hf8)
                for i in range(3):
                    artfsctl("unload", f"s{i}")
                artfsctl("unload", "c")
            finally:
                d.stop()
            res["sweep"][s] = r
            print(s, json.dumps(r), flush=True)
    finally:
        for k in KNOBS:
            os.environ.pop(k, None)
        with open(os.path.join(OUT, "hostload.json"), "w") as f:
            json.dump(res, f, indent=1)
    h2d = res["h2d_gbps"]
    print(f"\npinned H2D ceiling {h2d:.1f} GB/s; checkpoint {data_bytes(shm8) / (1 << 30):.2f} GiB")
    print("%-8s %-8s %-42s %-22s %s" % ("readers", "threads", "/dev/shm 8 GiB: GB/s (x H2D), 3 loads",
                                        "page cache 8 GiB", "bytes equal"))
    for s, r in res["sweep"].items():
        shm = " ".join(f"{x['gbps']:.1f} ({x['gbps'] / h2d:.2f}x)" for x in r["shm"])
        c = r["cache"][0]
        print("%-8s %-8s %-42s %-22s %s" % (s, c["threads"], shm, f"{c['gbps']:.1f} ({c['gbps'] / h2d:.2f}x)",
                                            r["same_bytes"]))


if __name__ == "__main__":
    main()
