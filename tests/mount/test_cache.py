# SPDX-License-Identifier: Apache-2.0
"""The write-once tree .cache/ (DESIGN.md §9) on a real mount: the tools'
pattern (temporary file, close, rename onto the final name), the first
entry of a name stays, invisible until committed, immutable after, a damaged
file is a miss, capacity and eviction, restarts, permissions, and many
processes at once comparing every byte."""
import errno
import hashlib
import itertools
import os
import shutil
import subprocess
import time

import pytest

from conftest import Mount, flip_byte, run_processes, wait_for

CACHE = ".cache"


def blob(seed, size):
    """Deterministic bytes of one writer: never the same for two seeds."""
    out = bytearray()
    block = hashlib.sha256(f"{seed}".encode()).digest()
    while len(out) < size:
        out += block
        block = hashlib.sha256(block).digest()
    return bytes(out[:size])


def write_atomic(path, data, tmp_name=None):
    """What Inductor's write_atomic and Triton's put do: a temporary name,
    written whole, closed, renamed onto the final name."""
    tmp = os.path.join(os.path.dirname(path), tmp_name or f".{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def read_or_log(m, path):
    """read(path); when it fails, says whether the store holds the file
    and how the daemon's log ends."""
    try:
        return read(path)
    except OSError as e:
        rel = os.path.relpath(path, m.path(CACHE))
        instore = os.path.exists(os.path.join(m.store, "cache", rel))
        raise AssertionError(f"{path}: {e}; in the store: {instore}\n"
                             + "\n".join(m.log().splitlines()[-12:]))


def daemon_killer(mnt, kills, every):
    """A started thread that kills the serving daemon `kills` times, `every`
    seconds apart, each time waiting for the next one to serve."""
    import threading

    def killer():
        for _ in range(kills):
            time.sleep(every)
            mnt.wait_daemon_other_than(mnt.kill_daemon())
    t = threading.Thread(target=killer)
    t.start()
    return t


def cache_metrics(m):
    return {k: v for k, v in m.metrics().items() if k.startswith("artfs_cache")}


def test_the_tools_pattern_commits_and_serves(mnt):
    root = mnt.path(CACHE)
    assert os.path.isdir(root) and CACHE in os.listdir(mnt.mountpoint)
    os.makedirs(os.path.join(root, "inductor", "ab"), exist_ok=True)
    os.makedirs(os.path.join(root, "inductor", "ab"), exist_ok=True)  # existing: fine
    data = blob(1, 300_000)
    final = os.path.join(root, "inductor", "ab", "kernel.py")
    write_atomic(final, data)
    assert read(final) == data
    assert os.listdir(os.path.join(root, "inductor", "ab")) == ["kernel.py"]
    st = os.stat(final)
    assert st.st_size == len(data) and oct(st.st_mode & 0o777) == oct(0o444)
    m = cache_metrics(mnt)
    assert m["artfs_cache_commits_total"] == 1 and m["artfs_cache_files"] == 1
    assert m["artfs_cache_bytes"] == len(data) and m["artfs_cache_hits_total"] >= 1
    # in the store: the header and the bytes, under the same path
    stored = os.path.join(mnt.store, "cache", "inductor", "ab", "kernel.py")
    assert os.path.getsize(stored) == 64 + len(data)


def test_a_file_is_invisible_until_its_close_and_immutable_after(mnt):
    d = mnt.path(CACHE, "w")
    os.mkdir(d)
    p = os.path.join(d, "f")
    fd = os.open(p, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644)
    os.write(fd, b"part")
    # another process does not see it (a fresh lookup: no entry kept)
    r = subprocess.run(["/usr/bin/python3", "-c", f"import os; print(os.path.exists({p!r}))"],
                       capture_output=True, text=True, timeout=30)
    assert r.stdout.strip() == "False"
    assert os.listdir(d) == []
    os.write(fd, b"-rest")
    os.close(fd)
    assert read(p) == b"part-rest"
    with pytest.raises(PermissionError):
        open(p, "ab")
    with pytest.raises(PermissionError):
        open(p, "r+b")
    with pytest.raises(OSError) as e:
        os.truncate(p, 1)
    assert e.value.errno == errno.EPERM
    with pytest.raises(FileExistsError):
        os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    with pytest.raises(PermissionError):
        open(p, "wb")  # written once: O_TRUNC of a committed file
    assert read(p) == b"part-rest"


def test_the_first_entry_of_a_name_stays(mnt):
    d = mnt.path(CACHE, "x")
    os.mkdir(d)
    final = os.path.join(d, "entry")
    write_atomic(final, b"first")
    write_atomic(final, b"first")           # same bytes: 0, nothing changes
    write_atomic(final, b"second writer")   # other bytes: 0, the first stays
    assert read(final) == b"first"
    assert sorted(os.listdir(d)) == ["entry"]  # no temporary name left
    assert cache_metrics(mnt)["artfs_cache_collisions_total"] == 1
    assert "holds other bytes: they stay" in mnt.log()
    # a directory built aside and renamed onto an existing one: the first stays
    for n, word in enumerate([b"one", b"two"]):
        tmp = mnt.path(CACHE, f"tmpdir{n}")
        os.makedirs(os.path.join(tmp, "sub"))
        write_atomic(os.path.join(tmp, "sub", "k.so"), word)
        os.rename(tmp, mnt.path(CACHE, "built"))
    assert read(mnt.path(CACHE, "built", "sub", "k.so")) == b"one"
    assert sorted(os.listdir(mnt.path(CACHE))) == ["built", "x"]
    # onto an empty directory: it held nothing, so it is replaced
    os.mkdir(mnt.path(CACHE, "empty"))
    os.makedirs(mnt.path(CACHE, "t3"))
    write_atomic(mnt.path(CACHE, "t3", "a"), b"a")
    os.rename(mnt.path(CACHE, "t3"), mnt.path(CACHE, "empty"))
    assert read(mnt.path(CACHE, "empty", "a")) == b"a"


def test_errnos_of_names(mnt):
    root = mnt.path(CACHE)
    with pytest.raises(OSError) as e:
        os.mkdir(os.path.join(root, "n" * 256))
    assert e.value.errno == errno.ENAMETOOLONG
    path = root
    for i in range(32):
        path = os.path.join(path, "d")
        os.mkdir(path)
    with pytest.raises(OSError) as e:
        os.mkdir(os.path.join(path, "d"))  # depth 33
    assert e.value.errno == errno.ENAMETOOLONG
    os.mkdir(os.path.join(root, "full"))
    write_atomic(os.path.join(root, "full", "f"), b"x")
    with pytest.raises(OSError) as e:
        os.rmdir(os.path.join(root, "full"))
    assert e.value.errno == errno.ENOTEMPTY
    with pytest.raises(IsADirectoryError):
        os.unlink(os.path.join(root, "full"))
    with pytest.raises(NotADirectoryError):
        os.rmdir(os.path.join(root, "full", "f"))
    with pytest.raises(FileNotFoundError):
        os.rename(os.path.join(root, "nothing"), os.path.join(root, "other"))
    with pytest.raises(OSError) as e:
        os.rename(os.path.join(root, "full", "f"), mnt.path("default"))
    assert e.value.errno == errno.EXDEV
    with pytest.raises(OSError) as e:
        os.rename(os.path.join(root, "full"), os.path.join(root, "full", "in"))
    assert e.value.errno == errno.EINVAL
    os.unlink(os.path.join(root, "full", "f"))
    os.rmdir(os.path.join(root, "full"))
    with pytest.raises(PermissionError):
        os.rmdir(root)
    shutil.rmtree(os.path.join(root, "d"))
    assert os.listdir(root) == []
    # Triton's removedirs of its temporary directory: its parent is not empty
    os.makedirs(os.path.join(root, "triton", "tmp.1"))
    write_atomic(os.path.join(root, "triton", "kept"), b"k")
    os.removedirs(os.path.join(root, "triton", "tmp.1"))
    assert os.listdir(os.path.join(root, "triton")) == ["kept"]


def test_a_damaged_file_is_a_miss_and_can_be_written_again(mnt):
    d = mnt.path(CACHE, "dmg")
    os.mkdir(d)
    p = os.path.join(d, "f.bin")
    data = blob(7, 10_000)
    write_atomic(p, data)
    reader = open(p, "rb")
    assert reader.read(10) == data[:10]
    flip_byte(os.path.join(mnt.store, "cache", "dmg", "f.bin"), 100)
    subprocess.run(["sh", "-c", "echo 3 > /proc/sys/vm/drop_caches"], check=False)
    with pytest.raises(FileNotFoundError):
        open(p, "rb")
    assert not os.path.exists(p)
    assert cache_metrics(mnt)["artfs_cache_damaged_total"] == 1
    assert "failed its SHA-256 check" in mnt.log() and "dmg/f.bin" in mnt.log()
    # the reader that had it open: EIO past what its pages hold, never other bytes
    try:
        rest = reader.read()
        assert data[10:10 + len(rest)] == rest
    except OSError as e:
        assert e.errno == errno.EIO
    reader.close()
    write_atomic(p, data)
    assert read(p) == data


def test_a_cached_shared_library_loads_with_dlopen(mnt, tmp_path):
    import ctypes
    src = tmp_path / "k.c"
    src.write_text("int answer(void) { return 42; }\n")
    so = tmp_path / "k.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    os.makedirs(mnt.path(CACHE, "triton", "h"))
    final = mnt.path(CACHE, "triton", "h", "k.so")
    write_atomic(final, so.read_bytes())
    lib = ctypes.CDLL(final)  # mmap with PROT_EXEC of a committed file
    assert lib.answer() == 42


def test_capacity_evicts_the_least_recently_opened_and_keeps_open_files(make_mount):
    m = make_mount(cache_capacity="40K", cache_max_file="16K")
    d = m.path(CACHE, "c")
    os.mkdir(d)
    for i in range(4):  # 4 x 10K = 40K: full
        write_atomic(os.path.join(d, f"f{i}"), blob(i, 10_000))
    read(os.path.join(d, "f0"))  # f0 opened most recently: f1 is the oldest
    held = open(os.path.join(d, "f2"), "rb")  # held open: never evicted
    write_atomic(os.path.join(d, "f4"), blob(4, 10_000))
    assert sorted(os.listdir(d)) == ["f0", "f2", "f3", "f4"]
    write_atomic(os.path.join(d, "f5"), blob(5, 10_000))
    assert sorted(os.listdir(d)) == ["f0", "f2", "f4", "f5"]
    assert cache_metrics(m)["artfs_cache_evictions_total"] == 2
    assert held.read() == blob(2, 10_000)
    with pytest.raises(OSError) as e:
        write_atomic(os.path.join(d, "big"), blob(9, 17_000))
    assert e.value.errno == errno.EFBIG
    # everything open: nothing can go, ENOSPC
    opened = [open(os.path.join(d, n), "rb") for n in ["f0", "f4", "f5"]]
    with pytest.raises(OSError) as e:
        write_atomic(os.path.join(d, "f6"), blob(6, 12_000))
    assert e.value.errno == errno.ENOSPC
    for f in opened + [held]:
        f.close()
    write_atomic(os.path.join(d, "f6"), blob(6, 12_000))
    assert read(os.path.join(d, "f6")) == blob(6, 12_000)
    assert [n for n in os.listdir(d) if n.startswith(".")] == []
    assert cache_metrics(m)["artfs_cache_bytes"] <= 40 * 1024


def test_committed_files_survive_kill_9_and_a_remount(tmp_path):
    m = Mount(tmp_path).start()
    try:
        d = m.path(CACHE, "r", "s")
        os.makedirs(d)
        want = {f"f{i}": blob(i, 5000 + i) for i in range(20)}
        for n, data in want.items():
            write_atomic(os.path.join(d, n), data)
        reader = open(os.path.join(d, "f3"), "rb")
        writer = open(os.path.join(d, ".inflight"), "wb")
        writer.write(b"half")
        writer.flush()
        old = m.kill_daemon()
        m.wait_daemon_other_than(old)
        assert reader.read() == want["f3"]  # its handle keeps its meaning
        reader.close()
        for n, data in want.items():
            assert read(os.path.join(d, n)) == data
        assert sorted(os.listdir(d)) == sorted(want)  # not committed by the crash
        writer.write(b"-and-the-rest")  # the writer goes on with the next daemon
        writer.close()
        os.replace(os.path.join(d, ".inflight"), os.path.join(d, "late"))
        assert read(os.path.join(d, "late")) == b"half-and-the-rest"
        want["late"] = b"half-and-the-rest"
        m.stop()
        m.start()
        for n, data in want.items():
            assert read(os.path.join(d, n)) == data
        assert cache_metrics(m)["artfs_cache_files"] == len(want)
    finally:
        m.stop()


def test_a_killed_writer_leaves_nothing(mnt):
    d = mnt.path(CACHE, "k")
    os.mkdir(d)
    p = os.path.join(d, "partial")
    child = subprocess.Popen(["/usr/bin/python3", "-c",
                              f"import os,time\nf=open({p!r},'wb')\nf.write(b'x'*1000)\n"
                              f"f.flush()\nprint('ok',flush=True)\ntime.sleep(60)"],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ok"
    child.kill()
    child.wait(timeout=30)
    assert wait_for(lambda: "dropped: its writer was killed" in mnt.log(), timeout=10), mnt.log()
    assert os.listdir(d) == []


def test_nobody_reads_but_cannot_write_with_the_default_umask(make_mount):
    m = make_mount(allow_other=None)
    os.makedirs(m.path(CACHE, "pub"))
    write_atomic(m.path(CACHE, "pub", "f"), b"shared")
    # relative paths from inside the mount: the test's own directories are root's
    code = ("import os\nprint(open('.cache/pub/f','rb').read().decode())\n"
            "try:\n    os.mkdir('.cache/pub/mine')\n    print('made')\n"
            "except PermissionError:\n    print('EACCES')\n"
            "try:\n    open('.cache/pub/g','wb')\n    print('made')\n"
            "except PermissionError:\n    print('EACCES')\n")
    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                        "/usr/bin/python3", "-c", code], capture_output=True, text=True,
                       timeout=60, cwd=m.mountpoint)
    assert r.stdout.split() == ["shared", "EACCES", "EACCES"], r.stderr


