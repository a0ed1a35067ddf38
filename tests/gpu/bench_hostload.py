"""Host-memory loads (issue #10) by the number of reader threads, 8 GiB from
/dev/shm (three loads, the first one right after the mount) and from the
page cache, with the pinned H2D ceiling of the same run; every setting's
bytes compared with safetensors'. Each setting is a daemon of its own
(ARTFS_LOAD_READERS; "auto" is the daemon's own choice). Prints a table,
writes $OUT/hostload.json.

    ARTFS_SWEEP="auto 8 12 16 24 32"   settings (reader threads)"""
import json
import os
import time

import conftest
from bench_weights import data_bytes, h2d_gbps
from conftest import Daemon, artfsctl, engine, make_checkpoint, status, MOUNT

OUT = os.environ.get("OUT", "/tmp")
SETTINGS = os.environ.get("ARTFS_SWEEP", "auto 8 12 16 24 32").split()


def daemon(setting):
    os.environ.pop("ARTFS_LOAD_READERS", None)
    if setting != "auto":
        os.environ["ARTFS_LOAD_READERS"] = setting
    d = Daemon().start()
    time.sleep(2.5)  # its GPU warm-up (contexts, pinned buffers), off the clock
    return d


def load(wv, ckpt):
    artfsctl("load", wv, ckpt, "--gpus", "0")
    st = status(wv)
    r = {"s": float(st["seconds"]), "bytes": int(st["bytes_total"]),
         "threads": int(st["load_threads"])}
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
    try:
        for s in SETTINGS:
            d = daemon(s)
            try:
                warm(hf8)
                r = {"shm": [load(f"s{i}", shm8) for i in range(3)], "cache": [load("c", hf8)]}
                r["same_bytes"] = compare("s2", shm8) and compare("c", hf8)
                for i in range(3):
                    artfsctl("unload", f"s{i}")
                artfsctl("unload", "c")
            finally:
                d.stop()
            res["sweep"][s] = r
            print(s, json.dumps(r), flush=True)
    finally:
        os.environ.pop("ARTFS_LOAD_READERS", None)
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
