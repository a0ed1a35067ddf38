# SPDX-License-Identifier: Apache-2.0
"""Promises under concurrency and hostile clients: never a wrong byte, never
a corrupted daemon, bounded memory, a store that cannot hang the mount."""
import errno
import os
import resource
import subprocess
import threading

import numpy as np
import pytest

import stress
from conftest import publish, read_result, read_to_end, wait_for
from envelope import encode, npy_bytes, routed_experts

WV = "default"


def test_readers_never_see_wrong_bytes_under_republishers(mnt):
    """Readers compare every byte (and st_size) with numpy.save while other
    processes re-publish the same keys every way they can and others create
    and unlink names beside them. Before the fix, 3 re-publishers and 3
    readers got 127 wrong reads of 81,310 in 10 s (the .npy followed by
    zeros, to the envelope's length)."""
    r = stress.run(mnt.mountpoint, seconds=4, writers=3, readers=3, churners=2)
    assert r["reads"] > 100, r
    assert r["wrong"] == 0, r
    assert r["reader_errors"] == {}, r
    assert set(r["writer"]) <= {"open:EACCES", "open:EEXIST"}, r
    assert set(r["churn"]) <= {"ok", "EACCES"}, r


def test_create_in_a_collected_version_is_enoent_and_harms_nothing(make_mount):
    """A version held only by a path (O_PATH descriptor, or a cwd) is
    collected under ttl=; a create through the held descriptor then is
    ENOENT, and the daemon keeps working (this was a use-after-free that
    the sanitizer build aborted on at the next open)."""
    m = make_mount(ttl="1")
    os.mkdir(m.path("gone"))
    dfd = os.open(m.path("gone"), os.O_PATH | os.O_DIRECTORY)
    try:
        assert wait_for(lambda: "gone" not in os.listdir(m.mountpoint), timeout=10)
        for _ in range(3):
            with pytest.raises(OSError) as e:
                os.open("00aa", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=dfd)
            assert e.value.errno == errno.ENOENT
    finally:
        os.close(dfd)
    # Every kind of open still works afterwards.
    os.mkdir(m.path(WV))
    for i in range(3):
        h = f"{i:02x}"
        assert publish(m.path(WV, h), encode(WV, h, routed_experts(4, seed=i))) == 0
        assert read_result(m.path(WV, h)) == npy_bytes(routed_experts(4, seed=i))
    with open(m.path(".artfs", "metrics")) as f:
        assert "artfs_objects 3" in f.read()


def _request(m, blocks, rows):
    os.makedirs(m.path(WV), exist_ok=True)
    hashes, arrays = [], []
    for i in range(blocks):
        h = f"{i:04x}aa"
        arr = routed_experts(rows, seed=i)
        assert publish(m.path(WV, h), encode(WV, h, arr, source_token_start=i * rows)) == 0
        hashes.append(h)
        arrays.append(arr)
    text = f"token_end {blocks * rows}\n" + "".join(h + "\n" for h in hashes)
    return text.encode(), np.concatenate(arrays)


def _open_request(m, text):
    fd = os.open(m.path(WV, ".materialize"), os.O_RDWR)
    os.write(fd, text)
    return fd




def _rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def test_materialize_memory_is_bounded_and_given_back(make_mount):
    """Open .materialize results share materialize_max=; one more is ENOMEM
    (logged, counted), and closing gives the memory back to the system."""
    m = make_mount(materialize_max="40M")
    text, whole = _request(m, blocks=16, rows=2048)  # 16 x 786,432 B = 12 MiB result
    want = npy_bytes(whole)
    base = _rss(m.daemon_pid())
    fds = [_open_request(m, text) for _ in range(4)]
    got = [None] * 4
    for i, fd in enumerate(fds[:3]):
        got[i] = read_to_end(fd)
        assert got[i] == want
    with pytest.raises(OSError) as e:
        os.pread(fds[3], 4096, 0)
    assert e.value.errno == errno.ENOMEM
    met = m.metrics()
    assert met["artfs_materialize_refused_total"] == 1
    assert 3 * len(want) <= met["artfs_materialize_held_bytes"] <= 40 << 20
    held_rss = _rss(m.daemon_pid())
    for fd in fds:
        os.close(fd)
    assert wait_for(lambda: m.metrics()["artfs_materialize_held_bytes"] == 0)
    assert m.wait_log("would exceed materialize_max=")
    # The results were mappings of their own: closing returned them.
    assert wait_for(lambda: _rss(m.daemon_pid()) < held_rss - 2 * len(want), timeout=5), \
        (base, held_rss, _rss(m.daemon_pid()))
    # And a new request is served again.
    fd = _open_request(m, text)
    assert read_to_end(fd) == want
    os.close(fd)