# ---- many processes at once ------------------------------------------------------------

def _same_names_writer(root, seed, q):
    errors = []
    for rnd in range(20):
        for k in range(5):
            try:
                write_atomic(os.path.join(root, f"n{k}"), blob(seed * 1000 + rnd, 2000 + 97 * seed),
                             tmp_name=f".tmp.{os.getpid()}.{k}")
            except OSError as e:
                errors.append(f"{k}:{errno.errorcode.get(e.errno)}")
    q.put(errors)


def _reader(root, writers, q):
    seen = {}
    bad = []
    deadline = time.time() + 60
    while time.time() < deadline and len(seen) < 5:
        for k in range(5):
            try:
                data = read(os.path.join(root, f"n{k}"))
            except FileNotFoundError:
                continue
            if seen.setdefault(k, data) != data:
                bad.append(f"n{k} changed")
            if not any(data == blob(s * 1000 + r, 2000 + 97 * s)
                       for s in range(writers) for r in range(20)):
                bad.append(f"n{k} is no writer's bytes")
    q.put(bad)


def test_writers_renaming_onto_the_same_names_and_readers(mnt):
    root = mnt.path(CACHE, "race")
    os.mkdir(root)
    writers = 8
    out = run_processes(_same_names_writer, [(root, s) for s in range(writers)] ,
                        timeout=180)
    assert out == [[]] * writers
    out = run_processes(_reader, [(root, writers)] * 4, timeout=120)
    assert out == [[]] * 4
    final = {k: read(os.path.join(root, f"n{k}")) for k in range(5)}
    assert all(any(v == blob(s * 1000 + r, 2000 + 97 * s) for s in range(writers)
                   for r in range(20)) for v in final.values())
    assert sorted(os.listdir(root)) == [f"n{k}" for k in range(5)]


