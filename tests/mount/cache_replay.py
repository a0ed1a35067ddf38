# SPDX-License-Identifier: Apache-2.0
"""Replays a trace of what a JIT tool did to its cache directory (made by
tests/cache/record_ops.py on the GPU host) onto a directory, with real
system calls, and checks that the directory behaved as the tool needs.

    python3 cache_replay.py [--first-stays] TRACE [TRACE...] ROOT

replays the traces in order (cold, then warm) into ROOT, then into a fresh
local directory, and compares the two. Each op is replayed as the tool made
it: a file opened for writing gets the recorded size of deterministic
pseudo-random bytes (the same recorded content, the same bytes), written
whole before the close; a read reads the file whole and compares it with
what the replay put there; a dlopen maps the file PROT_READ|PROT_EXEC, as
ld.so does. Every result must be the recorded one (judged on the GPU host
from a probe just before the call); the errors the tools get and catch
are EEXIST from mkdir (os.makedirs(exist_ok=True)), ENOTEMPTY and ENOENT
from rmdir (os.removedirs stops at the first), ENOENT from the open of a
file to read (a miss), from listdir and from remove; any other error
fails. A listdir must list what the replay made there. At the end every
file must hold the bytes last renamed (or written) onto it, no temporary
file may remain, and nothing else may be there.

With --first-stays a rename onto a file with other bytes keeps the first
(DESIGN.md §9); without it the last wins, as on any local file system."""
import errno
import fcntl
import hashlib
import json
import mmap
import os
import sys
import tempfile

BENIGN = {"mkdir": {"EEXIST"}, "rmdir": {"ENOTEMPTY", "ENOENT"}, "open": {"ENOENT"},
          "listdir": {"ENOENT"}, "scandir": {"ENOENT"}, "remove": {"ENOENT"}}
INFORMATIONAL = ("fcntl", "mmap", "record-error")  # recorded, not replayed (none in the traces)
WRITING = os.O_WRONLY | os.O_RDWR


class ReplayError(AssertionError):
    pass


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def content(op, index):
    """The bytes a write of op puts in its file: a function of the recorded
    content (its sha and size), else of its place in the trace."""
    size = op.get("size") or 0
    seed = f"{op['sha']}:{size}" if op.get("sha") else f"{op['path']}#{index}"
    return hashlib.shake_256(seed.encode()).digest(size)


def open_flags(names):
    flags = 0
    for name in names:
        flags |= getattr(os, name, 0)
    return flags


def errname(e):
    return errno.errorcode.get(e.errno, str(e.errno))


