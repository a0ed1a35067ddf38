# SPDX-License-Identifier: Apache-2.0
"""The holder's unhappy paths (DESIGN.md §8, "Unhappy paths"): an upgrade
whose new daemon dies before it takes over leaves a daemon serving and
`artfsctl upgrade` says it failed, and why, at once; a request that kills
daemon after daemon is answered EIO after a bounded number of deaths while
others are served; a daemon that cannot start is retried, its reason
logged once. Faults are made by an LD_PRELOAD shim built here."""
import errno
import os
import signal
import shutil
import subprocess
import threading
import time

import pytest

from conftest import DAEMON, Mount, artfsctl, wait_for

SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

/* struct fuse_buf of libfuse 3 (size, flags, mem, ...) */
struct fbuf { size_t size; int flags; void *mem; int fd; off_t pos; };

static int upgrade_daemon, crash_daemon;

__attribute__((constructor)) static void shim_init(void)
{
	const char *tk = getenv("ARTFS_TAKEOVER");
	upgrade_daemon = tk && strstr(tk, "start=upgrade") != NULL;
	crash_daemon = tk && strstr(tk, "start=crash") != NULL;
}

static void die(void)
{
	struct rlimit none = { 0, 0 };
	sigset_t abrt;
	setrlimit(RLIMIT_CORE, &none);
	sigemptyset(&abrt);
	sigaddset(&abrt, SIGABRT);
	pthread_sigmask(SIG_UNBLOCK, &abrt, NULL); /* serving threads block signals */
	signal(SIGABRT, SIG_DFL); /* a sanitizer keeps SIGSEGV for itself */
	raise(SIGABRT);
	_exit(99);
}

static int is_ready(const struct msghdr *m)
{
	uint32_t type;
	int32_t value;
	if (m->msg_iovlen == 0 || m->msg_iov[0].iov_len < 8)
		return 0;
	memcpy(&type, m->msg_iov[0].iov_base, 4);
	memcpy(&value, (char *)m->msg_iov[0].iov_base + 4, 4);
	return type == 1 && value == 0;
}

/* SHIM_CRASH_AFTER_READY: a daemon started for an upgrade faults right
 * after it told the holder it is ready (KEEPER_READY, value 0).
 * SHIM_DELAY_READY_MS: a daemon started after a crash waits that long
 * before it says so (it serves meanwhile). */
ssize_t sendmsg(int fd, const struct msghdr *m, int flags)
{
	static ssize_t (*real)(int, const struct msghdr *, int);
	if (!real)
		real = (ssize_t (*)(int, const struct msghdr *, int))dlsym(RTLD_NEXT, "sendmsg");
	const char *delay = getenv("SHIM_DELAY_READY_MS");
	if (crash_daemon && delay && is_ready(m))
		usleep(1000 * (useconds_t)atoi(delay));
	ssize_t n = real(fd, m, flags);
	if (upgrade_daemon && getenv("SHIM_CRASH_AFTER_READY") && n >= 8 && is_ready(m))
		die();
	return n;
}

/* SHIM_POISON=<name>: a LOOKUP of that name kills the daemon.
 * SHIM_POISON_FIRST=<name>: the same, in the mount's first daemon only. */
