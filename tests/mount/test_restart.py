# SPDX-License-Identifier: Apache-2.0
"""The mount outlives its daemon (DESIGN.md §8): the holder (the `artfs`
process the tests start) keeps the mount while its serving daemon is
killed (a crash) or replaced (an upgrade). Readers see no error and no
wrong byte; a publish in flight at a kill fails once with EIO and its
retry succeeds; an upgrade shows no error at all; nothing acknowledged is
lost. Without the kernel's resend (resend=0) a request lost with the
daemon is answered EIO, never left hanging. The holder's own death ends
the mount (ENOTCONN), as a daemon's death used to."""
import errno
import os
import random
import signal
import subprocess
import threading
import time

import pytest

import restart_load
from conftest import artfsctl, is_mounted, publish, read_result, wait_for
from envelope import encode, npy_bytes, routed_experts

WV = restart_load.WV


def summary(said):
    readers = [r for who, r in said if who == "reader"]
    pubs = [r for who, r in said if who == "publisher"]
    errors = {}
    for r in readers:
        for k, v in r["errors"].items():
            errors[k] = errors.get(k, 0) + v
    return readers, pubs, errors


def test_daemon_killed_again_and_again_under_load(mnt):
    """Six readers (reads, stat, readdir, xattrs, .materialize, .get,
    .keys/, metrics) and two publishers (by path, by .put) while the
    serving daemon is SIGKILLed 12 times at random moments."""
    restart_load.setup(mnt.mountpoint)
    rng = random.Random(7)
    kills = []

    def kill_often():
        time.sleep(1.0)
        for _ in range(12):
            pid = mnt.kill_daemon()
            kills.append(pid)
            mnt.wait_daemon_other_than(pid)
            time.sleep(rng.uniform(0.15, 0.6))

    said = restart_load.run(mnt.mountpoint, 14, kill_often)
    readers, pubs, errors = summary(said)
    assert len(kills) == 12
    assert errors == {}, errors
    assert sum(r["nwrong"] for r in readers) == 0, [r["wrong"] for r in readers]
    assert sum(sum(r["counts"].values()) for r in readers) > 200
    for p in pubs:
        assert set(p["failures"]) <= {"EIO"}, p["failures"]
        assert p["acked"], p
    assert restart_load.check_acknowledged(mnt.mountpoint, said) > 20
    assert mnt.log().count("holder: daemon") >= 12
    assert "asked the kernel to resend" in mnt.log()


def test_upgrades_under_load_show_no_error(mnt):
    """The same load across three upgrades (artfsctl upgrade, SIGHUP to
    the holder): no error of any kind, publishers included."""
    restart_load.setup(mnt.mountpoint)
    pids = []

    def upgrade_thrice():
        time.sleep(1.0)
        for how in ("artfsctl", "sighup", "artfsctl"):
            pid = mnt.daemon_pid()
            if how == "artfsctl":
                r = subprocess.run([artfsctl(), "-m", mnt.mountpoint, "upgrade"],
                                   capture_output=True, text=True, timeout=60)
                assert r.returncode == 0, r.stdout + r.stderr
                assert "upgraded" in r.stdout, r.stdout
            else:
                mnt.proc.send_signal(signal.SIGHUP)
            pids.append(mnt.wait_daemon_other_than(pid))
            time.sleep(1.0)

    said = restart_load.run(mnt.mountpoint, 9, upgrade_thrice)
    readers, pubs, errors = summary(said)
    assert len(pids) == 3
    assert errors == {}, errors
    assert sum(r["nwrong"] for r in readers) == 0
    for p in pubs:
        assert p["failures"] == {}, p["failures"]
    assert restart_load.check_acknowledged(mnt.mountpoint, said) > 20
    assert mnt.log().count("serves (upgrade") == 3



def _get_across_a_kill(m, key, delay):
    """A .keys/.get of a large object (verified before the first byte is
    served: hundreds of milliseconds) with the daemon killed while it runs.
    Its result is not in the page cache, so a failed read is the client's
    (the kernel retries a failed read of a cached file's page itself)."""
    out = []
    t = threading.Thread(target=restart_load.get_one, args=(m.path(".keys", ".get"), key, out))
    t.start()
    time.sleep(delay)
    pid = m.kill_daemon()
    t.join(timeout=60)
    assert not t.is_alive(), "the read hangs"
    m.wait_daemon_other_than(pid)
    return out[0]