class Replay:
    """The replay of traces into root, and the tree it should leave: files
    (path -> bytes) and dirs, relative to root."""

    def __init__(self, root, first_stays=False):
        self.root = root
        self.first_stays = first_stays
        self.files, self.dirs = {}, set()
        self.renamed_away = set()  # temporaries: sources of renames
        self.counts = {}

    def path(self, rel):
        return os.path.join(self.root, rel)

    def run(self, ops, name="trace"):
        for i, op in enumerate(ops):
            if op["op"] in INFORMATIONAL or op["op"].startswith("shutil."):
                continue
            do = getattr(self, "do_" + op["op"], None)
            if do is None:
                raise ReplayError(f"{name}:{i + 1}: no replay for op {op['op']}")
            try:
                do(op, i)
                got = "ok"
            except OSError as e:
                got = errname(e)
            except ReplayError as e:
                raise ReplayError(f"{name}:{i + 1}: {e}") from None
            self.judge(op, got, f"{name}:{i + 1}")
            self.counts[op["op"]] = self.counts.get(op["op"], 0) + 1

    def judge(self, op, got, where):
        want = op.get("result")
        tolerated = BENIGN.get(op["op"], set())
        if got != "ok" and got not in tolerated:
            raise ReplayError(f"{where}: {op['op']} {op['path']}: {got}, which the tool "
                              f"does not tolerate (recorded: {want})")
        if want is not None and got != want:
            raise ReplayError(f"{where}: {op['op']} {op['path']}: {got}, recorded {want}")

    # -- the ops ------------------------------------------------------------------
    def do_mkdir(self, op, i):
        os.mkdir(self.path(op["path"]))
        self.dirs.add(op["path"])

    def do_rmdir(self, op, i):
        os.rmdir(self.path(op["path"]))
        self.dirs.discard(op["path"])

    def do_remove(self, op, i):
        os.remove(self.path(op["path"]))
        self.files.pop(op["path"], None)

    def do_listdir(self, op, i):
        got = sorted(os.listdir(self.path(op["path"])))
        want = self.listing(op["path"])
        if got != want:
            raise ReplayError(f"listdir {op['path']}: {got}, the replay made {want}")

    do_scandir = do_listdir

    def do_open(self, op, i):
        flags = open_flags(op["flags"])
        if flags & WRITING:
            return self.write(op, i, flags)
        fd = os.open(self.path(op["path"]), flags)
        try:
            self.compare(op["path"], read_fd(fd), "read")
        finally:
            os.close(fd)

    def write(self, op, i, flags):
        data = content(op, i)
        fd = os.open(self.path(op["path"]), flags, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        old = self.files.get(op["path"], b"") if flags & os.O_APPEND else b""
        self.files[op["path"]] = old + data

    def do_rename(self, op, i):
        src, dst = op["path"], op["dst"]
        os.rename(self.path(src), self.path(dst))
        if src in self.dirs:
            self.move_dir(src, dst)
            return
        data = self.files.pop(src)
        self.renamed_away.add(src)
        if not (self.first_stays and dst in self.files):
            self.files[dst] = data

    def move_dir(self, src, dst):
        """The model after rename(src, dst) of a directory (onto an existing
        one with --first-stays: the source tree is dropped)."""
        keep = self.first_stays and dst in self.dirs
        for p in [p for p in self.files if p.startswith(src + "/")]:
            data = self.files.pop(p)
            if not keep:
                self.files[dst + p[len(src):]] = data
        for d in [d for d in self.dirs if d == src or d.startswith(src + "/")]:
            self.dirs.discard(d)
            if not keep:
                self.dirs.add(dst + d[len(src):])

    def do_dlopen(self, op, i):
        """What ld.so does with a shared object: map it executable."""
        fd = os.open(self.path(op["path"]), os.O_RDONLY | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            data = b""
            if size:
                with mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE,
                               prot=mmap.PROT_READ | mmap.PROT_EXEC) as m:
                    data = bytes(m)
            self.compare(op["path"], data, "mmap")
        finally:
            os.close(fd)

    def do_flock(self, op, i):
        if op.get("operation") == ["LOCK_UN"]:
            return
        fd = os.open(self.path(op["path"]), os.O_RDONLY | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, open_flags_lock(op.get("operation", ["LOCK_EX"])))
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def do_truncate(self, op, i):
        os.truncate(self.path(op["path"]), op["length"])
        data = self.files.get(op["path"], b"")
        self.files[op["path"]] = data[:op["length"]].ljust(op["length"], b"\0")

    def do_chmod(self, op, i):
        os.chmod(self.path(op["path"]), op["mode"])

    # -- the model ------------------------------------------------------------------
    def compare(self, rel, data, how):
        want = self.files.get(rel)
        if want is None:
            raise ReplayError(f"{how} {rel}: the file is there, the replay made none")
        if data != want:
            raise ReplayError(f"{how} {rel}: {len(data)} bytes, not the {len(want)} "
                              f"the replay wrote" + (" (same length)" if len(data) ==
                                                     len(want) else ""))

    def listing(self, rel):
        """Names the replay left in directory rel, sorted."""
        prefix = "" if rel == "." else rel + "/"
        names = {p[len(prefix):].split("/")[0] for p in list(self.files) + list(self.dirs)
                 if p.startswith(prefix) and p != rel}
        return sorted(names)

    def check(self):
        """The tree at the end: each file with its bytes, no temporary left,
        nothing else. Returns {dir: sorted names} for comparing replays."""
        left = sorted(p for p in self.renamed_away
                      if p not in self.files and os.path.lexists(self.path(p)))
        if left:
            raise ReplayError(f"temporary files left: {left}")
        tree = listings(self.root)
        want_dirs = {"."} | self.dirs | {os.path.dirname(p) or "." for p in self.files}
        if set(tree) != want_dirs:
            raise ReplayError(f"directories: extra {sorted(set(tree) - want_dirs)}, "
                              f"missing {sorted(want_dirs - set(tree))}")
        for d in tree:
            if tree[d] != self.listing(d):
                raise ReplayError(f"{d}: lists {tree[d]}, the replay made {self.listing(d)}")
        for rel in sorted(self.files):
            with open(self.path(rel), "rb") as f:
                self.compare(rel, f.read(), "read at the end")
        return tree


def open_flags_lock(names):
    flags = 0
    for name in names:
        flags |= getattr(fcntl, name, 0)
    return flags


def read_fd(fd):
    chunks = []
    while True:
        b = os.read(fd, 1 << 20)
        if not b:
            return b"".join(chunks)
        chunks.append(b)


def listings(root):
    """{dir relative to root: sorted names in it}, for every directory."""
    out = {}
    for d, dirs, files in os.walk(root):
        out[os.path.relpath(d, root)] = sorted(dirs + files)
    return out


def replay(traces, root, first_stays=False):
    """Replays each trace (a list of ops) in order into root; returns the
    Replay, checked."""
    r = Replay(root, first_stays)
    for name, ops in traces:
        r.run(ops, name)
    r.tree = r.check()
    return r


def main(argv):
    first_stays = "--first-stays" in argv
    args = [a for a in argv if a != "--first-stays"]
    if len(args) < 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    traces = [(os.path.basename(p), load(p)) for p in args[:-1]]
    os.makedirs(args[-1], exist_ok=True)
    there = replay(traces, args[-1], first_stays)
    with tempfile.TemporaryDirectory(prefix="cache-replay.") as local:
        here = replay(traces, local)
    if there.tree != here.tree:
        diff = sorted(d for d in set(there.tree) | set(here.tree)
                      if there.tree.get(d) != here.tree.get(d))
        print(f"listings differ from a local replay's in {diff}", file=sys.stderr)
        return 1
    print(f"replayed {sum(there.counts.values())} ops {there.counts} into {args[-1]}: "
          f"{len(there.files)} files in {len(there.tree)} directories, as a local replay")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
