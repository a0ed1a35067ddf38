# SPDX-License-Identifier: Apache-2.0
"""Lifetime of a store (DESIGN.md §3.5, §6): expiry, capacity, restart and
crash safety, mounting through mount(8) and fstab, clean shutdown."""
import hashlib
import multiprocessing
import os
import random
import signal
import subprocess
import time

import numpy as np
import pytest

from conftest import DAEMON, Mount, is_mounted, publish, read_result, wait_for
from envelope import encode, npy_bytes, routed_experts

WV = "default"


def test_idle_versions_are_collected_after_ttl(make_mount):
    m = make_mount(ttl="2")
    for wv in ("idle", "busy", "held"):
        os.mkdir(m.path(wv))
        assert publish(m.path(wv, "00"), encode(wv, "00", routed_experts(16))) == 0
    held = open(m.path("held", "00"), "rb")  # an open file keeps its version
    stop = time.time() + 5
    while time.time() < stop:  # "busy" is read all the time
        assert read_result(m.path("busy", "00")) == npy_bytes(routed_experts(16))
        time.sleep(0.3)
    assert not os.path.exists(m.path("idle"))
    assert sorted(os.listdir(m.mountpoint)) == [".artfs", ".blocks", ".cache", ".keys", "busy", "held"]
    assert not os.path.exists(m.store_file("idle", ""))
    met = m.metrics()
    assert met["artfs_versions_collected_total"] == 1
    assert met["artfs_objects_collected_total"] == 1
    assert met["artfs_objects"] == 2
    assert m.wait_log("expire idle: idle")
    held.close()
    # Once closed, "held" is idle from that moment and goes too.
    assert wait_for(lambda: not os.path.exists(m.path("held")), timeout=8)
    # The name is free again and works as new.
    os.mkdir(m.path("idle"))
    assert publish(m.path("idle", "00"), encode("idle", "00", routed_experts(4))) == 0
    assert read_result(m.path("idle", "00")) == npy_bytes(routed_experts(4))


def test_ttl_zero_never_collects(make_mount):
    m = make_mount(ttl="0")
    os.mkdir(m.path(WV))
    assert publish(m.path(WV, "00"), encode(WV, "00", routed_experts(4))) == 0
    time.sleep(2.5)
    assert os.path.exists(m.path(WV, "00"))


def test_full_store_collects_expired_versions_before_enospc(make_mount):
    m = make_mount(capacity="16K", ttl="3")
    envs = {h: encode(h[:2], h, routed_experts(16, seed=i))
            for i, h in enumerate(["aa00", "aa01", "bb00"])}
    os.mkdir(m.path("aa"))
    os.mkdir(m.path("bb"))
    assert publish(m.path("aa", "aa00"), envs["aa00"]) == 0
    assert publish(m.path("aa", "aa01"), envs["aa01"]) == 0
    # Not expired yet: the store is full.
    assert publish(m.path("bb", "bb00"), envs["bb00"]) == "write:ENOSPC"
    with open(m.path("bb", ".materialize"), "rb"):  # keeps "bb" in use meanwhile
        time.sleep(3.5)
    # "aa" has expired (by the janitor or by this publish): room again.
    assert publish(m.path("bb", "bb00"), envs["bb00"]) == 0
    assert not os.path.exists(m.path("aa"))
    assert m.metrics()["artfs_bytes_used"] == len(envs["bb00"])


def test_restart_drops_leftovers_and_keeps_objects(mnt):
    os.mkdir(mnt.path(WV))
    arr = routed_experts(16)
    assert publish(mnt.path(WV, "00"), encode(WV, "00", arr)) == 0
    mnt.stop()
    # What a crash can leave: named temporary files (file systems without
    # O_TMPFILE: in tmp/<k>/, or beside the objects as older daemons made
    # them) and a collection cut short in trash/.
    tmp = os.path.join(mnt.store, "tmp")
    assert sorted(os.listdir(tmp), key=int) == [str(k) for k in range(16)]
    assert all(os.listdir(os.path.join(tmp, k)) == [] for k in os.listdir(tmp))
    open(os.path.join(tmp, "3", ".tmp.99.1"), "wb").write(b"partial")
    open(mnt.store_file(WV, ".tmp.123.4"), "wb").write(b"partial")
    os.makedirs(os.path.join(mnt.store, "trash", "7.1700000000"))
    open(os.path.join(mnt.store, "trash", "7.1700000000", "ab"), "wb").write(b"x")
    mnt.start()
    assert os.listdir(mnt.path(WV)) == ["00"]
    assert read_result(mnt.path(WV, "00")) == npy_bytes(arr)
    assert not os.path.exists(mnt.store_file(WV, ".tmp.123.4"))
    assert os.listdir(os.path.join(tmp, "3")) == []
    assert os.listdir(os.path.join(mnt.store, "trash")) == []
    assert "dropped 2 temporary files" in mnt.log()


# ---- crash safety --------------------------------------------------------------

def object_for(name):
    seed = int(hashlib.sha256(name.encode()).hexdigest()[:8], 16)
    return routed_experts(16, seed=seed)


