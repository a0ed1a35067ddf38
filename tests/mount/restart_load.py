# SPDX-License-Identifier: Apache-2.0
"""A load for the restart tests (test_restart.py): reader processes that
compare every byte they read and say which calls failed, and publisher
processes (by path and by .put) that retry what failed and say what they
had acknowledged, each bounded in time.

    setup(mount)                        publishes what the readers read
    run(mount, seconds, during)         runs the load; during() is called
                                        meanwhile (the test's kills or
                                        upgrades); returns what each said
"""
import errno
import multiprocessing
import os
import random
import time

from envelope import derive_key, encode, npy_bytes, routed_experts

WV = "restart"
BASE = 24          # objects published by path before the load
ROWS = 16


def key_hex(h):
    return derive_key(WV, h).split("/", 1)[1]


def array(i, rows=ROWS):
    return routed_experts(rows, seed=i)


def base_hash(i):
    return "%04x" % i


def setup(mount):
    """BASE objects of one request (blocks of ROWS rows, the last a tail)
    by path; returns nothing: the readers derive all they expect."""
    os.makedirs(os.path.join(mount, WV), exist_ok=True)
    for i in range(BASE):
        h = base_hash(i)
        kind = "block" if i < BASE - 1 else "tail"
        env = encode(WV, h, array(i, ROWS if i < BASE - 1 else 5), kind=kind,
                     source_token_start=i * ROWS)
        with open(os.path.join(mount, WV, h), "wb") as f:
            f.write(env)


def _expected():
    arrays = [array(i, ROWS if i < BASE - 1 else 5) for i in range(BASE)]
    envs = [encode(WV, base_hash(i), a, kind="block" if i < BASE - 1 else "tail",
                   source_token_start=i * ROWS) for i, a in enumerate(arrays)]
    import numpy as np
    whole = npy_bytes(np.concatenate(arrays))
    return arrays, envs, whole


def _transact(path, data):
    fd = os.open(path, os.O_RDWR)
    try:
        os.write(fd, data)
        out = bytearray()
        while True:
            b = os.pread(fd, 1 << 20, len(out))
            if not b:
                return bytes(out)
            out += b
    finally:
        os.close(fd)


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def reader(mount, seconds, seed, q):
    """Every kind of read, at random, each compared with what it must be."""
    rng = random.Random(seed)
    arrays, envs, whole = _expected()
    request = ("token_end %d\n" % ((BASE - 1) * ROWS + 5) +
               "".join(base_hash(i) + "\n" for i in range(BASE))).encode()
    names = {base_hash(i) for i in range(BASE)}
    errors, counts, wrong, worst = {}, {}, [], 0.0
    deadline = time.time() + seconds
    while time.time() < deadline:
        i = rng.randrange(BASE)
        h = base_hash(i)
        op = rng.choice(["read", "stat", "readdir", "xattr", "materialize", "get", "key",
                         "metrics"])
        t0 = time.monotonic()
        try:
            if op == "read":
                ok = _read(os.path.join(mount, WV, h)) == npy_bytes(arrays[i])
            elif op == "stat":
                ok = os.stat(os.path.join(mount, WV, h)).st_size == len(npy_bytes(arrays[i]))
            elif op == "readdir":
                ok = names <= set(os.listdir(os.path.join(mount, WV)))
            elif op == "xattr":
                shape = os.getxattr(os.path.join(mount, WV, h), "user.artfs.shape")
                ok = shape == ",".join(map(str, arrays[i].shape)).encode()
            elif op == "materialize":
                ok = _transact(os.path.join(mount, WV, ".materialize"), request) == whole
            elif op == "get":
                pick = rng.sample(range(BASE), 4)
                data = "".join(key_hex(base_hash(k)) + "\n" for k in pick).encode()
                ok = _transact(os.path.join(mount, ".keys", ".get"), data) == \
                    b"".join(envs[k] for k in pick)
            elif op == "key":
                ok = _read(os.path.join(mount, ".keys", key_hex(h))) == envs[i]
            else:
                text = _read(os.path.join(mount, ".artfs", "metrics"))
                ok = b"artfs_objects " in text
            if not ok:
                wrong.append(f"{op} {h}")
        except OSError as e:
            k = f"{op}:{errno.errorcode.get(e.errno, e.errno)}"
            errors[k] = errors.get(k, 0) + 1
        worst = max(worst, time.monotonic() - t0)
        counts[op] = counts.get(op, 0) + 1
    q.put(("reader", {"errors": errors, "wrong": wrong[:20], "nwrong": len(wrong),
                      "counts": counts, "worst": worst}))