def test_materialize_default_budget_is_a_quarter_of_capacity(make_mount):
    m = make_mount(capacity="1G")
    with open(m.path(".artfs", "config")) as f:
        assert "materialize_max = %d\n" % (256 << 20) in f.read()
    assert m.metrics()["artfs_materialize_max_bytes"] == 256 << 20


def test_a_fifo_in_the_store_is_eio_and_hangs_nothing(mnt):
    os.mkdir(mnt.path(WV))
    for h in ("00aa", "00bb"):
        assert publish(mnt.path(WV, h), encode(WV, h, routed_experts(4))) == 0
    os.unlink(mnt.store_file(WV, "00aa"))
    os.mkfifo(mnt.store_file(WV, "00aa"), 0o600)
    result = {}

    def reader():
        result["fifo"] = read_result(mnt.path(WV, "00aa"))
        result["xattr"] = subprocess.run(["getfattr", "-n", "user.artfs.key",
                                          mnt.path(WV, "00aa")], capture_output=True).returncode

    th = threading.Thread(target=reader, daemon=True)
    th.start()
    th.join(timeout=10)
    assert not th.is_alive(), "a read of a FIFO in the store hung"
    assert result["fifo"] in ("open:EIO", "read:EIO")
    assert result["xattr"] != 0
    # Everything else is served meanwhile.
    assert read_result(mnt.path(WV, "00bb")) == npy_bytes(routed_experts(4))
    assert mnt.metrics()["artfs_objects"] == 2
    assert mnt.wait_log(f"{WV}/00aa: stored object fails verification (not a regular file)")
    # A restart on that store does not hang either; the FIFO is not an object.
    mnt.restart()
    assert read_result(mnt.path(WV, "00bb")) == npy_bytes(routed_experts(4))
    assert read_result(mnt.path(WV, "00aa")) in ("open:ENOENT", "open:EIO")


def test_out_of_descriptors_is_enfile_not_eio(mnt):
    """The daemon's own descriptor table full: a publish says ENFILE (not
    EIO, which would claim a damaged store), once the temporary files the
    daemon made ahead (at most 128) are taken, and works again once
    descriptors are free."""
    os.mkdir(mnt.path(WV))
    for i in range(40):
        h = f"{i:02x}"
        assert publish(mnt.path(WV, h), encode(WV, h, routed_experts(2, seed=i))) == 0
    pid = mnt.daemon_pid()
    soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    held = []
    try:
        # No descriptor number below 8 is ever free in the daemon (standard
        # streams, /dev/fuse, the store's directories): it can open none.
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (8, hard))
        result = None
        with pytest.raises(OSError) as e:  # an open object needs a store descriptor
            held.append(open(mnt.path(WV, "00"), "rb"))
        assert e.value.errno in (errno.ENFILE, errno.EMFILE), e.value
        for i in range(300):  # the temporary files made ahead are taken first
            h = "ff%04x" % i
            result = publish(mnt.path(WV, h), encode(WV, h, routed_experts(2)))
            if result != 0:
                break
        assert result in ("close:ENFILE", "write:ENFILE"), result
    finally:
        for f in held:
            f.close()
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))
    assert publish(mnt.path(WV, "fe00"), encode(WV, "fe00", routed_experts(2))) == 0