def _big_object(m, h):
    """A 192 MB object published as h: its key and envelope."""
    arr = routed_experts(500000, layers=48, top_k=8)
    env = encode(WV, h, arr)
    os.makedirs(m.path(WV), exist_ok=True)
    assert publish(m.path(WV, h), env) == 0
    return restart_load.key_hex(h), env


@pytest.mark.parametrize("resend", ["1", "0"])
def test_a_request_in_flight_at_a_kill(make_mount, resend):
    """resend=1: the next daemon serves it, every byte. resend=0 (the path
    of kernels without FUSE_NOTIFY_RESEND): it is answered EIO, logged,
    and nothing hangs; the next read succeeds."""
    m = make_mount(resend=resend, max_object="256M")
    caught = False
    for attempt in range(6):
        h = "%04x" % (0x100 + attempt)
        key, want = _big_object(m, h)  # a fresh object: its first read verifies it
        got = _get_across_a_kill(m, key, 0.02 + 0.03 * attempt)
        if resend == "1":
            assert got == want, got if isinstance(got, str) else len(got)
            caught = "(1 were being served)" in m.log()
        elif got in ("read:EIO", "open:EIO"):
            assert m.wait_log("answered EIO"), m.log()
            caught = True
        else:  # the kill came before the request was read, or after it was answered
            assert got == want
        if caught:
            break
    assert caught, "no kill caught a request in flight in 6 tries:\n" + m.log()
    out = []
    restart_load.get_one(m.path(".keys", ".get"), key, out)
    assert out[0] == want


def test_a_publish_in_flight_at_a_kill_fails_once_and_its_retry_succeeds(mnt):
    os.mkdir(mnt.path(WV))
    env = encode(WV, "00aa", routed_experts(16))
    fd = os.open(mnt.path(WV, "00aa"), os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, env[:100])
    pid = mnt.kill_daemon()
    mnt.wait_daemon_other_than(pid)
    with pytest.raises(OSError) as e:
        os.write(fd, env[100:])
    assert e.value.errno == errno.EIO
    with pytest.raises(OSError) as e:
        os.close(fd)
    assert e.value.errno == errno.EIO
    assert not os.path.exists(mnt.path(WV, "00aa"))  # nothing of it committed
    assert publish(mnt.path(WV, "00aa"), env) == 0
    assert read_result(mnt.path(WV, "00aa")) == npy_bytes(routed_experts(16))


