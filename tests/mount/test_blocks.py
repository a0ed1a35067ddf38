# SPDX-License-Identifier: Apache-2.0
"""The write-once tree .blocks/ (DESIGN.md §10) on a real mount, through
system calls and shell tools only (the Python store is tested in
test_python_blocks.py): raw blocks under keys, .put records and result
lines, .get concatenation in the order asked, key rules, the first bytes of
a key stay, a damaged block is EIO (never a miss), a full tree refuses and
evicts nothing, idle namespace directories expire, a daemon killed between
a put and a get, and many processes at once comparing every byte."""
import errno
import hashlib
import os
import struct
import subprocess
import time

import pytest

from conftest import artfsctl, flip_byte, run_processes, wait_for

BLOCKS = ".blocks"


def block(seed, size=16 * 48 * 8):
    """Deterministic bytes of one block (R3's block_size x layers x top_k)."""
    out = bytearray()
    h = hashlib.sha256(f"{seed}".encode()).digest()
    while len(out) < size:
        out += h
        h = hashlib.sha256(h).digest()
    return bytes(out[:size])


def key(seed, ns="0"):
    """A key as upstream vLLM makes it: a namespace and a 32-byte hash in hex."""
    return f"vllm-artifact/{ns}/{hashlib.sha256(f'hash{seed}'.encode()).hexdigest()}"


def records(pairs):
    return b"".join(k.encode() + b"\n" + struct.pack("<Q", len(v)) + v for k, v in pairs)


def put(m, pairs, raw=None, chunk=None):
    """One .put transaction: (errno of fsync, result lines)."""
    data = records(pairs) if raw is None else raw
    fd = os.open(m.path(BLOCKS, ".put"), os.O_RDWR)
    rc = 0
    try:
        step = chunk or max(len(data), 1)
        for off in range(0, len(data), step):
            os.write(fd, data[off:off + step])
        try:
            os.fsync(fd)
        except OSError as e:
            rc = e.errno
        lines = os.pread(fd, 1 << 20, 0).decode()
    finally:
        try:
            os.close(fd)
        except OSError as e:  # the close says what fsync said
            assert e.errno == rc, (e.errno, rc)
    return rc, [line.rsplit(" ", 1) for line in lines.splitlines()]


def get(m, keys):
    """One .get transaction: the bytes, or the errno."""
    fd = os.open(m.path(BLOCKS, ".get"), os.O_RDWR)
    try:
        os.write(fd, "".join(k + "\n" for k in keys).encode())
        out = bytearray()
        while True:
            chunk = os.pread(fd, 128 << 10, len(out))
            if not chunk:
                return bytes(out)
            out += chunk
    except OSError as e:
        return e.errno
    finally:
        os.close(fd)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def blocks_metrics(m):
    return {k: v for k, v in m.metrics().items() if k.startswith("artfs_blocks")}


def test_put_then_get_and_cat_give_the_raw_bytes(mnt):
    assert BLOCKS in os.listdir(mnt.mountpoint)
    assert sorted(os.listdir(mnt.path(BLOCKS))) == [".get", ".put"]
    # Who may create files may put (as .keys/.put); every user may get.
    assert os.stat(mnt.path(BLOCKS, ".put")).st_mode & 0o777 == 0o644
    assert os.stat(mnt.path(BLOCKS, ".get")).st_mode & 0o777 == 0o666
    pairs = [(key(i, ns=str(i % 2)), block(i)) for i in range(8)]
    pairs.append(("r3-tail:" + "ab" * 32, block(99, 5 * 48 * 8)))  # a tail at the top
    rc, lines = put(mnt, pairs)
    assert rc == 0
    assert lines == [[k, "0"] for k, _ in pairs]
    # .get: the order asked, repeats included, concatenated.
    order = [7, 0, 3, 3, 8, 1]
    assert get(mnt, [pairs[i][0] for i in order]) == b"".join(pairs[i][1] for i in order)
    # The same blocks as files: cat, ls, stat.
    for k, v in pairs:
        assert read(mnt.path(BLOCKS, *k.split("/"))) == v
        assert subprocess.run(["cat", mnt.path(BLOCKS, k)], capture_output=True,
                              check=True).stdout == v
        st = os.stat(mnt.path(BLOCKS, k))
        assert st.st_size == len(v) and st.st_mode & 0o777 == 0o444
    assert sorted(os.listdir(mnt.path(BLOCKS, "vllm-artifact"))) == ["0", "1"]
    assert len(os.listdir(mnt.path(BLOCKS, "vllm-artifact", "0"))) == 4
    bm = blocks_metrics(mnt)
    assert bm["artfs_blocks_files"] == len(pairs)
    assert bm["artfs_blocks_bytes"] == sum(len(v) for _, v in pairs)
    assert bm["artfs_blocks_commits_total"] == len(pairs)
    assert bm["artfs_blocks_hits_total"] >= len(order) + len(pairs)
    # A batch again: every record identical, nothing committed twice.
    assert put(mnt, pairs)[0] == 0
    assert blocks_metrics(mnt)["artfs_blocks_commits_total"] == len(pairs)