def _publish_path(mount, h, env):
    """0, or the errno of the call that failed."""
    try:
        fd = os.open(os.path.join(mount, WV, h), os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644)
    except OSError as e:
        return e.errno
    err = 0
    try:
        for off in range(0, len(env), 700):  # several writes: a kill can come between them
            os.write(fd, env[off:off + 700])
    except OSError as e:
        err = e.errno
    try:
        os.close(fd)
    except OSError as e:
        err = err or e.errno
    return err


def _publish_put(mount, records):
    """A .put batch of (hash, envelope): 0, or the errno that failed it."""
    data = b"".join(h.encode() + b"\n" + env for h, env in records)
    try:
        fd = os.open(os.path.join(mount, WV, ".put"), os.O_RDWR)
    except OSError as e:
        return e.errno
    err = 0
    try:
        os.write(fd, data)
        lines = os.pread(fd, 1 << 20, 0).decode().splitlines()
        want = [f"{key_hex(h)} 0" for h, _ in records]
        if lines != want:
            err = -1
    except OSError as e:
        err = e.errno
    try:
        os.close(fd)
    except OSError as e:
        err = err or e.errno
    return err


def publisher(mount, seconds, seed, mode, q):
    """New objects, by path or in batches of 8 by .put; what fails is sent
    again until it succeeds (an EEXIST after a retry is an object the try
    before committed: as good as 0 for identical content)."""
    rng = random.Random(seed)
    acked, failures, tries = [], {}, 0
    deadline = time.time() + seconds
    n = 0
    while time.time() < deadline:
        if mode == "path":
            h = "%02x%06x" % (seed, n)
            batch = [(h, encode(WV, h, array(1000 + n % 97, 1 + n % 9)))]
        else:
            batch = [("%02x%06x" % (seed, n + k), encode(WV, "%02x%06x" % (seed, n + k),
                                                          array(2000 + (n + k) % 97, 1 + k)))
                     for k in range(8)]
        n += len(batch)
        for attempt in range(200):
            tries += 1
            if mode == "path":
                err = _publish_path(mount, *batch[0])
                if err == errno.EEXIST and attempt:
                    err = 0 if _read(os.path.join(mount, WV, batch[0][0])) else err
            else:
                err = _publish_put(mount, batch)
            if err == 0:
                acked += [(h, env) for h, env in batch]
                break
            k = errno.errorcode.get(err, str(err))
            failures[k] = failures.get(k, 0) + 1
            time.sleep(rng.uniform(0.001, 0.02))
        else:
            failures["gave up"] = failures.get("gave up", 0) + 1
    q.put(("publisher", {"mode": mode, "acked": acked, "failures": failures, "tries": tries}))


def run(mount, seconds, during, readers=6):
    """The load for `seconds`, during() meanwhile; what every process said."""
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=reader, args=(mount, seconds, s, q)) for s in range(readers)]
    procs += [ctx.Process(target=publisher, args=(mount, seconds, 100 + k, mode, q))
              for k, mode in enumerate(("path", "put"))]
    for p in procs:
        p.start()
    try:
        during()
        said = [q.get(timeout=seconds + 120) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return said


def get_one(path, key, out):
    """One .keys/.get of key: its bytes, or the errno name of the call that failed."""
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError as e:
        out.append("open:" + errno.errorcode[e.errno])
        return
    try:
        os.write(fd, key.encode() + b"\n")
        data = bytearray()
        while True:
            b = os.pread(fd, 1 << 24, len(data))
            if not b:
                break
            data += b
        out.append(bytes(data))
    except OSError as e:
        out.append("read:" + errno.errorcode[e.errno])
    finally:
        try:
            os.close(fd)
        except OSError:  # the mount ended under it
            pass


def check_acknowledged(mount, said):
    """Every object a publisher had acknowledged reads back, byte for byte."""
    import io
    import numpy as np
    checked = 0
    for who, r in said:
        if who != "publisher":
            continue
        for h, env in r["acked"]:
            hlen = int.from_bytes(env[:4], "little")
            import json
            hdr = json.loads(env[4:4 + hlen])
            arr = np.frombuffer(env[4 + hlen:], dtype=np.dtype(hdr["dtype"])).reshape(hdr["shape"])
            assert _read(os.path.join(mount, WV, h)) == npy_bytes(arr), h
            checked += 1
    return checked
