# SPDX-License-Identifier: Apache-2.0
"""Real-mount fixtures: every test gets an artfs daemon of its own (the build
named by $ARTFS_DAEMON, normal or sanitized) on a fresh mountpoint and store."""
import errno
import faulthandler
import multiprocessing
import os
import subprocess
import sys
import threading
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))

DAEMON = os.environ.get("ARTFS_DAEMON")
VECTORS = os.environ.get("ARTFS_VECTORS",
                         os.path.join(os.path.dirname(__file__), "..", "vectors"))
SANITIZER_MARKS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:",
                   "SUMMARY: UndefinedBehaviorSanitizer")
# No test may run longer than this (seconds): then the watchdog below says
# where it hangs and breaks the hang, so that a hang fails one test within
# minutes instead of stalling the suite until CI gives up without a word.
TEST_LIMIT = float(os.environ.get("ARTFS_TEST_LIMIT", "480"))
LIVE_MOUNTS = set()  # Mounts whose holder runs, for the watchdog


def artfsctl():
    """The artfsctl of the daemon under test: $ARTFSCTL_BIN, or the one
    beside the daemon (the sanitizer daemon lives in tests/, one up)."""
    path = os.environ.get("ARTFSCTL_BIN") or os.path.join(os.path.dirname(DAEMON), "artfsctl")
    if not os.path.exists(path):
        path = os.path.join(os.path.dirname(DAEMON), "..", "artfsctl")
    return path