def writer(mountpoint, wv, idx, stop, done_path):
    """Publishes new objects until told to stop; records every close() == 0."""
    with open(done_path, "a") as done:
        i = 0
        while not stop.is_set():
            name = f"{idx:02x}{i:06x}"
            i += 1
            r = publish(os.path.join(mountpoint, wv, name), encode(wv, name, object_for(name)))
            if r == 0:
                done.write(name + "\n")
                done.flush()
            else:
                time.sleep(0.005)


def test_kill_9_at_random_moments_loses_no_committed_object(tmp_path):
    m = Mount(tmp_path).start()
    os.mkdir(m.path(WV))
    ctx = multiprocessing.get_context("fork")
    stop = ctx.Event()
    done_files = [str(tmp_path / f"done{i}") for i in range(4)]
    writers = [ctx.Process(target=writer, args=(m.mountpoint, WV, i, stop, done_files[i]))
               for i in range(4)]
    for w in writers:
        w.start()
    rng = random.Random(7)
    try:
        for _ in range(6):
            time.sleep(rng.uniform(0.2, 1.0))
            m.kill()  # SIGKILL, then detach the dead mount
            m.start()
        time.sleep(0.5)
    finally:
        stop.set()
        for w in writers:
            w.join(timeout=30)
            if w.is_alive():
                w.kill()
    committed = set()
    for f in done_files:
        with open(f) as fh:
            committed.update(line.strip() for line in fh if line.strip())
    assert len(committed) > 50, "the writers hardly published; the test proves nothing"
    listed = set(os.listdir(m.path(WV)))
    # Every publish that returned 0 is there and reads back identical.
    assert committed <= listed, sorted(committed - listed)[:5]
    # Every listed object is whole and valid (some publishes cut by a crash
    # may have committed without their writer learning it).
    for name in sorted(listed):
        assert read_result(m.path(WV, name)) == npy_bytes(object_for(name)), name
    assert m.metrics()["artfs_checksum_failures_total"] == 0
    assert m.log().count("indexed ") == 7
    m.stop()


# ---- mounting like a file system ----------------------------------------------------

# mount(8) runs helpers with this PATH, whatever the caller's.
HELPER_PATH = ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"]


@pytest.fixture
def artfs_on_helper_path():
    """mount.fuse3 runs `artfs` by name: link this build's daemon into the
    first directory of mount's PATH for the test, unless an installed artfs
    is already there (then this build could not be the one tested)."""
    installed = [os.path.join(d, "artfs") for d in HELPER_PATH
                 if os.path.lexists(os.path.join(d, "artfs"))]
    if installed:
        pytest.skip(f"an installed {installed[0]} would run instead of this build")
    link = os.path.join(HELPER_PATH[0], "artfs")
    os.makedirs(HELPER_PATH[0], exist_ok=True)
    os.symlink(os.path.abspath(DAEMON), link)
    try:
        yield
    finally:
        os.unlink(link)


def wait_lock_free(store):
    """Until the daemon that held store (now unmounted) has exited."""
    def free():
        try:
            pid = int(open(os.path.join(store, "lock")).read().strip() or 0)
        except (OSError, ValueError):
            return True
        return not pid or not os.path.exists(f"/proc/{pid}") or \
            open(f"/proc/{pid}/status").read().find("State:\tZ") >= 0
    return wait_for(free, timeout=20)


@pytest.mark.skipif(os.path.basename(DAEMON or "") != "artfs",
                    reason="mount.fuse3 runs the daemon as `artfs`; the sanitized build is tested directly")