def test_a_stalled_writer_holds_only_what_it_sent(make_mount):
    """A writer that sends a header declaring a large object and then stalls
    reserves only the bytes it sent, so it cannot fill the store."""
    m = make_mount(capacity="1M")
    os.mkdir(m.path(WV))
    big = encode(WV, "00aa", routed_experts(2000))  # 768,000-byte payload
    head = 4 + int.from_bytes(big[:4], "little")
    fd = os.open(m.path(WV, "00aa"), os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        os.write(fd, big[:head + 100])
        assert m.metrics()["artfs_bytes_reserved"] == head + 100
        # What the stalled writer declared does not stop others.
        for i in range(3):
            h = f"{i:02x}"
            assert publish(m.path(WV, h), encode(WV, h, routed_experts(400, seed=i))) == 0
    finally:
        with pytest.raises(OSError) as e:  # closed early: nothing committed
            os.close(fd)
    assert e.value.errno == errno.EBADMSG
    assert m.metrics()["artfs_bytes_reserved"] == 0
    assert not os.path.exists(m.path(WV, "00aa"))


def _hold_open(path, hashes, want, held, release, q):
    """Opens the objects of hashes in turn, want times in all or until an
    open fails; says how many it holds and the errno that stopped it, waits
    for release, then reads its first and last file and closes them all."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    fds, stopped = [], None
    try:
        for i in range(want):
            try:
                fds.append((os.open(os.path.join(path, hashes[i % len(hashes)]), os.O_RDONLY),
                            hashes[i % len(hashes)]))
            except OSError as e:
                stopped = errno.errorcode.get(e.errno, str(e.errno))
                break
        q.put((len(fds), stopped))
        held.set()
        release.wait(120)
        read = [(h, os.pread(fd, 1 << 16, 0)) for fd, h in (fds[:1] + fds[-1:])]
        q.put(read)
    finally:
        for fd, _ in fds:
            os.close(fd)


def test_clients_that_take_every_descriptor_of_the_daemon(mnt):
    """Two processes hold open objects by the thousand (up to 20,000 each)
    until the daemon's descriptor table is full: a new open fails with
    EMFILE or ENFILE, a publish 0 or ENFILE; stat, listings, attributes,
    metrics and the files already open keep working; once the processes
    close theirs, everything opens and reads back byte for byte."""
    import multiprocessing
    os.mkdir(mnt.path(WV))
    hashes = [f"{i:02x}" for i in range(64)]
    arrays = {h: routed_experts(4, seed=i) for i, h in enumerate(hashes)}
    for h in hashes:
        assert publish(mnt.path(WV, h), encode(WV, h, arrays[h])) == 0
    # Each holder may open up to 20,000 of its own (within its hard limit,
    # with room for what it inherits); the daemon, half as many again.
    per = min(20000, resource.getrlimit(resource.RLIMIT_NOFILE)[1] * 6 // 10)
    pid = mnt.daemon_pid()
    soft_was, hard_was = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    limit = min(per + per // 2, hard_was)
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    held = [ctx.Event(), ctx.Event()]
    release = ctx.Event()
    procs = []
    try:
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (limit, hard_was))
        for k in range(2):  # one after the other: the second finds the table full
            p = ctx.Process(target=_hold_open,
                            args=(mnt.path(WV), hashes, per, held[k], release, q))
            p.start()
            procs.append(p)
            assert held[k].wait(120)
        counts = [q.get(timeout=10) for _ in procs]
        assert counts[0] == (per, None), counts
        assert counts[1][0] > 0 and counts[1][1] in ("EMFILE", "ENFILE"), counts
        # The table is full: new opens and publishes say so, nothing else breaks.
        with pytest.raises(OSError) as e:
            open(mnt.path(WV, hashes[0]), "rb")
        assert e.value.errno in (errno.EMFILE, errno.ENFILE), e.value
        # (a publish takes a temporary file made ahead while there are any)
        full = publish(mnt.path(WV, "ffff"), encode(WV, "ffff", routed_experts(2)))
        assert full in (0, "close:ENFILE", "write:ENFILE")
        assert sorted(os.listdir(mnt.path(WV))) == hashes + ["ffff"] * (full == 0)
        assert os.stat(mnt.path(WV, hashes[5])).st_size == len(npy_bytes(arrays[hashes[5]]))
        assert os.getxattr(mnt.path(WV, hashes[5]), "user.artfs.shape") == b"4,48,8"
        m = mnt.metrics()
        assert m[f'artfs_version_open_files{{version="{WV}"}}'] >= per
        release.set()
        for _ in procs:
            for h, data in q.get(timeout=60):
                assert data == npy_bytes(arrays[h])
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
    finally:
        release.set()
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft_was, hard_was))
    assert wait_for(lambda: mnt.metrics()[f'artfs_version_open_files{{version="{WV}"}}'] == 0)
    for h in hashes:
        assert read_result(mnt.path(WV, h)) == npy_bytes(arrays[h])
    assert publish(mnt.path(WV, "fffe"), encode(WV, "fffe", routed_experts(2))) == 0
    assert read_result(mnt.path(WV, "fffe")) == npy_bytes(routed_experts(2))
