# SPDX-License-Identifier: Apache-2.0
"""Unhappy paths of a daemon's start and takeover (DESIGN.md §8, "Unhappy
paths"; issue #34): with resend=0 every request a dead daemon had read is
answered EIO, also one it had not noted yet; every daemon of a mount serves
the one store its holder locked; a daemon that cannot start says why in
the log and `artfsctl status` does not hang meanwhile; relative paths are
refused before the mount; .artfs/control is the mount owner's, not uid='s."""
import os
import re
import shutil
import struct
import subprocess
import threading
import time

import restart_load
from conftest import Mount, artfsctl, is_mounted, publish, wait_for
from envelope import encode, routed_experts

WV = restart_load.WV
FUSE_READ = 15
NOBODY = 65534


# ---- the held memory's records of requests in flight (src/restart/held.h) -------------

def held_path(m):
    """/proc/<holder>/fd/N of the memory the holder keeps for its daemons.
    The holder makes it after the mount (it records the kernel's INIT
    first): a loaded host shows the mount before it, so it is waited for."""
    fds = f"/proc/{m.proc.pid}/fd"
    found = []

    def look():
        for n in os.listdir(fds):
            try:
                if os.readlink(os.path.join(fds, n)).startswith("/memfd:artfs-held"):
                    found.append(os.path.join(fds, n))
                    return True
            except OSError:
                pass
        return False
    if not wait_for(look, timeout=20):
        raise AssertionError("the holder keeps no artfs-held memory")
    return found[-1]


def inflight_slots(fd):
    """[(offset of the slot, unique, opcode)] of every request noted in flight."""
    (off,) = struct.unpack_from("<Q", os.pread(fd, 8, 24))  # held_header.inflight_off
    data = os.pread(fd, 1024 * 16, off)
    out = []
    for i in range(1024):
        unique, opcode = struct.unpack_from("<QI", data, i * 16)
        if unique:
            out.append((off + i * 16, unique, opcode))
    return out



def test_resend_0_answers_a_request_read_but_not_noted(make_mount):
    """A request the daemon had read but not noted yet when it died (its
    note is wiped here, as a kill between the read and the note leaves it):
    with resend=0 the next daemon has the kernel resend it and answers it
    EIO, logged with its opcode and node; the client does not hang."""
    m = make_mount(resend="0", max_object="256M")
    held = os.open(held_path(m), os.O_RDWR)
    caught = None
    hung = []
    try:
        for attempt in range(6):
            h = "%04x" % (0x200 + attempt)
            env = encode(WV, h, routed_experts(500000, layers=48, top_k=8))
            os.makedirs(m.path(WV), exist_ok=True)
            assert publish(m.path(WV, h), env) == 0  # fresh: its first read verifies it
            out = []
            t = threading.Thread(target=restart_load.get_one, args=(m.path(".keys", ".get"),
                                                    restart_load.key_hex(h), out))
            t.start()
            reads = []
            wait_for(lambda: bool(reads.extend(s for s in inflight_slots(held)
                                               if s[2] == FUSE_READ) or reads),
                     timeout=10, step=0.001)
            if not reads:
                t.join(timeout=30)
                continue
            for off, _, _ in reads:
                os.pwrite(held, b"\0" * 8, off)  # unnoted: only the kernel knows it now
            pid = m.kill_daemon()
            t.join(timeout=30)
            if t.is_alive():
                hung.append(t)
                raise AssertionError("the read hangs:\n" + m.log())
            m.wait_daemon_other_than(pid)
            if out[0] in ("read:EIO", "open:EIO"):
                caught = out[0]
                break
            assert isinstance(out[0], bytes), out[0]  # answered before the kill
    finally:
        os.close(held)
        if hung:  # end the mount under it: the client's request fails then
            m.kill()
            for t in hung:
                t.join(timeout=30)
    assert caught, "no kill caught a read in flight in 6 tries:\n" + m.log()
    assert m.wait_log("resend=0: answered EIO"), m.log()
    assert "(opcode 15, node" in m.log()
    out = []
    restart_load.get_one(m.path(".keys", ".get"), restart_load.key_hex(h), out)
    assert isinstance(out[0], bytes) and len(out[0]) > 0, out[0]