def test_records_may_span_writes_of_any_size(mnt):
    pairs = [(key(i), block(i, 100 + i)) for i in range(20)] + [(key(50), b"")]
    for chunk in (1, 7, 4096):
        rc, lines = put(mnt, pairs, chunk=chunk)
        assert rc == 0 and [s for _, s in lines] == ["0"] * len(pairs), chunk
    assert get(mnt, [k for k, _ in pairs]) == b"".join(v for _, v in pairs)
    assert read(mnt.path(BLOCKS, key(50))) == b""


def test_the_first_bytes_of_a_key_stay(mnt):
    k = key(1)
    assert put(mnt, [(k, block(1))]) == (0, [[k, "0"]])
    # Other bytes under the same key: 0, as vLLM's own store answers; the
    # first stay, the collision is counted and logged.
    assert put(mnt, [(k, block(2))]) == (0, [[k, "0"]])
    assert get(mnt, [k]) == block(1)
    assert read(mnt.path(BLOCKS, k)) == block(1)
    assert blocks_metrics(mnt)["artfs_blocks_collisions_total"] == 1
    assert mnt.wait_log("was put first with other bytes")


def test_bad_keys_are_refused_and_the_rest_of_the_batch_commits(mnt):
    good = [(key(i), block(i)) for i in range(3)]
    bad = ["", "a//b", "a/./b", "../x", "a/..", "sp ace/x", "x/\u00e9", "tab\tx",
           "k" * 256, "/lead", "trail/", "x" * 300 + "/" + "y" * 213]
    pairs = [good[0]] + [(b, b"xx") for b in bad] + good[1:]
    rc, lines = put(mnt, pairs)
    assert rc == errno.EINVAL
    assert [s for _, s in lines] == ["0"] + ["EINVAL"] * len(bad) + ["0", "0"]
    assert get(mnt, [k for k, _ in good]) == b"".join(v for _, v in good)
    # A key of exactly 512 bytes is one; 513 is not.
    k512 = "/".join(["a" * 255, "b" * 254]) + "/c"
    assert len(k512) == 512
    assert put(mnt, [(k512, b"ok")])[0] == 0
    assert get(mnt, [k512]) == b"ok"
    assert put(mnt, [(k512 + "d", b"no")])[0] == errno.EINVAL
    # .get of a malformed key: EINVAL before anything is read.
    assert get(mnt, [good[0][0], "a//b"]) == errno.EINVAL
    # mkdir and create by path take the same segments only.
    for name in ("sp ace", "\u00e9", "a\\b"):
        with pytest.raises(OSError) as e:
            os.mkdir(mnt.path(BLOCKS, name))
        assert e.value.errno == errno.EINVAL, name
    # .put and .get are not keys.
    rc, lines = put(mnt, [(".put", b"x"), (".get", b"y"), (".put/x", b"z"), (".get/y/z", b"w")])
    assert rc == errno.EEXIST and [s for _, s in lines] == ["EEXIST"] * 4
    assert sorted(os.listdir(mnt.path(BLOCKS))) == [".get", ".put", "a" * 255, "vllm-artifact"]


def test_a_key_line_too_long_ends_the_batch(mnt):
    raw = records([(key(1), block(1))]) + b"z" * 5000 + b"\n" + struct.pack("<Q", 1) + b"q"
    fd = os.open(mnt.path(BLOCKS, ".put"), os.O_RDWR)
    with pytest.raises(OSError) as e:
        os.write(fd, raw)
    assert e.value.errno == errno.EBADMSG
    with pytest.raises(OSError) as e:
        os.fsync(fd)
    assert e.value.errno == errno.EBADMSG
    with pytest.raises(OSError) as e:
        os.close(fd)
    assert e.value.errno == errno.EBADMSG
    assert get(mnt, [key(1)]) == block(1)  # the records before it stand


