# SPDX-License-Identifier: Apache-2.0
"""Clients of .artfs/attach that misbehave (DESIGN.md §8, "Unhappy paths"):
any local user may connect, so none may block a thread that serving or an
upgrade waits for, nor fill the log. The misbehaving client runs as nobody
(setpriv), with the mount as its working directory (the test's temporary
directory above the mount is 0700)."""
import os
import socket
import struct
import subprocess
import threading
import time

import pytest

from conftest import artfsctl, wait_for

NOBODY = 65534
SOCK = os.path.join(".artfs", "attach")
MAGIC = 0x534c5441
ABI = 2

# Passes descriptors whose last close blocks: TCP sockets with SO_LINGER
# {1, 30} and unsent data (their peer is a listener that never accepts
# nor reads), one per connection to the attach socket, then closes its own
# copies (the daemon's drop is the last reference) and waits to be killed.
PASSER = r'''
import os, socket, struct, sys, time
n = int(sys.argv[1])
lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
lst.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
lst.bind(("127.0.0.1", 0))
lst.listen(64)
conns = []
for _ in range(n):
    t = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    t.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    t.connect(lst.getsockname())
    t.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 30))
    t.setblocking(False)
    try:
        while True:
            t.send(b"x" * 65536)
    except BlockingIOError:
        pass
    a = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    a.connect(sys.argv[2])
    # The descriptor first, then a request, and the descriptor closed here
    # at once: the daemon's drop of it (unread, or received) comes last.
    # The daemon may drop the connection before the request is sent
    # (EPIPE, ECONNRESET). Sent the other way round, the daemon answered
    # the request and closed before the descriptor could follow (EPIPE in
    # a fresh-clone CI), so none was queued.
    fd = t.detach()
    a.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", fd))])
    os.close(fd)
    try:
        a.send(struct.pack("II", 0x534c5441, 2) + b"\0" * 32)
    except (BrokenPipeError, ConnectionResetError):
        pass  # dropped already, with the descriptor unread
    conns.append(a)
print("passed", flush=True)
time.sleep(120)
'''

# Connects count times and says nothing, as fast as it can.
SILENT = r'''
import socket, sys
held = []
for i in range(int(sys.argv[1])):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(sys.argv[2])
    held.append(s)
    if len(held) > 200:
        held.pop(0).close()
print("done", flush=True)
'''


@pytest.fixture
def shared(make_mount):
    """A mount every local user may enter (allow_other)."""
    return make_mount(allow_other=None)


def as_nobody(mnt, code, *args):
    cmd = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
           "/usr/bin/python3", "-c", code, *map(str, args)]
    return subprocess.Popen(cmd, cwd=mnt.mountpoint, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def attach_socket(mnt):
    path = mnt.path(SOCK)
    assert wait_for(lambda: os.path.exists(path), timeout=10), "no attach socket"
    return path


def ask(path, timeout):
    """A well-formed request (a token no one was given): the reply's error."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.settimeout(timeout)
    try:
        s.connect(path)
        s.send(struct.pack("II", MAGIC, ABI) + os.urandom(32))
        data = s.recv(4096)
    finally:
        s.close()
    magic, error = struct.unpack_from("Ii", data)
    assert magic == MAGIC
    return error


def start_passer(mnt, n):
    p = as_nobody(mnt, PASSER, n, SOCK)
    line = p.stdout.readline()
    if line.strip() != "passed":  # it ended: say why
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
        raise AssertionError(f"the passer ended ({p.returncode}): {line!r} {p.stderr.read()}\n"
                             + mnt.log()[-3000:])
    return p


def test_passed_descriptors_delay_no_other_client(shared):
    """Three descriptors whose close lingers 30 s, passed by nobody: a
    well-formed request of another client is still answered at once."""
    mnt = shared
    path = attach_socket(mnt)
    p = start_passer(mnt, 3)
    try:
        for _ in range(5):
            t0 = time.monotonic()
            assert ask(path, timeout=10) == -2  # ENOENT: no such token
            assert time.monotonic() - t0 < 2.0
    finally:
        p.kill()
        p.wait(timeout=10)


def test_passed_descriptors_hold_no_upgrade(shared):
    """The same descriptors, then an upgrade: it completes without waiting
    for their linger, and lookups are served all along."""
    mnt = shared
    path = attach_socket(mnt)
    p = start_passer(mnt, 3)
    slowest = [0.0]
    stop = threading.Event()

    def lookups():
        while not stop.is_set():
            t0 = time.monotonic()
            os.stat(mnt.path(".artfs"))
            os.listdir(mnt.mountpoint)
            slowest[0] = max(slowest[0], time.monotonic() - t0)
            time.sleep(0.01)

    th = threading.Thread(target=lookups)
    th.start()
    try:
        time.sleep(0.5)  # the daemon takes the passer's connections meanwhile
        pid = mnt.daemon_pid()
        t0 = time.monotonic()
        r = subprocess.run([artfsctl(), "-m", mnt.mountpoint, "upgrade"],
                           capture_output=True, text=True, timeout=60)
        took = time.monotonic() - t0
        assert r.returncode == 0, r.stdout + r.stderr
        assert "upgraded" in r.stdout, r.stdout
        mnt.wait_daemon_other_than(pid)
        assert took < 10, took
        assert ask(path, timeout=10) == -2
    finally:
        stop.set()
        th.join(timeout=30)
        p.kill()
        p.wait(timeout=10)
    assert slowest[0] < 5, slowest[0]


def test_silent_connection_flood_writes_a_few_log_lines(shared):
    """Thousands of connections that say nothing: the log gets a few lines
    a second, then how many it left out; other clients are answered."""
    mnt = shared
    path = attach_socket(mnt)
    before = mnt.log().count("attach socket:")
    t0 = time.monotonic()
    p = as_nobody(mnt, SILENT, 3000, SOCK)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert ask(path, timeout=10) == -2
    # the timeouts of the last ones (1 s), and the line that counts them
    assert wait_for(lambda: "were not logged" in mnt.log(), timeout=5)
    took = time.monotonic() - t0
    lines = mnt.log().count("attach socket:") - before
    assert lines <= 6 * (took + 2), (lines, took)
