#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""put_layers: where an engine's batch publish spends its time, layer by
layer, same objects and batch size, in turns:

    /usr/bin/python3 bench/put_layers.py <mountpoint> [objects] [rounds] [batch]

  artfs_put     .keys/.put as batch_bench does it (open, writev, fsync, read
                the result lines, close)
  publish_many  artfs.publish_many (the same, and the result lines parsed)
  store.put     artfs.vllm.ArtfsArtifactStore.put (and its checks of every
                key and header first)
  checks        those checks alone
and the parse of 64 result lines. Microseconds per object, medians."""
import os
import statistics
import sys
import timeit
import time

import batch_bench as b

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "contrib", "python"))
import artfs.r3 as r3  # noqa: E402
from artfs.vllm import ArtfsArtifactStore, _KEY  # noqa: E402


def main():
    mnt = sys.argv[1]
    n, rounds, batch = [int(sys.argv[2 + i]) if len(sys.argv) > 2 + i else d
                        for i, d in enumerate((2048, 4, 64))]
    os.makedirs(os.path.join(mnt, b.WV), exist_ok=True)
    store = ArtfsArtifactStore(mnt)
    res = {k: [] for k in ("artfs_put", "publish_many", "store.put", "checks")}
    for r in range(rounds):
        for name in res:
            objs = b.make(n, 100 * r + len(name))
            items = [b._Object("vllm-artifact/" + k, e) for _, k, e in objs]
            envs = [e for _, _, e in objs]
            t = time.perf_counter()
            if name == "artfs_put":
                b.artfs_put(mnt, objs, batch)
            elif name == "publish_many":
                for i in range(0, n, batch):
                    r3.publish_many(None, envs[i:i + batch], mnt)
            elif name == "store.put":
                for i in range(0, n, batch):
                    store.put(items[i:i + batch])
            else:
                for o in items:
                    if not _KEY.fullmatch(o.key) or store._layout.key_of(o.payload) != o.key:
                        raise SystemExit(f"check failed for {o.key}")
            res[name].append((time.perf_counter() - t) / n * 1e6)
            if name != "checks":
                for _, k, _ in objs:
                    os.unlink(os.path.join(mnt, ".keys", k))
    for k, v in res.items():
        print(f"{k:13s} {statistics.median(v):7.2f} us/object ({' '.join('%.1f' % x for x in v)})")
    text = "".join(f"{'ab' * 32} 0\n" for _ in range(64)).encode()
    us = timeit.timeit(lambda: r3._parse_results(text, "-"), number=2000) / 2000 * 1e6
    print(f"result lines of 64 parsed in {us:.1f} us")


if __name__ == "__main__":
    main()