def test_a_record_cut_short_commits_nothing_of_itself(mnt):
    whole = records([(key(1), block(1))])
    cut = records([(key(2), block(2))])[:-10]
    rc, lines = put(mnt, [], raw=whole + cut)
    assert rc == errno.EBADMSG
    assert lines == [[key(1), "0"], [key(2), "EBADMSG"]]
    assert get(mnt, [key(1)]) == block(1)
    assert get(mnt, [key(2)]) == errno.ENOENT
    assert not os.path.exists(mnt.path(BLOCKS, key(2)))
    # The writer's close returns the batch's errno too.
    fd = os.open(mnt.path(BLOCKS, ".put"), os.O_WRONLY)
    os.write(fd, cut)
    with pytest.raises(OSError) as e:
        os.close(fd)
    assert e.value.errno == errno.EBADMSG


def test_a_shell_redirect_puts_a_batch(mnt, tmp_path):
    src = tmp_path / "batch.bin"
    src.write_bytes(records([(key(i), block(i)) for i in range(5)]))
    subprocess.run(f"cat {src} > {mnt.path(BLOCKS, '.put')}", shell=True, check=True)
    assert get(mnt, [key(i) for i in range(5)]) == b"".join(block(i) for i in range(5))


def test_a_missing_key_fails_the_whole_get(mnt):
    put(mnt, [(key(1), block(1))])
    assert get(mnt, [key(1), key(2)]) == errno.ENOENT
    assert get(mnt, []) == b""
    assert blocks_metrics(mnt)["artfs_blocks_misses_total"] >= 1
    assert mnt.wait_log("does not exist")


def test_writing_a_block_by_path_and_what_is_refused(mnt):
    d = mnt.path(BLOCKS, "vllm-artifact", "1")
    os.makedirs(d)
    p = os.path.join(d, "ab" * 32)
    with open(p, "wb") as f:
        f.write(block(5))
    assert get(mnt, ["vllm-artifact/1/" + "ab" * 32]) == block(5)
    for flags in (os.O_WRONLY, os.O_RDWR, os.O_WRONLY | os.O_TRUNC):
        with pytest.raises(OSError) as e:
            os.open(p, flags)
        assert e.value.errno == errno.EACCES
    with pytest.raises(OSError) as e:
        os.truncate(p, 0)
    assert e.value.errno in (errno.EPERM, errno.EACCES)
    # A block's name is its key: no rename, in .blocks/ or into .cache/.
    with pytest.raises(OSError) as e:
        os.rename(p, os.path.join(d, "cd" * 32))
    assert e.value.errno == errno.EPERM
    os.makedirs(mnt.path(".cache", "x"))
    with pytest.raises(OSError) as e:
        os.rename(p, mnt.path(".cache", "x", "y"))
    assert e.value.errno == errno.EXDEV
    # unlink is the administrator's clean-up.
    os.unlink(p)
    assert get(mnt, ["vllm-artifact/1/" + "ab" * 32]) == errno.ENOENT
    assert blocks_metrics(mnt)["artfs_blocks_files"] == 0


def test_a_damaged_block_is_eio_never_a_miss(mnt):
    pairs = [(key(i), block(i)) for i in range(3)]
    put(mnt, pairs)
    assert get(mnt, [key(1)]) == block(1)
    flip_byte(os.path.join(mnt.store, "blocks", *key(1).split("/")))
    assert get(mnt, [key(0), key(1), key(2)]) == errno.EIO
    assert get(mnt, [key(1)]) == errno.EIO  # and again: it stays, fail closed
    with pytest.raises(OSError) as e:
        read(mnt.path(BLOCKS, key(1)))
    assert e.value.errno == errno.EIO
    assert os.path.exists(mnt.path(BLOCKS, key(1)))  # not a miss
    assert get(mnt, [key(0), key(2)]) == block(0) + block(2)
    assert blocks_metrics(mnt)["artfs_blocks_damaged_total"] == 1
    assert mnt.wait_log("served as EIO")
    # A put of the same key keeps the damaged first (the operator unlinks it).
    os.unlink(mnt.path(BLOCKS, key(1)))
    assert put(mnt, [(key(1), block(1))])[0] == 0
    assert get(mnt, [key(1)]) == block(1)