def _dir_builder(root, seed, q):
    tmp = os.path.join(root, f"tmp.{os.getpid()}")
    try:
        os.makedirs(os.path.join(tmp, "kernels"))
        for i in range(6):
            write_atomic(os.path.join(tmp, "kernels", f"k{i}.cubin"), blob(seed * 10 + i, 3000))
        os.rename(tmp, os.path.join(root, "entry"))
        q.put("ok")
    except OSError as e:
        q.put(f"{errno.errorcode.get(e.errno)}")


def test_writers_renaming_built_directories_onto_one_name(mnt):
    root = mnt.path(CACHE, "deepgemm")
    os.mkdir(root)
    out = run_processes(_dir_builder, [(root, s) for s in range(8)], timeout=180)
    assert out == ["ok"] * 8
    assert os.listdir(root) == ["entry"]
    got = [read(os.path.join(root, "entry", "kernels", f"k{i}.cubin")) for i in range(6)]
    winners = [s for s in range(8) if got == [blob(s * 10 + i, 3000) for i in range(6)]]
    assert len(winners) == 1  # one writer's whole tree


def test_writers_and_a_daemon_kill_9(mnt):
    root = mnt.path(CACHE, "killed")
    os.mkdir(root)
    ctx_out = []

    def kill_soon():
        time.sleep(0.3)
        ctx_out.append(mnt.kill_daemon())
    import threading
    t = threading.Thread(target=kill_soon)
    t.start()
    run_processes(_same_names_writer, [(root, s) for s in range(8)], timeout=180)
    t.join()
    mnt.wait_daemon_other_than(ctx_out[0])
    # whatever each writer saw, what is there is one writer's bytes, whole
    for name in os.listdir(root):
        assert not name.startswith(".tmp"), os.listdir(root)
        data = read(os.path.join(root, name))
        assert any(data == blob(s * 1000 + r, 2000 + 97 * s) for s in range(8) for r in range(20))