# ---- every daemon of a mount serves the store its holder locked -------------------

def _publish_one(m, h="0300"):
    """An acknowledged object: its path in the mount and the bytes it reads."""
    os.makedirs(m.path(WV), exist_ok=True)
    assert publish(m.path(WV, h), encode(WV, h, routed_experts(64, seed=3))) == 0
    with open(m.path(WV, h), "rb") as f:
        return m.path(WV, h), f.read()


def _holder_says_cannot_serve(m):
    """Whether the holder logs, within 20 s, that a daemon after a crash
    cannot serve (it says why, once per reason)."""
    return wait_for(lambda: re.search(r"holder: daemon \d+ cannot serve: ", m.log()), timeout=20)


def _end(m, undo):
    """Stops m; when no daemon serves it (a test that failed midway), undo
    lets one serve first: a stat of the mount that no daemon answers (the
    unmount's) waits for good; a mount none serves within 20 s is cut off."""
    undo()
    if wait_for(lambda: "serving " in m.log().rsplit("cannot serve", 1)[-1], timeout=20):
        m.stop()
    else:
        m.kill()


def _refused_then_served(m, pid, undo, path, want):
    """The daemons after pid refuse the other store (said in the log) until
    undo() puts the locked one back; then one serves the object as before."""
    m.wait_daemon_other_than(pid)
    assert _holder_says_cannot_serve(m), m.log()
    undo()
    n = m.log().count("serving ")
    assert wait_for(lambda: m.log().count("serving ") > n, timeout=20), m.log()
    with open(path, "rb") as f:
        assert f.read() == want


def test_a_daemon_refuses_a_store_path_edited_in_the_config(tmp_path):
    """The config's store= is edited after the mount, then a crash: the next
    daemons refuse (the store the holder locked is elsewhere) and make no
    store at the new path; back to the old path, one serves every object."""
    store, other = str(tmp_path / "store"), str(tmp_path / "other")
    conf = tmp_path / "artfs.conf"
    conf.write_text(f"store = {store}\n")
    m = Mount(tmp_path, config=str(conf))
    del m.options["store"]  # from the config file only
    m.start()
    try:
        path, want = _publish_one(m)
        conf.write_text(f"store = {other}\n")
        pid = m.kill_daemon()
        m.wait_daemon_other_than(pid)
        assert _holder_says_cannot_serve(m), m.log()
        assert "does not serve another store" in m.log() or "no such directory" in m.log()
        assert not os.path.exists(other), "a daemon made a store the holder did not lock"
        _refused_then_served(m, pid, lambda: conf.write_text(f"store = {store}\n"), path, want)
    finally:
        _end(m, lambda: conf.write_text(f"store = {store}\n"))


def test_a_daemon_refuses_a_store_directory_renamed_and_replaced(tmp_path, make_mount):
    """The store's directory is renamed away and an empty one made at its
    path, then a crash: the next daemons refuse the empty one; the lock
    stays with the holder (a second mount of the renamed store is refused);
    once the store is back, one serves every object."""
    m = make_mount()
    path, want = _publish_one(m)
    moved = m.store + ".moved"

    def undo():
        if os.path.exists(moved):
            shutil.rmtree(m.store, ignore_errors=True)
            os.rename(moved, m.store)
    os.rename(m.store, moved)
    os.mkdir(m.store, 0o700)
    try:
        pid = m.kill_daemon()
        m.wait_daemon_other_than(pid)
        assert m.wait_log("does not serve another store", timeout=20), m.log()
        assert os.listdir(m.store) == [], "a daemon served the empty directory"
        second = Mount(tmp_path, "second", store=moved).start(expect_fail=True)
        assert second.proc.wait(timeout=30) != 0 and not is_mounted(second.mountpoint)
        assert "in use by another artfs daemon" in second.log(), second.log()
        second.stop(check=False)
        _refused_then_served(m, pid, undo, path, want)
    finally:
        undo()
        if not wait_for(lambda: "serving " in m.log().rsplit("cannot serve", 1)[-1],
                        timeout=20):
            m.kill()  # make_mount's stop would wait for good on a mount none serves