def test_a_full_tree_refuses_and_evicts_nothing(make_mount):
    m = make_mount(blocks_capacity="64K", ttl="0")
    pairs = [(key(i), block(i, 6000)) for i in range(10)]  # 60,000 bytes
    assert put(m, pairs)[0] == 0
    rc, lines = put(m, [(key(20), block(20, 6000)), (key(21), block(21, 100))])
    assert rc == errno.ENOSPC
    assert lines == [[key(20), "ENOSPC"], [key(21), "0"]]
    assert get(m, [k for k, _ in pairs]) == b"".join(v for _, v in pairs)
    assert blocks_metrics(m)["artfs_blocks_refused_total"] == 1
    # A block larger than max_object= is EFBIG.
    m2 = make_mount("m2", max_object="4K", store=os.path.join(m.base, "store2"))
    rc, lines = put(m2, [(key(1), block(1, 5000)), (key(2), block(2, 10))])
    assert rc == errno.EFBIG and [s for _, s in lines] == ["EFBIG", "0"]


def test_a_get_past_materialize_max_is_enomem(make_mount):
    m = make_mount(materialize_max="1M", max_object="600K")
    pairs = [(key(i), block(i, 500_000)) for i in range(3)]
    assert put(m, pairs)[0] == 0
    assert get(m, [pairs[0][0], pairs[1][0]]) == pairs[0][1] + pairs[1][1]
    assert get(m, [k for k, _ in pairs]) == errno.ENOMEM


def test_idle_namespace_directories_expire_and_active_ones_stay(make_mount):
    m = make_mount(ttl="2")
    idle = [(key(i, ns="idle"), block(i)) for i in range(4)]
    busy = [(key(i, ns="busy"), block(i)) for i in range(4)]
    assert put(m, idle + busy)[0] == 0
    busy_keys = [k for k, _ in busy]

    def idle_gone():
        assert get(m, busy_keys) == b"".join(v for _, v in busy)
        time.sleep(0.3)
        return not os.path.exists(m.path(BLOCKS, "vllm-artifact", "idle"))
    assert wait_for(idle_gone, timeout=15)
    assert get(m, [idle[0][0]]) == errno.ENOENT
    assert blocks_metrics(m)["artfs_blocks_collected_total"] == len(idle)
    assert m.wait_log("blocks collected")


def test_blocks_survive_a_daemon_kill_and_a_remount(mnt):
    pairs = [(key(i), block(i)) for i in range(16)]
    assert put(mnt, pairs)[0] == 0
    old = mnt.kill_daemon()
    mnt.wait_daemon_other_than(old)
    assert get(mnt, [k for k, _ in pairs]) == b"".join(v for _, v in pairs)
    assert read(mnt.path(BLOCKS, pairs[3][0])) == pairs[3][1]
    mnt.restart()
    assert get(mnt, [k for k, _ in pairs]) == b"".join(v for _, v in pairs)
    assert blocks_metrics(mnt)["artfs_blocks_files"] == len(pairs)


def test_a_put_in_flight_at_a_kill_fails_once_and_its_retry_succeeds(mnt):
    first = records([(key(i), block(i)) for i in range(4)])
    rest = records([(key(i), block(i)) for i in range(4, 8)])
    fd = os.open(mnt.path(BLOCKS, ".put"), os.O_RDWR)
    os.write(fd, first)
    old = mnt.kill_daemon()
    mnt.wait_daemon_other_than(old)
    with pytest.raises(OSError) as e:
        os.write(fd, rest)
    assert e.value.errno == errno.EIO
    with pytest.raises(OSError) as e:
        os.close(fd)
    assert e.value.errno == errno.EIO
    rc, lines = put(mnt, [(key(i), block(i)) for i in range(8)])
    assert rc == 0 and [s for _, s in lines] == ["0"] * 8
    assert get(mnt, [key(i) for i in range(8)]) == b"".join(block(i) for i in range(8))