def test_an_upgrade_keeps_the_tree_and_its_open_readers(mnt):
    from conftest import artfsctl
    d = mnt.path(CACHE, "up")
    os.mkdir(d)
    want = {f"f{i}": blob(100 + i, 70_000) for i in range(5)}
    for n, data in want.items():
        write_atomic(os.path.join(d, n), data)
    reader = open(os.path.join(d, "f1"), "rb")
    head = reader.read(1000)
    writer = open(os.path.join(d, ".w"), "wb")
    writer.write(b"before the upgrade ")
    writer.flush()
    old = mnt.daemon_pid()
    r = subprocess.run([artfsctl(), "-m", mnt.mountpoint, "upgrade"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr + mnt.log()
    mnt.wait_daemon_other_than(old)
    assert head + reader.read() == want["f1"]
    reader.close()
    assert ".w" not in os.listdir(d)  # the drained daemon committed nothing of it
    writer.write(b"and after")
    writer.close()
    os.replace(os.path.join(d, ".w"), os.path.join(d, "written-across"))
    assert read(os.path.join(d, "written-across")) == b"before the upgrade and after"
    want["written-across"] = b"before the upgrade and after"
    for n, data in want.items():
        assert read(os.path.join(d, n)) == data
    write_atomic(os.path.join(d, "after"), b"new")  # the new daemon commits
    assert read(os.path.join(d, "after")) == b"new"
    assert sorted(os.listdir(d)) == sorted(list(want) + ["after"])


def _open_writing(d, names, size):
    """Files d/name opened for writing, blob(i, size) written to each."""
    files = {}
    for i, name in enumerate(names):
        files[name] = open(os.path.join(d, name), "wb")
        files[name].write(blob(i, size))
        files[name].flush()
    return files


def _next_daemon(mnt, how):
    """The serving daemon killed (how="kill") or upgraded; once another
    serves."""
    from conftest import artfsctl
    old = mnt.daemon_pid()
    if how == "kill":
        mnt.kill_daemon()
    else:
        r = subprocess.run([artfsctl(), "-m", mnt.mountpoint, "upgrade"], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr + mnt.log()
    mnt.wait_daemon_other_than(old)


@pytest.mark.parametrize("how", ["kill", "upgrade"])
def test_writers_with_long_names_go_on_across_a_new_daemon(mnt, how):
    """Files being written under names of 127 to 255 bytes (the holder's
    record of a node keeps 128) when a daemon is killed or upgraded: each
    writer goes on and its close commits the whole file; nothing is left
    beside the temporary files afterwards."""
    d = mnt.path(CACHE, "long")
    os.mkdir(d)
    names = [("n" * k)[:k - 4] + f"{k:04d}" for k in (127, 128, 129, 200, 255)]
    files = _open_writing(d, names, 3000)
    tmpdir = os.path.join(mnt.store, "cache-tmp")
    assert len([n for n in os.listdir(tmpdir) if n.startswith("n.")]) == 4  # 128 bytes or more
    _next_daemon(mnt, how)
    for i, name in enumerate(names):
        files[name].write(blob(100 + i, 5000))
        files[name].close()
    assert sorted(os.listdir(d)) == sorted(names)
    for i, name in enumerate(names):
        assert read(os.path.join(d, name)) == blob(i, 3000) + blob(100 + i, 5000)
    assert os.listdir(tmpdir) == []


@pytest.mark.parametrize("how", ["kill", "upgrade"])
def test_a_new_daemon_drops_temporary_files_no_writer_holds(mnt, how):
    """What a daemon killed while making a file leaves in cache-tmp (its
    temporary file, made before the holder's record of the handle names
    it, and the kept long name of a file no longer written) is dropped by
    the next daemon; the temporary files of writers that go on, and their
    long names, stay, and their files commit whole."""
    d = mnt.path(CACHE, "orphans")
    os.mkdir(d)
    names = ["short", "L" * 200]
    files = _open_writing(d, names, 2000)
    tmpdir = os.path.join(mnt.store, "cache-tmp")
    held = sorted(os.listdir(tmpdir))
    assert len(held) == 3  # two temporary files and one long name
    # As a daemon killed between its openat and its record leaves them:
    left = ["w.999999.7", "w.1.0", "n.ffffffffff", "n.7"]
    for name in left:
        with open(os.path.join(tmpdir, name), "wb") as f:
            f.write(b"left by a daemon")
    _next_daemon(mnt, how)
    os.listdir(d)  # served by the new daemon, which dropped them first
    assert sorted(os.listdir(tmpdir)) == held, mnt.log()
    assert mnt.wait_log("dropped 4 temporary files no writer holds")
    for i, name in enumerate(names):
        files[name].write(blob(10 + i, 3000))
        files[name].close()
    for i, name in enumerate(names):
        assert read(os.path.join(d, name)) == blob(i, 2000) + blob(10 + i, 3000)
    assert os.listdir(tmpdir) == []


@pytest.mark.parametrize("what", ["file", "directory"])
def test_renamed_into_place_first_thing_after_a_kill(mnt, what):
    """A tool's temporary file (or directory) is committed, the daemon is
    killed, and the next daemon's first request about it is its rename
    into place (as a crash between a tool's write and its os.replace
    leaves it): the kernel's entry of the new name keeps the id the
    killed daemon gave, and it must name the file there (it answered
    ENOENT, until the kernel forgot the entry)."""
    root = mnt.path(CACHE, "into-place")
    os.mkdir(root)
    if what == "file":
        tmp, final = os.path.join(root, ".tmp.77"), os.path.join(root, "entry")
        with open(tmp, "wb") as f:
            f.write(blob(5, 4000))
        want = {"": blob(5, 4000)}
    else:
        tmp, final = os.path.join(root, "tmp.pid_77"), os.path.join(root, "kernel")
        os.mkdir(tmp)
        os.mkdir(os.path.join(tmp, "sub"))
        want = {"a.cubin": blob(6, 3000), "sub/b.json": blob(7, 100)}
        for name, data in want.items():
            with open(os.path.join(tmp, name), "wb") as f:
                f.write(data)
    os.stat(tmp)  # the kernel holds an id for it
    mnt.wait_daemon_other_than(mnt.kill_daemon())
    os.rename(tmp, final)
    for name, data in want.items():
        assert read(os.path.join(final, name) if name else final) == data
    if what == "directory":
        assert sorted(os.listdir(final)) == ["a.cubin", "sub"]
        assert os.listdir(os.path.join(final, "sub")) == ["b.json"]


def test_a_dropped_directory_held_across_a_kill_lends_nothing(mnt):
    """A directory renamed onto one that is there already is dropped (the
    first stays) while a process still holds it (an open descriptor, as a
    kernel entry does), the store gives its inode numbers to the next
    directories made, and the daemon is killed: names looked up in the
    dropped directory are not found. Before, the next daemon answered
    ENOTDIR, or took a new directory that reused the inode number, name and
    parent for the dropped one and lent it that one's entries."""
    root = mnt.path(CACHE, "dropped")
    os.makedirs(os.path.join(root, "final", "sub"))
    with open(os.path.join(root, "final", "sub", "f"), "wb") as f:
        f.write(blob(1, 100))
    os.makedirs(os.path.join(root, "tmp", "sub"))
    with open(os.path.join(root, "tmp", "sub", "f"), "wb") as f:
        f.write(blob(2, 100))
    fd = os.open(os.path.join(root, "tmp", "sub"), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.rename(os.path.join(root, "tmp"), os.path.join(root, "final"))  # the first stays
        # The next ones made, named as the dropped ones were, in the same
        # parents: where the store reuses inode numbers, theirs.
        os.makedirs(os.path.join(root, "tmp", "sub"))
        with open(os.path.join(root, "tmp", "sub", "g"), "wb") as f:
            f.write(blob(3, 100))
        mnt.wait_daemon_other_than(mnt.kill_daemon())
        for name in ("f", "g"):
            with pytest.raises(FileNotFoundError):
                os.stat(name, dir_fd=fd)
    finally:
        os.close(fd)
    time.sleep(1.2)  # the kernel's entry of final, the dropped one's, expires (1 s)
    assert read(os.path.join(root, "final", "sub", "f")) == blob(1, 100)
    assert read(os.path.join(root, "tmp", "sub", "g")) == blob(3, 100)


def test_directories_keep_their_inode_numbers_across_a_kill(mnt):
    """A directory's inode number (its node id) is the same before and
    after a daemon kill, found again by path once the kernel's entries
    expire (the next daemon looks each name up again): `ls -i`, find and
    rsync see the same directory, and the kernel never meets one directory
    under two ids. Before, the next daemon gave each directory a new id
    when its name was looked up before its old id was used, and the kernel
    moved the old id's entries to the new one (d_splice_alias), which
    answered ESTALE to a call while a cross-directory rename ran
    (test_directories_renamed_into_place_by_many_across_daemon_kills)."""
    root = mnt.path(CACHE, "inos")
    deep = os.path.join(root, "a", "b", "c")
    os.makedirs(deep)
    with open(os.path.join(deep, "f"), "wb") as f:
        f.write(blob(5, 300))
    dirs = [mnt.path(CACHE), root, os.path.join(root, "a"), os.path.join(root, "a", "b"), deep]
    before = [os.stat(d).st_ino for d in dirs]
    fd = os.open(deep, os.O_RDONLY | os.O_DIRECTORY)  # the kernel keeps the deepest one
    try:
        mnt.wait_daemon_other_than(mnt.kill_daemon())
        time.sleep(1.2)  # the kernel's entries expire (1 s): each name is looked up again
        after = [os.stat(d).st_ino for d in dirs]
        assert after == before, (before, after)
        assert os.fstat(fd).st_ino == before[-1]
        assert read(os.path.join(deep, "f")) == blob(5, 300)
    finally:
        os.close(fd)


def _dir_cycler(root, seed, q):
    """For 3 s, as JIT caches build theirs: a temporary directory tree made
    and filled, renamed to its own final name, read back whole, and a
    scratch tree removed (so that the store gives its inode numbers to the
    next directories made). Every call 0."""
    errors, deadline, i = [], time.time() + 3, 0
    while time.time() < deadline:
        tmp, final = os.path.join(root, f"tmp.{seed}.{i}"), os.path.join(root, f"d.{seed}.{i}")
        scratch = os.path.join(root, f"s.{seed}.{i}")
        want = {"a.bin": blob(seed * 1000 + i, 900), "sub/b.json": blob(seed * 1000 + i + 500, 90)}
        try:
            os.makedirs(os.path.join(tmp, "sub"))
            os.makedirs(os.path.join(scratch, "x"))
            for name, data in want.items():
                with open(os.path.join(tmp, name), "wb") as f:
                    f.write(data)
            os.rename(tmp, final)
            shutil.rmtree(scratch)
            for name, data in want.items():
                if read(os.path.join(final, name)) != data:
                    errors.append(f"{final}/{name}: other bytes")
        except OSError as e:
            errors.append(f"{i}: {e}")
        i += 1
    q.put((seed, errors, i))


def test_directories_made_renamed_and_removed_across_daemon_kills(mnt):
    """6 processes make directory trees, rename them to names of their own
    and remove scratch trees while the daemon is killed 4 times: no call
    fails, every file read back is its bytes, every directory is where it
    was renamed to, and nothing temporary is left (the ids of directories
    renamed and removed across kills: told by their store generation,
    doc/caches.md)."""
    root = mnt.path(CACHE, "cycles")
    os.mkdir(root)
    t = daemon_killer(mnt, 4, 0.3)
    out = run_processes(_dir_cycler, [(root, s) for s in range(6)], timeout=180)
    t.join()
    assert [e for _, errors, _ in out for e in errors] == []
    made = sorted(f"d.{s}.{i}" for s, _, n in out for i in range(n))
    assert sorted(os.listdir(root)) == made
    for name in made:
        s_, i = (int(x) for x in name[2:].split("."))
        assert read_or_log(mnt, os.path.join(root, name, "a.bin")) == blob(s_ * 1000 + i, 900)
        assert read_or_log(mnt, os.path.join(root, name, "sub", "b.json")) == \
            blob(s_ * 1000 + i + 500, 90)
    assert os.listdir(os.path.join(mnt.store, "cache-tmp")) == []


def _creating_writer(root, seed, q):
    """Makes, writes and renames small files for 3 s: every call 0."""
    errors = []
    deadline, i = time.time() + 3, 0
    while time.time() < deadline:
        tmp = os.path.join(root, f".tmp.{seed}.{i}")
        try:
            with open(tmp, "wb") as f:
                f.write(blob(seed * 1000 + i, 700))
            os.replace(tmp, os.path.join(root, f"f{seed}-{i}"))
        except OSError as e:
            errors.append(f"{i}: {e}")
        i += 1
    q.put(errors)


def test_creates_across_daemon_kills_leave_no_temporary_file(mnt):
    """6 processes make files as fast as they can while the daemon is
    killed 6 times: no call fails, every file is whole, and once they are
    done cache-tmp is empty (a create the kernel resent to the next daemon
    leaves nothing behind from the one that was killed)."""
    root = mnt.path(CACHE, "creates")
    os.mkdir(root)
    t = daemon_killer(mnt, 6, 0.4)
    out = run_processes(_creating_writer, [(root, s) for s in range(6)], timeout=120)
    t.join()
    assert out == [[]] * 6
    for name in os.listdir(root):
        s_, i = (int(x) for x in name[1:].split("-"))
        assert read_or_log(mnt, os.path.join(root, name)) == blob(s_ * 1000 + i, 700)
    assert os.listdir(os.path.join(mnt.store, "cache-tmp")) == []


def _into_place_builder(root, seed, q, seconds=0):
    """As JIT caches do, 6 times (or for `seconds`): a temporary directory
    filled, then renamed into place onto a name every builder uses (the
    first stays); and a file written in a temporary directory, moved into a
    shared one, the temporary directory removed (os.removedirs, as Triton)."""
    errors = []
    deadline = time.time() + seconds
    for i in itertools.count():
        if i >= 6 and time.time() >= deadline:
            break
        k = i % 6
        tmp = os.path.join(root, f"tmp.{seed}.{i}")
        try:
            os.makedirs(os.path.join(tmp, "sub"))
            with open(os.path.join(tmp, "a.bin"), "wb") as f:
                f.write(blob(seed * 100 + k, 3000))
            with open(os.path.join(tmp, "sub", "b.json"), "wb") as f:
                f.write(blob(seed * 100 + k + 50, 200))
            os.rename(tmp, os.path.join(root, f"final{k}"))
            t = os.path.join(root, f"t.{seed}.{i}")
            os.mkdir(t)
            with open(os.path.join(t, "k.so"), "wb") as f:
                f.write(blob(seed * 100 + k + 70, 1500))
            os.replace(os.path.join(t, "k.so"), os.path.join(root, "files", f"k{k}.so"))
            try:
                os.removedirs(t)
            except OSError as e:
                if e.errno != errno.ENOTEMPTY:  # its parent: not empty, as expected
                    raise
        except OSError as e:
            errors.append(f"{i}: {e}")
        time.sleep(0.05)
    q.put(errors)


def _into_place_reader(root, q):
    """Reads what is in place for 4 s: each directory one builder's whole
    pair, each file one builder's bytes."""
    bad, deadline = [], time.time() + 4
    while time.time() < deadline:
        for k in range(6):
            try:
                a = read(os.path.join(root, f"final{k}", "a.bin"))
                b = read(os.path.join(root, f"final{k}", "sub", "b.json"))
            except FileNotFoundError:
                a = None
            except OSError as e:
                bad.append(f"final{k}: {e}")
                a = None
            if a is not None and not any(a == blob(s * 100 + k, 3000) and
                                         b == blob(s * 100 + k + 50, 200) for s in range(6)):
                bad.append(f"final{k}: not one builder's")
            try:
                so = read(os.path.join(root, "files", f"k{k}.so"))
            except FileNotFoundError:
                continue
            except OSError as e:
                bad.append(f"k{k}.so: {e}")
                continue
            if not any(so == blob(s * 100 + k + 70, 1500) for s in range(6)):
                bad.append(f"k{k}.so: not one builder's")
    q.put(bad)


def test_directories_renamed_into_place_by_many_at_once(mnt):
    """6 processes build directories and rename them into place onto the
    same names (the first stays), and move files out of temporary
    directories, beside 2 readers: no call fails, every directory read is
    one builder's whole, every file one builder's bytes, and nothing
    temporary is left. (Across daemon kills a call answers ESTALE now and
    then: see doc/caches.md, "Ids across a takeover".)"""
    root = mnt.path(CACHE, "into-place-many")
    os.makedirs(os.path.join(root, "files"))
    out = run_processes(lambda r, role, seed, q: (_into_place_builder(r, seed, q) if role == "b"
                                                 else _into_place_reader(r, q)),
                        [(root, "b", s) for s in range(6)] + [(root, "r", 0)] * 2, timeout=180)
    assert out == [[]] * 8
    assert sorted(os.listdir(root)) == sorted([f"final{k}" for k in range(6)] + ["files"])
    assert sorted(os.listdir(os.path.join(root, "files"))) == [f"k{k}.so" for k in range(6)]
    for k in range(6):
        a = read_or_log(mnt, os.path.join(root, f"final{k}", "a.bin"))
        b = read_or_log(mnt, os.path.join(root, f"final{k}", "sub", "b.json"))
        assert any(a == blob(s * 100 + k, 3000) and b == blob(s * 100 + k + 50, 200)
                   for s in range(6)), k
    assert os.listdir(os.path.join(mnt.store, "cache-tmp")) == []


def _long_name(k, length):
    return (f"k{k}-" + "x" * length)[:length]


def _long_named_writer(root, seed, q):
    """Files of 200-255-byte names, each written in pieces (so that a daemon
    killed meanwhile finds them half-written), under a long temporary name,
    then renamed onto a final name every writer uses."""
    errors = []
    for k in range(4):
        final = os.path.join(root, _long_name(k, 200 + 18 * k))
        tmp = os.path.join(root, _long_name(k, 255 - seed)[:-12] + f".tmp.{seed:06d}")
        data = blob(seed * 10 + k, 6000 + 13 * seed)
        try:
            with open(tmp, "wb") as f:
                for i in range(0, len(data), 1500):
                    f.write(data[i:i + 1500])
                    f.flush()
                    time.sleep(0.03)
            os.replace(tmp, final)
        except OSError as e:
            errors.append(f"{k}: {e}")
    q.put(errors)


def _long_named_reader(root, q):
    bad = []
    deadline = time.time() + 3
    while time.time() < deadline:
        for k in range(4):
            try:
                data = read(os.path.join(root, _long_name(k, 200 + 18 * k)))
            except FileNotFoundError:
                continue
            except OSError as e:
                bad.append(f"{k}: {e}")
                continue
            if not any(data == blob(s * 10 + k, 6000 + 13 * s) for s in range(8)):
                bad.append(f"{k}: other bytes")
    q.put(bad)


def test_long_named_writers_and_readers_across_a_kill_9(mnt):
    """8 processes write files under names of 200-255 bytes, in pieces, and
    rename them onto shared final names while 2 read them; the daemon is
    killed in the middle: no writer or reader sees an error, every final
    name holds one writer's bytes, and no kept name or temporary file is
    left."""
    from conftest import run_processes
    import threading
    root = mnt.path(CACHE, "long-many")
    os.mkdir(root)
    killed = []
    t = threading.Thread(target=lambda: (time.sleep(0.25), killed.append(mnt.kill_daemon())))
    t.start()
    out = run_processes(lambda r, role, seed, q: (_long_named_writer(r, seed, q) if role == "w"
                                                 else _long_named_reader(r, q)),
                        [(root, "w", s) for s in range(8)] + [(root, "r", 0)] * 2, timeout=180)
    t.join()
    mnt.wait_daemon_other_than(killed[0])
    assert out == [[]] * 10
    assert sorted(os.listdir(root)) == sorted(_long_name(k, 200 + 18 * k) for k in range(4))
    for k in range(4):
        data = read(os.path.join(root, _long_name(k, 200 + 18 * k)))
        assert any(data == blob(s * 10 + k, 6000 + 13 * s) for s in range(8)), k
    assert os.listdir(os.path.join(mnt.store, "cache-tmp")) == []


def test_a_store_without_a_usable_tree_still_serves_r3(tmp_path):
    """<store>/cache is not a directory (a damaged store): the daemon
    serves, without .cache/, and says why."""
    m = Mount(tmp_path)
    os.makedirs(m.store, mode=0o700)
    with open(os.path.join(m.store, "cache"), "w") as f:
        f.write("not a directory")
    m.start()
    try:
        assert CACHE not in os.listdir(m.mountpoint)
        os.mkdir(m.path("default"))
        assert "the mount serves no .cache/ tree" in m.log()
    finally:
        m.stop()


def test_a_fresh_start_drops_what_writers_left(tmp_path):
    """Files being written when the whole mount went (its holder killed)
    are never committed, and a fresh mount drops their temporary files."""
    m = Mount(tmp_path).start()
    os.makedirs(m.path(CACHE, "f"))
    child = subprocess.Popen(["/usr/bin/python3", "-c",
                              f"import time\nf=open({m.path(CACHE, 'f', 'x')!r},'wb')\n"
                              f"f.write(b'y'*5000)\nf.flush()\nprint('ok',flush=True)\n"
                              f"time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ok"
        tmpdir = os.path.join(m.store, "cache-tmp")
        assert len(os.listdir(tmpdir)) == 1
        m.kill()
    finally:
        child.kill()
        child.wait(timeout=30)
    m.start()
    try:
        assert os.listdir(m.path(CACHE, "f")) == []
        assert os.listdir(tmpdir) == []
    finally:
        m.stop()


def test_a_start_serves_what_the_store_holds_and_drops_what_is_not_the_trees(tmp_path):
    """A start lists every directory of <store>/cache (two directories
    deep, 300 entries in one): committed files and directories are served
    whole; a file without artfs's header, a symbolic link and a directory
    deeper than the tree allows are dropped and logged, the rest kept."""
    m = Mount(tmp_path).start()
    try:
        wide = m.path(CACHE, "wide")
        os.makedirs(os.path.join(wide, "sub", "deep"))
        want = {os.path.join("wide", f"f{i:03d}"): blob(i, 100 + i) for i in range(300)}
        want[os.path.join("wide", "sub", "deep", "g")] = blob(7, 4000)
        for name, data in want.items():
            write_atomic(m.path(CACHE, name), data)
        m.stop()
        store = os.path.join(m.store, "cache")
        with open(os.path.join(store, "wide", "foreign"), "wb") as f:
            f.write(b"not an artfs header")
        os.symlink("/etc/passwd", os.path.join(store, "wide", "link"))
        chain = os.path.join(store, "deep")
        os.makedirs(os.path.join(chain, *["d"] * 33))
        m.start()
        for name, data in want.items():
            assert read(m.path(CACHE, name)) == data, name
        assert sorted(os.listdir(wide)) == sorted([f"f{i:03d}" for i in range(300)] + ["sub"])
        assert cache_metrics(m)["artfs_cache_files"] == len(want)
        log = m.log()
        assert "foreign in the store: not a file artfs committed; dropped" in log
        assert "link in the store: not a file artfs committed; dropped" in log
        assert "a directory deeper than the tree allows" in log
    finally:
        m.stop()


def test_a_file_committed_by_fsync_closes_cleanly_after_a_kill_9(mnt):
    d = mnt.path(CACHE, "fs")
    os.mkdir(d)
    fd = os.open(os.path.join(d, "f"), os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644)
    os.write(fd, b"synced")
    os.fsync(fd)  # commits (DESIGN.md §9)
    old = mnt.kill_daemon()
    mnt.wait_daemon_other_than(old)
    os.close(fd)  # the next daemon knows it was committed: 0
    assert read(os.path.join(d, "f")) == b"synced"


def _churn(root, seed, names, q):
    """Writes its own files into a full tree (evicting others') and reads
    every name: each read is a miss or exactly one writer's bytes."""
    bad = []
    for rnd in range(15):
        try:
            write_atomic(os.path.join(root, f"w{seed}-{rnd}"), blob(seed * 100 + rnd, 9000),
                         tmp_name=f".tmp.{os.getpid()}")
        except OSError as e:
            bad.append(f"write: {e}")
        for name in names(rnd):
            try:
                with open(os.path.join(root, name), "rb") as f:
                    data = f.read()
            except FileNotFoundError:
                continue  # evicted: a miss
            s, r = (int(x) for x in name[1:].split("-"))
            if data != blob(s * 100 + r, 9000):
                bad.append(f"{name}: other bytes")
    q.put(bad)


def _names_so_far(rnd):
    return [f"w{s}-{r}" for s in range(8) for r in range(max(0, rnd - 3), rnd + 1)]


def test_eviction_beside_many_writers_and_readers(make_mount):
    """8 processes fill a tree of 400 KiB with 9 KB files (15 each, so most
    are evicted) while reading every name: no error, every byte read is its
    writer's, and the tree's bytes stay within its capacity. (The tree must
    hold more than the writers have in flight and just closed: at 100 KiB,
    8 files being written left room for 3, and on a loaded host one of them
    was a temporary file about to be renamed, evicted first.)"""
    m = make_mount(cache_capacity="400K")
    root = m.path(CACHE, "churn")
    os.mkdir(root)
    out = run_processes(_churn, [(root, s, _names_so_far) for s in range(8)], timeout=240)
    assert out == [[]] * 8
    got = cache_metrics(m)
    assert got["artfs_cache_bytes"] <= 400 * 1024 and got["artfs_cache_evictions_total"] > 0
    assert [n for n in os.listdir(root) if n.startswith(".")] == []
    for name in os.listdir(root):
        s, r = (int(x) for x in name[1:].split("-"))
        assert read(os.path.join(root, name)) == blob(s * 100 + r, 9000)



def test_directories_renamed_into_place_by_many_across_daemon_kills(mnt):
    """test_directories_renamed_into_place_by_many_at_once for 3 s, with the
    daemon killed 3 times meanwhile: no call fails (before, one in about six
    runs answered ESTALE: see test_directories_keep_their_inode_numbers_\
    across_a_kill), every directory and file read is one builder's."""
    root = mnt.path(CACHE, "into-place-kills")
    os.makedirs(os.path.join(root, "files"))
    t = daemon_killer(mnt, 3, 0.5)
    out = run_processes(lambda r, role, seed, q: (_into_place_builder(r, seed, q, 3) if role == "b"
                                                 else _into_place_reader(r, q)),
                        [(root, "b", s) for s in range(6)] + [(root, "r", 0)] * 2, timeout=180)
    t.join()
    assert out == [[]] * 8
    for k in range(6):
        a = read_or_log(mnt, os.path.join(root, f"final{k}", "a.bin"))
        b = read_or_log(mnt, os.path.join(root, f"final{k}", "sub", "b.json"))
        assert any(a == blob(s * 100 + k, 3000) and b == blob(s * 100 + k + 50, 200)
                   for s in range(6)), k
        so = read_or_log(mnt, os.path.join(root, "files", f"k{k}.so"))
        assert any(so == blob(s * 100 + k + 70, 1500) for s in range(6)), k