def wait_for(cond, timeout=10.0, step=0.02):
    """cond() true within timeout seconds (checked once more at the end)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(step)
    return cond()


def flip_byte(path, offset_from_end=1):
    """Damages one byte of a stored file, as a bit flip in the store would."""
    with open(path, "r+b") as f:
        f.seek(-offset_from_end, os.SEEK_END)
        b = f.read(1)
        f.seek(-offset_from_end, os.SEEK_END)
        f.write(bytes([b[0] ^ 0x40]))


def is_mounted(path):
    path = os.path.realpath(path)
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == path for line in f)


class Mount:
    def __init__(self, base, name="mnt", **options):
        self.base = str(base)
        self.mountpoint = os.path.join(self.base, name)
        self.options = {"store": os.path.join(self.base, "store")}
        self.options.update(options)
        self.store = self.options["store"]
        self.logfile = os.path.join(self.base, name + ".log")
        self.proc = None
        os.makedirs(self.mountpoint, exist_ok=True)

    # -- lifecycle --------------------------------------------------------------
    def start(self, extra_args=(), expect_fail=False):
        assert DAEMON, "ARTFS_DAEMON is not set (run through make check)"
        opts = ",".join(f"{k}={v}" if v is not None else k for k, v in self.options.items())
        cmd = [DAEMON, "-f", "-o", opts, *extra_args, self.mountpoint]
        self.log_fh = open(self.logfile, "a")
        self.proc = subprocess.Popen(cmd, stdout=self.log_fh, stderr=subprocess.STDOUT)
        LIVE_MOUNTS.add(self)
        deadline = time.time() + 20
        while time.time() < deadline:
            if is_mounted(self.mountpoint):
                return self
            if self.proc.poll() is not None:
                if expect_fail:
                    return self
                raise AssertionError(f"artfs exited {self.proc.returncode}:\n{self.log()}")
            time.sleep(0.02)
        raise AssertionError("artfs did not mount within 20 s:\n" + self.log())

    def stop(self, check=True):
        if self.proc is None:
            return
        if is_mounted(self.mountpoint):
            r = subprocess.run(["umount", self.mountpoint], check=False)
            if r.returncode != 0:  # a failed test left a file open
                subprocess.run(["umount", "-l", self.mountpoint], check=False)
        try:
            rc = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.proc = None
        LIVE_MOUNTS.discard(self)
        self.log_fh.close()
        if check:
            log = self.log()
            for mark in SANITIZER_MARKS:
                assert mark not in log, f"sanitizer report in the daemon log:\n{log}"
            assert rc == 0, f"artfs exited {rc}:\n{log}"

    # -- the holder and its daemon --------------------------------------------------
    def daemons(self):
        """Pids of the daemons the holder (self.proc) runs: the serving one,
        and during an upgrade the one that replaces it."""
        path = f"/proc/{self.proc.pid}/task/{self.proc.pid}/children"
        try:
            with open(path) as f:
                return [int(p) for p in f.read().split()]
        except FileNotFoundError:
            return []

    def daemon_pid(self, timeout=20):
        """The pid of the serving daemon (the holder's one child)."""
        found = [[]]

        def one():
            found[0] = self.daemons()
            return len(found[0]) == 1
        assert wait_for(one, timeout=timeout), f"holder {self.proc.pid} runs {found[0]}"
        return found[0][0]

    def kill_daemon(self, sig=9):
        """Signals the serving daemon (SIGKILL by default); returns its pid."""
        pid = self.daemon_pid()
        os.kill(pid, sig)
        return pid

    def wait_daemon_other_than(self, pid, timeout=20):
        """The pid of the daemon serving once pid is gone."""
        found = [[]]

        def other():
            found[0] = self.daemons()
            return len(found[0]) == 1 and found[0][0] != pid
        assert wait_for(other, timeout=timeout), f"no daemon replaced {pid}:\n{self.log()}"
        return found[0][0]

    def kill(self):
        """SIGKILL the holder (and so its daemon) and detach its dead mount."""
        self.proc.kill()
        self.proc.wait()
        self.proc = None
        LIVE_MOUNTS.discard(self)
        self.log_fh.close()
        subprocess.run(["umount", "-l", self.mountpoint], check=False)

    def restart(self):
        self.stop()
        return self.start()

    def log(self):
        with open(self.logfile, errors="replace") as f:
            return f.read()

    def wait_log(self, text, timeout=5):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if text in self.log():
                return True
            time.sleep(0.02)
        return False

    # -- paths ---------------------------------------------------------------------
    def path(self, *parts):
        return os.path.join(self.mountpoint, *parts)

    def store_file(self, wv, name):
        if wv == ".keys":  # objects with only a key lie in shards by their first digit
            return os.path.join(self.store, "v", wv, name[0], name)
        return os.path.join(self.store, "v", wv, name)

    def metrics(self):
        out = {}
        with open(self.path(".artfs", "metrics")) as f:
            for line in f:
                if line.startswith("#") or not line.strip():
                    continue
                name, value = line.rsplit(" ", 1)
                out[name] = float(value) if "." in value or "e" in value else int(value)
        return out


@pytest.fixture
def mnt(tmp_path):
    m = Mount(tmp_path).start()
    yield m
    m.stop()


def with_keys(m):
    """m, whose daemon serves .keys/ (DESIGN.md §3.6): the key-addressed
    tests fail, not skip, without it."""
    assert os.path.isdir(m.path(".keys")), "the daemon serves no .keys/ directory"
    return m


@pytest.fixture
def kmnt(mnt):
    """A mount for the tests of .keys/ and the batches of DESIGN.md §3.6-§3.7."""
    return with_keys(mnt)


@pytest.fixture
def make_mount(tmp_path):
    """Factory for mounts with options: make_mount(capacity="64K")."""
    made = []

    def factory(name="mnt", **options):
        m = Mount(tmp_path, name, **options).start()
        made.append(m)
        return m

    yield factory
    for m in made:
        m.stop()


def errname(e):
    return errno.errorcode.get(e, str(e))


def publish(path, data, flags=os.O_CREAT | os.O_WRONLY | os.O_TRUNC, chunk=None,
            fsync=False):
    """Publishes like an engine: open, write, close. Returns 0 or the errno
    name of the first call that failed, prefixed with the call
    ("close:EBADMSG")."""
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as e:
        return "open:" + errname(e.errno)
    step = chunk or max(len(data), 1)
    try:
        for off in range(0, len(data), step):
            os.write(fd, data[off:off + step])
        if fsync:
            os.fsync(fd)
    except OSError as e:
        try:
            os.close(fd)
        except OSError:
            pass
        return ("fsync:" if fsync else "write:") + errname(e.errno)
    try:
        os.close(fd)
    except OSError as e:
        return "close:" + errname(e.errno)
    return 0


def close_result(path, data, flags=os.O_CREAT | os.O_WRONLY | os.O_TRUNC, chunk=4096):
    """Writes every byte whatever write() says, then returns what close()
    says: 0 or an errno name. Also returns the set of errno names that
    write() gave on the way (artfs fails writes early once it knows)."""
    fd = os.open(path, flags, 0o644)
    write_errors = set()
    for off in range(0, len(data), chunk):
        try:
            os.write(fd, data[off:off + chunk])
        except OSError as e:
            write_errors.add(errname(e.errno))
    try:
        os.close(fd)
    except OSError as e:
        return errname(e.errno), write_errors
    return 0, write_errors


def read_result(path):
    """Bytes of the file, or the errno name of open/read."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        return "open:" + errname(e.errno)
    try:
        chunks = []
        while True:
            b = os.read(fd, 1 << 20)
            if not b:
                break
            chunks.append(b)
        return b"".join(chunks)
    except OSError as e:
        return "read:" + errname(e.errno)
    finally:
        os.close(fd)


def read_to_end(fd):
    """Everything from offset 0 to EOF (transaction files are read with pread)."""
    out = bytearray()
    while True:
        b = os.pread(fd, 1 << 20, len(out))
        if not b:
            return bytes(out)
        out += b


def transact(path, data):
    """One transaction of a batch file (.put, .get, .materialize): write
    data, fsync (its errno is in the result lines), read the result to its
    end, close."""
    fd = os.open(path, os.O_RDWR)
    try:
        os.write(fd, data)
        try:
            os.fsync(fd)
        except OSError:
            pass
        return read_to_end(fd)
    finally:
        try:
            os.close(fd)
        except OSError:
            pass


def run_processes(target, arglists, timeout=120):
    """target(*args, q) in a forked process for each args, all at once;
    returns what each put on q, once all have ended."""
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=target, args=tuple(args) + (q,)) for args in arglists]
    for p in procs:
        p.start()
    results = [q.get(timeout=timeout) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    return results


# ---- every test bounded in time -------------------------------------------------------

def _fuse_mounts_under(prefix):
    """(mountpoint, FUSE connection number) of each FUSE mount under prefix,
    read from mountinfo (a stat of a hung mount would hang too)."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            sep = fields.index("-")
            if fields[sep + 1].startswith("fuse") and fields[4].startswith(prefix):
                major, minor = (int(x) for x in fields[2].split(":"))
                out.append((fields[4], (major << 20) | minor))
    return out


def _blocked_processes(limit=12):
    """What the processes in uninterruptible sleep wait for: pid, command,
    kernel stack."""
    lines = []
    for pid in sorted((p for p in os.listdir("/proc") if p.isdigit()), key=int):
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            if state != "D":
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")[:160]
            with open(f"/proc/{pid}/stack") as f:
                stack = " < ".join(l.split()[1].split("+")[0] for l in f.read().splitlines()[:8])
        except (OSError, IndexError):
            continue
        lines.append(f"  {pid} D {cmd}\n      {stack}")
        if len(lines) == limit:
            break
    return lines


def _break_hang(nodeid, base, err):
    """Says where the test hangs (its threads, its daemons, the blocked
    processes), then aborts every FUSE connection under base and kills the
    holders, so that what waited on a mount gets an error and the test fails
    instead of hanging."""
    print(f"\n=== watchdog: {nodeid} still running after {TEST_LIMIT:.0f} s ===", file=err)
    err.flush()
    faulthandler.dump_traceback(file=err, all_threads=True)
    for m in list(LIVE_MOUNTS):
        proc = m.proc
        if proc is None:
            continue
        print(f"--- mount {m.mountpoint}: holder {proc.pid}, daemons {m.daemons()}; "
              f"its log's end:", file=err)
        print("\n".join(m.log().splitlines()[-40:]), file=err)
    print("--- processes in uninterruptible sleep:", file=err)
    print("\n".join(_blocked_processes()) or "  none", file=err)
    for path, conn in _fuse_mounts_under(base):
        try:
            with open(f"/sys/fs/fuse/connections/{conn}/abort", "w") as f:
                f.write("1")
            print(f"--- aborted the FUSE connection {conn} of {path}", file=err)
        except OSError as e:
            print(f"--- could not abort the FUSE connection {conn} of {path}: {e}", file=err)
    for m in list(LIVE_MOUNTS):
        if m.proc is not None:
            m.proc.kill()
    err.flush()


@pytest.fixture(autouse=True)
def _bounded_in_time(request, tmp_path_factory):
    """Every test: a watchdog that breaks a hang after TEST_LIMIT seconds
    (_break_hang), and, once it ends, no mount of it left behind (a test
    that failed before its stop() leaves its holder running)."""
    base = str(tmp_path_factory.getbasetemp())
    done = threading.Event()

    def watch():
        if done.wait(TEST_LIMIT):
            return
        _break_hang(request.node.nodeid, base, sys.stderr)
        if done.wait(60):
            return
        # Still hung with every mount aborted: end the run, saying so where
        # it is seen (outside pytest's capture).
        capman = request.config.pluginmanager.getplugin("capturemanager")
        if capman is not None:
            capman.suspend_global_capture(in_=False)
        _break_hang(request.node.nodeid, base, sys.__stderr__)
        os._exit(70)

    watchdog = threading.Thread(target=watch, name="watchdog", daemon=True)
    watchdog.start()
    yield
    done.set()
    for m in list(LIVE_MOUNTS):
        if m.proc is not None and m.proc.poll() is None:
            m.stop(check=False)
        else:
            LIVE_MOUNTS.discard(m)


def pytest_sessionfinish(session, exitstatus):
    """The run itself bounded too: a process a test forked and left stuck
    would keep Python's exit waiting on it (multiprocessing joins its
    children at exit); after 120 s the run ends anyway, saying why."""
    status = int(exitstatus)

    def guard():
        time.sleep(120)
        print("\n=== watchdog: the test run has not exited 120 s after its end; "
              "processes in uninterruptible sleep:", file=sys.__stderr__)
        print("\n".join(_blocked_processes()) or "  none", file=sys.__stderr__)
        sys.__stderr__.flush()
        os._exit(status or 70)

    threading.Thread(target=guard, name="exit-watchdog", daemon=True).start()