# ---- a daemon that cannot start says why; status does not hang ------------------

def _status(m, *args):
    """artfsctl status of m: (exit status, stdout, stderr, seconds it took)."""
    start = time.monotonic()
    r = subprocess.run([artfsctl(), "-m", m.mountpoint, "status", *args],
                       capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout, r.stderr, time.monotonic() - start


def test_a_daemon_that_cannot_read_its_config_says_why(tmp_path):
    """The config file turns invalid after the mount, then a crash: each
    next daemon logs why it cannot serve and says it in its READY (the
    holder logs it); `artfsctl status` answers within its timeout
    meanwhile; once the file is fixed a daemon serves again."""
    conf = tmp_path / "artfs.conf"
    conf.write_text("capacity = 1G\n")
    m = Mount(tmp_path, config=str(conf)).start()
    try:
        assert _status(m)[0] == 0
        conf.write_text("capacity = banana\n")
        pid = m.kill_daemon()
        m.wait_daemon_other_than(pid)
        assert _holder_says_cannot_serve(m), m.log()
        assert "error: cannot serve: " in m.log() and "capacity=banana" in m.log(), m.log()
        rc, out, err, took = _status(m, "--timeout", "2")
        assert rc == 1 and "does not answer within 2 s" in err, (rc, out, err)
        assert took < 20, took
        n = m.log().count("serving ")
        conf.write_text("capacity = 1G\n")
        assert wait_for(lambda: m.log().count("serving ") > n, timeout=20), m.log()
        rc, out, err, _ = _status(m)
        assert rc == 0 and "store" in out, (rc, out, err)
    finally:
        _end(m, lambda: conf.write_text("capacity = 1G\n"))


def test_a_relative_config_path_is_refused_before_the_mount(tmp_path):
    """config= relative: refused with a message before anything is
    mounted (a holder in the background runs its daemons from /, where the
    path names another file)."""
    (tmp_path / "artfs.conf").write_text("capacity = 1G\n")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run([os.environ["ARTFS_DAEMON"], "-o",
                        f"store={tmp_path / 'store'},config=artfs.conf", str(mnt)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=60)
    if is_mounted(str(mnt)):
        subprocess.run(["umount", str(mnt)], check=False)
    assert r.returncode != 0, r.stderr
    assert "config=artfs.conf: must be an absolute path" in r.stderr, r.stderr


# ---- .artfs/control is the mount owner's -------------------------------------------

def test_the_uid_user_cannot_write_control(make_mount):
    """uid= shows another owner for the mount's entries, not for
    .artfs/control: that user cannot open it to write (load, unload,
    upgrade); the mount's owner (root) can."""
    m = make_mount(uid=str(NOBODY), gid=str(NOBODY), allow_other=None)
    control = m.path(".artfs", "control")
    child = ("import errno, os\n"
             "try:\n"
             "    fd = os.open('.artfs/control', os.O_WRONLY)\n"
             "except OSError as e:\n"
             "    print(errno.errorcode[e.errno])\n"
             "else:\n"
             "    os.close(fd)\n"
             "    print('opened')\n")
    r = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                        "/usr/bin/python3", "-c", child], cwd=m.mountpoint,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "EACCES", r.stdout
    st = os.stat(control)
    assert (st.st_uid, st.st_gid) == (os.getuid(), os.getgid())
    assert os.stat(m.mountpoint).st_uid == NOBODY
    os.close(os.open(control, os.O_WRONLY))  # the owner may
