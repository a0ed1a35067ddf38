# SPDX-License-Identifier: Apache-2.0
"""Cold disk loads (issue #10) by reader threads and read size, against the
disk's own ceiling measured just before each load in the same run: the files
read cold by 4 threads in 64 MiB reads (bench_weights.cold_read_seconds).
Each setting is a daemon of its own; runs alternate ceiling and load, twice.
Bytes of the last load of each setting compared with safetensors'. Prints a
table, writes $OUT/disk.json.

    ARTFS_DISK_SWEEP="auto 8 4:64 8:64"   settings: reader threads, or
                                          threads:MiB with the read size"""
import json
import os

from bench_hostload import compare, daemon, load
from bench_weights import cold_read_seconds, data_bytes, evict
from conftest import artfsctl, make_checkpoint

OUT = os.environ.get("OUT", "/tmp")
SETTINGS = os.environ.get("ARTFS_DISK_SWEEP", "auto 8 4:64 8:64 16:64").split()


def main():
    hf8 = make_checkpoint("hf8", 8, "--layout", "hf", "--files", "4")
    nb = data_bytes(hf8)
    res = {"bytes": nb, "sweep": {}}
    try:
        for s in SETTINGS:
            d = daemon(s)
            try:
                runs = []
                for i in range(2):
                    ceiling = cold_read_seconds(hf8)
                    evict(hf8)
                    r = load(f"d{i}", hf8)
                    r["ceiling_s"] = ceiling
                    r["ratio"] = ceiling / r["s"]
                    runs.append(r)
                    if i == 0:
                        artfsctl("unload", f"d{i}")
                same = compare("d1", hf8)
                artfsctl("unload", "d1")
            finally:
                d.stop()
            res["sweep"][s] = {"runs": runs, "same_bytes": same}
            print(s, json.dumps(res["sweep"][s]), flush=True)
    finally:
        for k in ("ARTFS_LOAD_READERS", "ARTFS_LOAD_CHUNK_MIB"):
            os.environ.pop(k, None)
        with open(os.path.join(OUT, "disk.json"), "w") as f:
            json.dump(res, f, indent=1)
    print(f"\ncold disk loads, {nb / (1 << 30):.2f} GiB; ceiling = 4 threads x 64 MiB reads, cold")
    print("%-8s %-8s %-56s %s" % ("setting", "threads", "load GB/s (x ceiling GB/s), 2 runs", "bytes equal"))
    for s, r in res["sweep"].items():
        cells = " ".join(f"{x['gbps']:.2f} ({x['ratio']:.2f}x {nb / x['ceiling_s'] / 1e9:.2f})"
                         for x in r["runs"])
        print("%-8s %-8s %-56s %s" % (s, r["runs"][0]["threads"], cells, r["same_bytes"]))


if __name__ == "__main__":
    main()
