# SPDX-License-Identifier: Apache-2.0
"""Concurrency stress through a real mount, bounded in time: readers compare
every byte they get against numpy.save while other processes publish,
re-publish, unlink and re-publish the same keys.

Used by test_stress.py; also runs alone against any mount for longer runs:

    /usr/bin/python3 tests/mount/stress.py /mnt/artifacts [seconds] [writers] [readers]
"""
import errno
import multiprocessing
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from envelope import encode, npy_bytes, routed_experts  # noqa: E402

WV = "stress"
# Keys the readers read and the writers keep re-publishing (identical content).
HASHES = ["%02x" % i * 16 for i in range(1, 5)]


def _republisher(mount, seconds, seed, out):
    """Re-publishes identical content onto committed keys, every way a
    client may try: O_TRUNC ('wb'), plain O_WRONLY, O_EXCL."""
    counts = {}
    deadline = time.time() + seconds
    flags = [os.O_CREAT | os.O_WRONLY | os.O_TRUNC, os.O_CREAT | os.O_WRONLY,
             os.O_CREAT | os.O_WRONLY | os.O_EXCL, os.O_WRONLY]
    i = seed
    while time.time() < deadline:
        h = HASHES[i % len(HASHES)]
        f = flags[i % len(flags)]
        i += 1
        env = encode(WV, h, routed_experts(16, seed=HASHES.index(h)))
        path = os.path.join(mount, WV, h)
        try:
            fd = os.open(path, f, 0o644)
        except OSError as e:
            k = "open:" + errno.errorcode[e.errno]
        else:
            try:
                for off in range(0, len(env), 1000):
                    os.write(fd, env[off:off + 1000])
                k = "ok"
            except OSError as e:
                k = "write:" + errno.errorcode[e.errno]
            try:
                os.close(fd)
            except OSError as e:
                k = "close:" + errno.errorcode[e.errno]
        counts[k] = counts.get(k, 0) + 1
    out.put(("writer", counts))


def _churner(mount, seconds, out):
    """Publishes fresh keys from several processes at once (concurrent
    creates of one name), then unlinks them: new inodes come and go beside
    the ones being read."""
    counts = {}
    deadline = time.time() + seconds
    n = 0
    while time.time() < deadline:
        h = "%04x" % (n % 64) + "ee"
        n += 1
        path = os.path.join(mount, WV, h)
        env = encode(WV, h, routed_experts(8, seed=n % 64))
        try:
            with open(path, "wb") as f:
                f.write(env)
            k = "ok"
        except OSError as e:
            k = errno.errorcode[e.errno]
        counts[k] = counts.get(k, 0) + 1
        if n % 3 == 0:
            try:
                os.unlink(path)
            except OSError:
                pass
    out.put(("churn", counts))


def _reader(mount, seconds, expected, out):
    wrong = reads = 0
    errors = {}
    first_wrong = None
    deadline = time.time() + seconds
    i = 0
    while time.time() < deadline:
        h = HASHES[i % len(HASHES)]
        i += 1
        path = os.path.join(mount, WV, h)
        try:
            with open(path, "rb") as f:
                data = f.read()
            st = os.stat(path)
        except OSError as e:
            k = errno.errorcode[e.errno]
            errors[k] = errors.get(k, 0) + 1
            continue
        reads += 1
        if data != expected[h] or st.st_size != len(expected[h]):
            wrong += 1
            if first_wrong is None:
                first_wrong = (h, len(data), st.st_size, len(expected[h]))
    out.put(("reader", {"reads": reads, "wrong": wrong, "errors": errors,
                        "first_wrong": first_wrong}))


def run(mount, seconds=5.0, writers=3, readers=3, churners=2):
    """Publishes the keys, then runs the processes for `seconds`. Returns
    {'reads', 'wrong', 'reader_errors', 'writer', 'churn', 'first_wrong'}."""
    os.makedirs(os.path.join(mount, WV), exist_ok=True)
    expected = {}
    for h in HASHES:
        arr = routed_experts(16, seed=HASHES.index(h))
        path = os.path.join(mount, WV, h)
        if not os.path.exists(path):
            with open(path, "wb") as f:
                f.write(encode(WV, h, arr))
        expected[h] = npy_bytes(arr)
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_republisher, args=(mount, seconds, s, out)) for s in range(writers)]
    procs += [ctx.Process(target=_churner, args=(mount, seconds, out)) for _ in range(churners)]
    procs += [ctx.Process(target=_reader, args=(mount, seconds, expected, out))
              for _ in range(readers)]
    for p in procs:
        p.start()
    result = {"reads": 0, "wrong": 0, "reader_errors": {}, "writer": {}, "churn": {},
              "first_wrong": None}
    for _ in procs:
        kind, c = out.get(timeout=seconds + 60)
        if kind == "reader":
            result["reads"] += c["reads"]
            result["wrong"] += c["wrong"]
            result["first_wrong"] = result["first_wrong"] or c["first_wrong"]
            for k, v in c["errors"].items():
                result["reader_errors"][k] = result["reader_errors"].get(k, 0) + v
        else:
            for k, v in c.items():
                result[kind][k] = result[kind].get(k, 0) + v
    for p in procs:
        p.join(timeout=30)
    return result


if __name__ == "__main__":
    mount = sys.argv[1]
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 10
    writers = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    readers = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    r = run(mount, seconds, writers, readers)
    print(r)
    print(f"wrong reads: {r['wrong']} of {r['reads']}")
    sys.exit(1 if r["wrong"] else 0)