def test_mount_t_fuse_artfs_and_fstab(tmp_path, artfs_on_helper_path):
    mp, store = tmp_path / "mnt", tmp_path / "store"
    mp.mkdir()
    r = subprocess.run(["mount", "-t", "fuse.artfs", "artfs", str(mp), "-o",
                        f"store={store},capacity=1G"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    try:
        assert is_mounted(mp)
        assert f"capacity = {1 << 30}" in (mp / ".artfs" / "config").read_text()
    finally:
        subprocess.run(["umount", str(mp)], check=True)
    assert wait_for(lambda: not is_mounted(mp))
    assert wait_lock_free(str(store))
    fstab = tmp_path / "fstab"
    fstab.write_text(f"artfs {mp} fuse.artfs defaults,allow_other,store={store},ttl=77 0 0\n")
    r = subprocess.run(["mount", "-T", str(fstab), str(mp)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    try:
        assert "ttl = 77" in (mp / ".artfs" / "config").read_text()
        assert "allow_other" in open("/proc/self/mounts").read().split(str(mp))[1].split("\n")[0]
    finally:
        subprocess.run(["umount", str(mp)], check=True)
    assert wait_lock_free(str(store))


def test_mount_artfs_helper(tmp_path):
    """contrib/mount.artfs, called the way mount(8) calls mount.<type>."""
    helper = os.path.join(os.environ.get("ARTFS_TESTS", os.path.dirname(__file__) + "/.."),
                          "..", "contrib", "mount.artfs")
    mp, store = tmp_path / "mnt", tmp_path / "store"
    mp.mkdir()
    env = dict(os.environ, ARTFS=DAEMON)
    r = subprocess.run(["sh", helper, "artfs", str(mp), "-n", "-o",
                        f"defaults,nofail,_netdev,x-systemd.automount,store={store},ttl=55"],
                       env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    try:
        assert wait_for(lambda: is_mounted(mp))
        assert "ttl = 55" in (mp / ".artfs" / "config").read_text()
    finally:
        subprocess.run(["umount", str(mp)], check=True)
    r = subprocess.run(["sh", helper, "artfs", str(mp), "-f", "-o", f"store={store}"], env=env)
    assert r.returncode == 0 and not is_mounted(mp)  # -f: pretend


def test_sigterm_unmounts_when_the_daemon_must_be_cut_off(tmp_path):
    """The daemon does not end after the stop (it is SIGSTOPped: a daemon
    stuck as a loaded sanitizer build was under CI): the holder aborts its
    connection after 2 s, kills it, and still unmounts (libfuse skips the
    unmount of an aborted connection: the mount stayed, ENOTCONN)."""
    m = Mount(tmp_path).start()
    os.kill(m.daemon_pid(), signal.SIGSTOP)
    m.proc.send_signal(signal.SIGTERM)
    assert m.proc.wait(timeout=20) == 0, m.log()
    assert not is_mounted(m.mountpoint), m.log()
    assert "aborted its FUSE connection" in m.log(), m.log()
    m.proc = None
    m.log_fh.close()


def test_sigterm_unmounts_cleanly(tmp_path):
    m = Mount(tmp_path).start()
    os.mkdir(m.path(WV))
    assert publish(m.path(WV, "00"), encode(WV, "00", routed_experts(4))) == 0
    m.proc.send_signal(signal.SIGTERM)
    assert m.proc.wait(timeout=10) == 0
    assert not is_mounted(m.mountpoint)
    m.proc = None
    m.log_fh.close()
    assert "unmounting" in m.log()
    # Nothing lost: the next daemon serves it.
    m.start()
    assert read_result(m.path(WV, "00")) == npy_bytes(routed_experts(4))
    m.stop()


def _batch_loop(mountpoint, seed):
    """Large .keys/.put batches until the mount goes away."""
    rng = random.Random(seed)
    while True:
        envs = [encode(WV, "%08x" % rng.getrandbits(32), routed_experts(16, seed=rng.randrange(1 << 20)))
                for _ in range(64)]
        try:
            fd = os.open(os.path.join(mountpoint, ".keys", ".put"), os.O_RDWR)
            try:
                os.write(fd, b"".join(envs))
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:
            return


def test_sigterm_while_batches_run_unmounts_cleanly(tmp_path):
    """SIGTERM while four processes send batches that run off the reading
    thread: the daemon ends within the bound, exit 0, unmounted; what it
    committed serves whole at the next start, every byte checked."""
    m = Mount(tmp_path).start()
    os.mkdir(m.path(WV))
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_batch_loop, args=(m.mountpoint, s)) for s in range(4)]
    for p in procs:
        p.start()
    time.sleep(1.5)
    m.proc.send_signal(signal.SIGTERM)
    assert m.proc.wait(timeout=15) == 0
    assert not is_mounted(m.mountpoint)
    m.proc = None
    m.log_fh.close()
    for p in procs:
        p.join(timeout=20)
        assert p.exitcode == 0
    m.start()
    try:
        keys = [k for k in os.listdir(m.path(".keys")) if not k.startswith(".")]
        assert keys  # some batches committed
        for k in keys:
            data = open(m.path(".keys", k), "rb").read()
            hlen = int.from_bytes(data[:4], "little")
            head = data[4:4 + hlen].decode()
            assert hashlib.sha256(data[4 + hlen:]).hexdigest() in head
    finally:
        m.stop()


def test_single_threaded_mode_serves_slow_requests(tmp_path):
    """-s: libfuse's own loop, no workers; requests that would go to a
    worker (a large read, a materialized request, a control command) run in
    place."""
    m = Mount(tmp_path).start(extra_args=["-s"])
    try:
        os.mkdir(m.path(WV))
        big = routed_experts(4096, layers=61, top_k=8, dtype=np.uint16)  # 4 MB
        assert publish(m.path(WV, "00"), encode(WV, "00", big)) == 0
        assert read_result(m.path(WV, "00")) == npy_bytes(big)
        assert publish(m.path(WV, "01"), encode(WV, "01", routed_experts(16, seed=1))) == 0
        with open(m.path(WV, ".materialize"), "r+b") as f:
            f.write(b"01\n")
            f.seek(0)
            assert f.read() == npy_bytes(routed_experts(16, seed=1))
        fd = os.open(m.path(".artfs", "control"), os.O_WRONLY)
        with pytest.raises(FileNotFoundError):
            os.write(fd, b"unload absent\n")
        os.close(fd)
    finally:
        m.stop()
