# SPDX-License-Identifier: Apache-2.0
"""The write-once tree .cache/ (DESIGN.md §9) against what torch.compile
(Inductor) and Triton really do to their cache directories: the traces in
tests/cache/ (recorded on the GPU host by tests/cache/record_ops.py),
replayed by cache_replay.py."""
import os
import subprocess
import sys

import pytest

from cache_replay import ReplayError, load, replay

TRACES = [(name, load(os.path.join(os.path.dirname(__file__), "..", "cache", name)))
          for name in ("inductor_triton_cold.jsonl", "inductor_triton_warm.jsonl")]


def cache_root(m):
    root = m.path(".cache")
    assert os.path.isdir(root), "the daemon serves no .cache/ directory (DESIGN.md §9)"
    return root


def local_root(tmp_path):
    root = tmp_path / "local"
    root.mkdir()
    return str(root)


def test_inductor_and_triton_traces_replay_in_cache(mnt, tmp_path):
    """Cold then warm: every op gets the result it got on a local disk,
    each file reads back as written (mapped executable for a dlopen), no
    temporary is left, and each directory lists what a local replay's
    does; also after a restart of the daemon."""
    there = replay(TRACES, cache_root(mnt), first_stays=True)
    here = replay(TRACES, local_root(tmp_path))
    assert there.tree == here.tree
    assert there.counts == here.counts
    mnt.restart()
    assert there.check() == here.tree


def test_shared_object_written_as_tools_do_loads_from_cache(mnt, tmp_path):
    """A .so cached as Triton caches its launcher (write a temporary name,
    close, os.replace onto the final name) is dlopen'ed from the mount."""
    src, so = tmp_path / "x.c", tmp_path / "x.so"
    src.write_text("int answer(void) { return 42; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(so), str(src)], check=True, timeout=60)
    data = so.read_bytes()
    d = os.path.join(cache_root(mnt), "so")
    os.makedirs(d, exist_ok=True)
    tmp, final = os.path.join(d, f"x.so.{os.getpid()}.tmp"), os.path.join(d, "x.so")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        assert os.write(fd, data) == len(data)
    finally:
        os.close(fd)
    os.replace(tmp, final)
    assert os.listdir(d) == ["x.so"]
    with open(final, "rb") as f:
        assert f.read() == data
    # in a child, so that no mapping of the mount outlives the call
    call = "import ctypes, sys; print(ctypes.CDLL(sys.argv[1]).answer())"
    out = subprocess.run([sys.executable, "-c", call, final], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "42", out.stderr


# The replayer itself, on a local directory: its checks can fail.

def test_replay_on_a_local_directory_passes_and_checks(tmp_path):
    r = replay(TRACES, local_root(tmp_path))
    assert r.counts["rename"] == 93 and r.counts["dlopen"] == 4
    assert len(r.files) == 93
    some = sorted(r.files)[0]
    with open(os.path.join(r.root, some), "r+b") as f:  # one byte flipped
        b = f.read(1)
        f.seek(0)
        f.write(bytes([b[0] ^ 1]))
    with pytest.raises(ReplayError, match="bytes"):
        r.check()


def test_replay_finds_a_temporary_left_behind(tmp_path):
    r = replay(TRACES[:1], local_root(tmp_path))
    temporary = min(p for p in r.renamed_away if p.startswith("inductor/"))
    open(os.path.join(r.root, temporary), "wb").close()  # its directory stays
    with pytest.raises(ReplayError, match="temporary files left"):
        r.check()


def test_replay_refuses_results_other_than_recorded(tmp_path):
    root = local_root(tmp_path)
    replay(TRACES, root)
    with pytest.raises(ReplayError, match="EEXIST, recorded ok"):
        replay(TRACES, root)


@pytest.mark.parametrize("kill_after", [0.0, 0.02, 0.05])
def test_the_traces_replay_alike_across_daemon_kills(mnt, tmp_path, kill_after):
    """The recorded cold and warm traces replayed while the daemon is
    killed (kill -9) 6 times, each kill_after seconds after the one before
    began to serve: every op gets the result it got on a local disk, and
    the tree ends as the local one (the tool never sees a crash)."""
    import threading
    import time
    done = threading.Event()
    kills = []

    def killer():
        pid = mnt.daemon_pid()
        while len(kills) < 6 and not done.wait(kill_after):
            os.kill(pid, 9)
            kills.append(pid)
            pid = mnt.wait_daemon_other_than(pid)
            # serving (a daemon killed before it serves makes the holder
            # pause before the next: a crash loop, not what this tests)
            assert mnt.wait_log(f"(daemon {pid}, after a crash", timeout=60), mnt.log()
    t = threading.Thread(target=killer)
    t.start()
    try:
        there = replay(TRACES, cache_root(mnt), first_stays=True)
    finally:
        done.set()
        t.join()
    here = replay(TRACES, local_root(tmp_path))
    assert kills, "the replay ended before the first kill"
    assert there.tree == here.tree
    assert there.counts == here.counts
    assert there.check() == here.tree