def test_a_put_open_across_an_upgrade_goes_on(mnt):
    """An upgrade drains the daemon with a batch open and a record cut in
    the middle of its body; the next daemon goes on with it: no error."""
    whole = records([(key(i), block(i)) for i in range(3)])
    nxt = records([(key(i), block(i)) for i in range(3, 6)])
    bad = records([("bad key", b"xx")])
    fd = os.open(mnt.path(BLOCKS, ".put"), os.O_RDWR)
    os.write(fd, whole + bad + nxt[:100])  # the key line, length and part of a body
    pid = mnt.daemon_pid()
    r = subprocess.run([artfsctl(), "-m", mnt.mountpoint, "upgrade"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    mnt.wait_daemon_other_than(pid)
    os.write(fd, nxt[100:])
    with pytest.raises(OSError) as e:
        os.fsync(fd)
    assert e.value.errno == errno.EINVAL  # the bad key's, from before the upgrade
    lines = [line.rsplit(" ", 1) for line in os.pread(fd, 1 << 16, 0).decode().splitlines()]
    with pytest.raises(OSError):
        os.close(fd)
    assert [s for _, s in lines] == ["0"] * 3 + ["EINVAL"] + ["0"] * 3
    assert get(mnt, [key(i) for i in range(6)]) == b"".join(block(i) for i in range(6))


def test_a_get_written_before_a_kill_is_read_after_it(mnt):
    put(mnt, [(key(i), block(i)) for i in range(4)])
    fd = os.open(mnt.path(BLOCKS, ".get"), os.O_RDWR)
    os.write(fd, "".join(key(i) + "\n" for i in (3, 1)).encode())
    old = mnt.kill_daemon()
    mnt.wait_daemon_other_than(old)
    assert os.pread(fd, 1 << 16, 0) == block(3) + block(1)
    os.close(fd)


def _worker(mountpoint, seed, rounds, q):
    """Puts overlapping keys (each key always with its own bytes) and gets
    them back, comparing every byte; reports its mismatches."""
    class M:
        def path(self, *p):
            return os.path.join(mountpoint, *p)
    m = M()
    bad = []
    try:
        for r in range(rounds):
            ids = [(seed * 7 + r * 3 + j) % 48 for j in range(16)]
            rc, lines = put(m, [(key(i, ns=str(i % 3)), block(i, 1000 + 37 * i)) for i in ids])
            if rc != 0 or any(s != "0" for _, s in lines):
                bad.append(("put", r, rc, lines[:2]))
            want = [ids[-1], ids[0]] + ids
            got = get(m, [key(i, ns=str(i % 3)) for i in want])
            if got != b"".join(block(i, 1000 + 37 * i) for i in want):
                bad.append(("get", r, got if isinstance(got, int) else len(got)))
    except Exception as e:  # reported, not lost with the process
        bad.append(("exception", repr(e)))
    q.put(bad)


def test_many_processes_put_and_get_at_once_every_byte_compared(mnt):
    results = run_processes(_worker, [(mnt.mountpoint, s, 25) for s in range(8)], timeout=240)
    assert results == [[]] * 8
    bm = blocks_metrics(mnt)
    assert bm["artfs_blocks_files"] == 48
    assert bm["artfs_blocks_collisions_total"] == 0
    assert bm["artfs_blocks_damaged_total"] == 0
    for i in range(48):
        assert read(mnt.path(BLOCKS, key(i, ns=str(i % 3)))) == block(i, 1000 + 37 * i)


def _expiry_worker(mountpoint, seed, q):
    """Puts into namespaces (a new one every 20 rounds, shared by all
    workers) while the older ones expire (ttl=1), then gets what it just
    put: every put 0, every get its own bytes or ENOENT (collected)."""
    class M:
        def path(self, *p):
            return os.path.join(mountpoint, *p)
    m, bad = M(), []
    try:
        deadline = time.time() + 6
        r = 0
        while time.time() < deadline:
            pairs = [(key(f"{seed}-{r}-{j}", ns=f"n{r // 20}"), block(seed + j, 500))
                     for j in range(8)]
            rc, lines = put(m, pairs)
            if rc != 0:
                bad.append(("put", r, rc, lines[:2]))
            got = get(m, [k for k, _ in pairs])
            if got != b"".join(v for _, v in pairs) and got != errno.ENOENT:
                bad.append(("get", r, got if isinstance(got, int) else len(got)))
            r += 1
            time.sleep(0.05 * (seed % 3))  # a namespace a second or so: earlier ones go idle
    except Exception as e:
        bad.append(("exception", repr(e)))
    q.put(bad)


def test_expiry_beside_many_putters_loses_no_put(make_mount):
    """Namespace directories collected (ttl=1) while 6 processes put into
    them and read back: no put fails, and a get gives its blocks' bytes, or
    ENOENT when the janitor collected them in between, never other bytes."""
    m = make_mount(ttl="1")
    results = run_processes(_expiry_worker, [(m.mountpoint, s) for s in range(6)], timeout=120)
    assert results == [[]] * 6
    bm = blocks_metrics(m)
    assert bm["artfs_blocks_damaged_total"] == 0
    assert bm["artfs_blocks_collected_total"] > 0  # the janitor did collect meanwhile