int fuse_session_process_buf(void *se, const struct fbuf *buf)
{
	static int (*real)(void *, const struct fbuf *);
	const char *poison = getenv("SHIM_POISON");
	if (!poison && !upgrade_daemon && !crash_daemon)
		poison = getenv("SHIM_POISON_FIRST");
	if (!real)
		real = (int (*)(void *, const struct fbuf *))dlsym(RTLD_NEXT,
								    "fuse_session_process_buf");
	if (poison && buf->mem && buf->size > 40) {
		uint32_t opcode;
		memcpy(&opcode, (char *)buf->mem + 4, 4);
		if (opcode == 1 && strcmp((char *)buf->mem + 40, poison) == 0)
			die();
	}
	return real(se, buf);
}
"""


def preload(tmp_path, daemon=DAEMON):
    """LD_PRELOAD for the daemon with the shim (after the sanitizer's runtime,
    which must come first)."""
    src = tmp_path / "shim.c"
    so = tmp_path / "shim.so"
    src.write_text(SHIM)
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(so), str(src), "-ldl", "-lpthread"],
                   check=True)
    libs = subprocess.run(["ldd", daemon], capture_output=True, text=True).stdout
    if "libasan" in libs:
        asan = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True,
                              text=True).stdout.strip()
        return f"{asan} {so}"
    return str(so)


@pytest.fixture
def shimmed(tmp_path, monkeypatch):
    """Starts mounts with the shim preloaded and env set: shimmed(**env)."""
    made = []

    def make(**env):
        monkeypatch.setenv("LD_PRELOAD", preload(tmp_path))
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        m = Mount(tmp_path / f"m{len(made)}")
        m.start()
        made.append(m)
        # Only the mount's processes get the shim, not the test's tools.
        monkeypatch.delenv("LD_PRELOAD")
        return m
    yield make
    for m in made:
        m.stop()


def upgrade(m, timeout=30):
    t = time.time()
    r = subprocess.run([artfsctl(), "-m", m.mountpoint, "upgrade"], capture_output=True,
                       text=True, timeout=timeout)
    return r, time.time() - t


def serves(m):
    """The mount answers: its root lists and its metrics read."""
    os.listdir(m.mountpoint)
    return "artfs_daemon_pid" in open(m.path(".artfs", "metrics")).read()


def test_an_upgrade_whose_daemon_dies_after_ready_leaves_a_daemon_serving(shimmed):
    """The new daemon faults right after READY, while the old one drains:
    a fresh daemon takes over (the drained one's exit is not an unmount),
    and artfsctl upgrade fails at once, saying why; three times over. When
    the holder learns of the death before the READY (a loaded machine), the
    old daemon was never told to drain and keeps serving: also a daemon."""
    m = shimmed(SHIM_CRASH_AFTER_READY="1")
    for attempt in range(3):
        old = m.daemon_pid()
        r, took = upgrade(m)
        assert r.returncode != 0, f"attempt {attempt}: {r.stdout}{r.stderr}\n{m.log()}"
        assert "failed" in r.stderr and "signal 6" in r.stderr, r.stderr
        assert took < 10, took
        assert m.proc.poll() is None, "the holder ended:\n" + m.log()
        kept = f"daemon {old} keeps serving" in m.log()
        new = old if kept else m.wait_daemon_other_than(old)
        assert wait_for(lambda: serves(m), timeout=10), m.log()
        assert m.daemon_pid() == new
    assert "a fresh daemon takes over" in m.log() or "keeps serving" in m.log()


def test_an_upgrade_whose_daemon_is_killed_while_the_old_one_is_stopped(shimmed):
    """The issue's recipe: SIGSTOP the old daemon, SIGHUP the holder, kill -9
    the new one once it started, SIGCONT the old one: the mount survives."""
    m = shimmed()
    old = m.daemon_pid()
    os.kill(old, signal.SIGSTOP)
    try:
        m.proc.send_signal(signal.SIGHUP)
        found = [[]]

        def started():
            found[0] = [p for p in m.daemons() if p != old]
            return found[0] and m.wait_log(f"daemon {found[0][0]} started", timeout=0.05)
        assert wait_for(started, timeout=20), m.log()
        time.sleep(0.2)  # let it say READY: the holder tells the stopped one to drain
        os.kill(found[0][0], signal.SIGKILL)
        assert m.wait_log("ended before it", timeout=10), m.log()
    finally:
        os.kill(old, signal.SIGCONT)
    assert wait_for(lambda: len(m.daemons()) == 1 and found[0][0] not in m.daemons(),
                    timeout=20), m.log()
    assert m.proc.poll() is None, m.log()
    assert wait_for(lambda: serves(m), timeout=10), m.log()


def test_a_daemon_killed_while_its_own_bind_waits_is_replaced(shimmed):
    """The first daemon dies (the shim) on the LOOKUP that its binding of
    .artfs/attach made: that request is answered only by a next daemon
    (resent to it), so whatever waits for it must not be a thread of the
    dying daemon, or the daemon would never end and no next one start (a
    core dump waits for every thread; a SIGKILL leaves it unreaped). The
    next daemon serves, the first one is gone, and the socket is bound."""
    m = shimmed(SHIM_POISON_FIRST="attach")
    first = m.daemon_pid()
    new = m.wait_daemon_other_than(first, timeout=30)
    assert wait_for(lambda: serves(m), timeout=10), m.log()
    assert wait_for(lambda: not os.path.exists(f"/proc/{first}"), timeout=20), m.log()
    assert m.wait_log("attach socket: /", timeout=20), m.log()
    import socket
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(m.path(".artfs", "attach"))
    s.close()
    assert m.daemon_pid() == new and m.proc.poll() is None, m.log()
    assert "engines cannot attach" not in m.log(), m.log()


def test_an_upgrade_asked_while_a_daemon_starts_waits_for_it(shimmed):
    """SIGHUP while the daemon started after a crash has not said READY yet
    (the shim holds it 1.5 s): the upgrade is not refused; it begins once
    that daemon serves, and `artfsctl upgrade`-style records say served."""
    m = shimmed(SHIM_DELAY_READY_MS="1500")
    pid = m.kill_daemon()
    assert wait_for(lambda: m.wait_log("started (after a crash)", timeout=0.05), timeout=20), m.log()
    m.proc.send_signal(signal.SIGHUP)
    assert m.wait_log("waits: daemon", timeout=10), m.log()
    assert m.wait_log("upgrade (asked while the daemon started): starting", timeout=20), m.log()
    outcome = os.path.join(m.store, "upgrade-outcome")
    assert wait_for(lambda: os.path.exists(outcome) and " served " in open(outcome).read(),
                    timeout=30), (m.log(), open(outcome).read() if os.path.exists(outcome) else "")
    assert "refused" not in m.log(), m.log()
    assert wait_for(lambda: len(m.daemons()) == 1 and pid not in m.daemons(), timeout=20), m.log()
    assert wait_for(lambda: serves(m), timeout=10), m.log()


def test_an_upgrade_to_a_missing_binary_fails_at_once(tmp_path):
    """The binary on disk is gone: artfsctl upgrade fails within a second or
    so, saying why, and the daemon keeps serving."""
    exe = tmp_path / "artfs-copy"
    shutil.copy(DAEMON, exe)
    import conftest
    saved, conftest.DAEMON = conftest.DAEMON, str(exe)
    try:
        m = Mount(tmp_path).start()
    finally:
        conftest.DAEMON = saved
    try:
        old = m.daemon_pid()
        os.unlink(exe)
        r, took = upgrade(m)
        assert r.returncode != 0, r.stdout + r.stderr
        assert "cannot execute" in r.stderr and "No such file" in r.stderr, r.stderr
        assert took < 3, took
        assert m.daemon_pid() == old
        assert serves(m)
    finally:
        m.stop()


def test_a_request_that_kills_daemons_is_answered_eio(shimmed):
    """A LOOKUP that kills every daemon that serves it is answered EIO after
    a bounded number of deaths (logged with its opcode); other clients are
    served meanwhile and after."""
    m = shimmed(SHIM_POISON="poison-name")
    got = []

    def poisoned():
        try:
            os.stat(m.path("poison-name"))
            got.append("ok")
        except OSError as e:
            got.append(errno.errorcode[e.errno])
    t = threading.Thread(target=poisoned, daemon=True)
    t.start()
    others = 0
    deadline = time.time() + 30
    while t.is_alive() and time.time() < deadline:
        try:
            os.listdir(m.mountpoint)
            others += 1
        except OSError:
            pass
        time.sleep(0.05)
    t.join(timeout=1)
    assert got == ["EIO"], f"{got}\n{m.log()}"
    log = m.log()
    assert "answered EIO" in log and "LOOKUP" in log, log
    assert log.count("killed by signal 6") <= 6, log
    assert serves(m)
    assert os.listdir(m.mountpoint) is not None


def test_a_daemon_that_cannot_start_is_retried_and_its_reason_logged_once(tmp_path):
    """The store becomes a symlink and the daemon is killed: the daemons
    that follow cannot serve; the holder logs why once, keeps trying, and
    the mount serves again once the store is repaired."""
    m = Mount(tmp_path).start()
    store = m.store
    try:
        os.rename(store, store + ".real")
        os.symlink(store + ".real", store)
        m.kill_daemon()
        assert m.wait_log("cannot serve", timeout=10), m.log()
        time.sleep(5)  # two or three more attempts
        said = [line for line in m.log().splitlines()
                if "holder:" in line and "cannot serve" in line]
        assert len(said) == 1 and "not a directory" in said[0], m.log()
    finally:  # the mount answers nothing (not even the stat of an unmount) until then
        if os.path.islink(store):
            os.unlink(store)
            os.rename(store + ".real", store)
    try:
        assert m.wait_log("serves, after", timeout=10), m.log()
        assert wait_for(lambda: serves(m), timeout=10), m.log()
    finally:
        m.stop()