def test_open_files_and_known_names_keep_their_meaning(mnt):
    """Node ids and file handles that the kernel holds are served by the
    next daemon: an object opened (and one looked up) before the kill reads
    after it; a .materialize written before reads after; a directory
    listing goes on where it was."""
    os.mkdir(mnt.path(WV))
    arrays = [routed_experts(16 if i < 2 else 8, seed=i) for i in range(3)]
    for i, a in enumerate(arrays):
        h = "%02x" % i
        kind = "block" if i < 2 else "tail"
        assert publish(mnt.path(WV, h), encode(WV, h, a, kind=kind,
                                               source_token_start=16 * i)) == 0
    opened = open(mnt.path(WV, "00"), "rb")
    head = opened.read(10)
    st = os.stat(mnt.path(WV, "01"))
    mat = os.open(mnt.path(WV, ".materialize"), os.O_RDWR)
    os.write(mat, b"token_end 40\n00\n01\n02\n")
    d = os.open(mnt.path(WV), os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(2):
        pid = mnt.kill_daemon()
        mnt.wait_daemon_other_than(pid)
    import numpy as np
    assert head + opened.read() == npy_bytes(arrays[0])
    opened.close()
    assert os.stat(mnt.path(WV, "01")).st_ino == st.st_ino
    out = bytearray()
    while True:
        b = os.pread(mat, 1 << 20, len(out))
        if not b:
            break
        out += b
    os.close(mat)
    assert bytes(out) == npy_bytes(np.concatenate(arrays))
    assert sorted(os.listdir(f"/proc/self/fd/{d}")) == ["00", "01", "02"]
    os.close(d)


def test_the_holders_death_ends_the_mount(tmp_path):
    from conftest import Mount
    m = Mount(tmp_path).start()
    os.mkdir(m.path(WV))
    assert publish(m.path(WV, "00"), encode(WV, "00", routed_experts(4))) == 0
    daemon = m.daemon_pid()
    os.kill(m.proc.pid, signal.SIGKILL)
    m.proc.wait()
    t0 = time.monotonic()

    def gone():
        try:
            os.stat(m.path(".artfs", "control"))
            return False
        except OSError as e:
            return e.errno == errno.ENOTCONN
    assert wait_for(gone, timeout=5)
    assert time.monotonic() - t0 < 5
    assert wait_for(lambda: not os.path.exists(f"/proc/{daemon}"), timeout=5)
    m.proc = None
    m.log_fh.close()
    subprocess.run(["umount", "-l", m.mountpoint], check=False)
    assert not is_mounted(m.mountpoint)
    m.start()  # a new mount serves every committed object
    assert read_result(m.path(WV, "00")) == npy_bytes(routed_experts(4))
    m.stop()


def test_unmount_after_restarts_ends_the_holder(tmp_path):
    from conftest import Mount
    m = Mount(tmp_path).start()
    for _ in range(3):
        pid = m.kill_daemon()
        m.wait_daemon_other_than(pid)
    m.stop()  # umount: the daemon ends cleanly, then the holder (exit 0)
    assert not is_mounted(m.mountpoint)
    assert "3 restarts" in open(m.logfile).read()


def test_a_daemon_that_takes_over_serves_before_its_index_is_whole(mnt):
    """After a kill, the next daemon serves at once and indexes the
    store's objects in the background: names are found in the store
    meanwhile (a read, a stat, an unlink, a .materialize), a listing and
    .keys/ wait for the index, and all of it ends whole."""
    n = 6000
    os.mkdir(mnt.path("big"))
    hashes = ["%06x" % i for i in range(n)]
    envs = {h: encode("big", h, routed_experts(1, layers=2, top_k=2, seed=i))
            for i, h in enumerate(hashes)}
    for b in range(0, n, 500):
        data = b"".join(h.encode() + b"\n" + envs[h] for h in hashes[b:b + 500])
        fd = os.open(mnt.path("big", ".put"), os.O_RDWR)
        os.write(fd, data)
        assert os.pread(fd, 1 << 20, 0).decode().split()[1::2] == ["0"] * len(hashes[b:b + 500])
        os.close(fd)
    pid = mnt.kill_daemon()
    mnt.wait_daemon_other_than(pid)
    rng = random.Random(3)
    for h in rng.sample(hashes, 50):
        hlen = int.from_bytes(envs[h][:4], "little")
        assert os.stat(mnt.path("big", h)).st_size > 0
        assert read_result(mnt.path("big", h))[-4:] == envs[h][-4:]
        assert os.getxattr(mnt.path("big", h), "user.artfs.shape") == b"1,2,2"
        assert hlen
    gone = hashes[17]
    os.unlink(mnt.path("big", gone))
    assert sorted(os.listdir(mnt.path("big"))) == [h for h in hashes if h != gone]
    k = restart_load.derive_key("big", hashes[42]).split("/", 1)[1]
    assert read_result(mnt.path(".keys", k)) == envs[hashes[42]]
    assert wait_for(lambda: mnt.metrics()["artfs_objects"] == n - 1)
    assert "their objects are indexed while the daemon serves" in mnt.log()


def test_a_daemon_that_does_not_end_after_an_unmount_is_cut_off(tmp_path):
    """A daemon that cannot end (here: stopped) after its mount was
    unmounted: the holder aborts the FUSE connection 2 s later, kills it
    and ends, instead of waiting for ever."""
    from conftest import Mount
    m = Mount(tmp_path).start()
    pid = m.daemon_pid()
    os.stat(m.path(".artfs", "metrics"))
    # Once the attach socket is bound, it holds the file system past the
    # unmount, so its connection is there to abort (before, the unmount
    # ends the file system and the kernel aborts the connection itself).
    assert m.wait_log("attach socket: ", timeout=20), m.log()
    os.kill(pid, signal.SIGSTOP)
    try:
        # umount(8) would stat the mount point first, which waits for the
        # stopped daemon: the system call alone.
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.umount2(m.mountpoint.encode(), 0) == 0, os.strerror(ctypes.get_errno())
        m.proc.wait(timeout=20)
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    log = m.log()
    assert f"daemon {pid} did not end within 2 s of the unmount" in log, log
    assert "aborted its FUSE connection" in log, log
    assert not is_mounted(m.mountpoint)
    m.proc = None


def test_a_warm_takeover_publishes_while_it_counts_the_store(mnt):
    """A daemon that takes over from one that had counted the store goes
    on publishing while it counts the store again, against the holder's
    bound of the store's bytes and its filter of the keys held (DESIGN.md
    §8): new keys commit; a key the store holds, by path or by key only, is
    still found (identical content 0, other content EEXIST); everything
    reads back whole, and nothing is stored twice."""
    n = 20000
    os.mkdir(mnt.path("big"))
    hashes = ["%06x" % i for i in range(n)]
    data = {h: routed_experts(1, layers=2, top_k=2, seed=i) for i, h in enumerate(hashes)}
    for b in range(0, n, 1000):
        blob = b"".join(h.encode() + b"\n" + encode("big", h, data[h]) for h in hashes[b:b + 1000])
        fd = os.open(mnt.path("big", ".put"), os.O_RDWR)
        os.write(fd, blob)
        assert os.pread(fd, 1 << 20, 0).decode().split()[1::2] == ["0"] * 1000
        os.close(fd)
    only = {"ab%06x" % i: routed_experts(2, seed=100000 + i) for i in range(200)}
    fd = os.open(mnt.path(".keys", ".put"), os.O_RDWR)
    os.write(fd, b"".join(encode("big", h, a) for h, a in only.items()))
    assert os.pread(fd, 1 << 20, 0).decode().split()[1::2] == ["0"] * len(only)
    os.close(fd)
    assert wait_for(lambda: mnt.metrics()["artfs_store_sizing"] == 0, timeout=60)
    overlapped = 0
    for round_ in range(3):
        pid = mnt.kill_daemon()
        mnt.wait_daemon_other_than(pid)
        fresh = {"fe%02x%04x" % (round_, i): routed_experts(2, seed=200000 + 1000 * round_ + i)
                 for i in range(300)}
        by_path = hashes[round_ * 10:round_ * 10 + 10]
        by_key = list(only)[round_ * 10:round_ * 10 + 10]
        # New keys: the filter says no object holds them; no wait.
        fd = os.open(mnt.path(".keys", ".put"), os.O_RDWR)
        os.write(fd, b"".join(encode("big", h, a) for h, a in fresh.items()))
        results = os.pread(fd, 1 << 20, 0).decode().split()[1::2]
        os.close(fd)
        overlapped += mnt.metrics()["artfs_store_sizing"] == 1
        assert results == ["0"] * len(fresh)
        # Keys the store holds: decided against the objects that hold them.
        records = ([encode("big", h, data[h]) for h in by_path[:5]] +
                   [encode("big", h, routed_experts(1, layers=2, top_k=2, seed=10**6))
                    for h in by_path[5:]] +
                   [encode("big", h, only[h]) for h in by_key[:5]] +
                   [encode("big", h, routed_experts(2, seed=8)) for h in by_key[5:]])
        fd = os.open(mnt.path(".keys", ".put"), os.O_RDWR)
        os.write(fd, b"".join(records))
        results = os.pread(fd, 1 << 20, 0).decode().split()[1::2]
        with pytest.raises(FileExistsError):  # the batch did not all commit
            os.close(fd)
        assert results == ["0"] * 5 + ["EEXIST"] * 5 + ["0"] * 5 + ["EEXIST"] * 5
        assert wait_for(lambda: mnt.metrics()["artfs_store_sizing"] == 0, timeout=60)
        for h, a in list(fresh.items())[::7] + [(h, data[h]) for h in by_path] + \
                [(h, only[h]) for h in by_key]:
            k = restart_load.derive_key("big", h).split("/", 1)[1]
            assert read_result(mnt.path(".keys", k)) == encode("big", h, a)
        only.update(fresh)
        assert mnt.metrics()["artfs_objects"] == n + len(only)
    assert mnt.log().count("counted again in the background; publishes go on") >= 3
    assert len(os.listdir(mnt.path(".keys"))) == n + len(only)
    print(f"{overlapped} of 3 batches were answered while the store was still being counted")
