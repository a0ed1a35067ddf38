# SPDX-License-Identifier: Apache-2.0
"""GPU weights outlive the daemon (DESIGN.md §8, issue #27): slabs are CUDA
VMM allocations whose descriptors the holder keeps; an engine attached
before a crash computes on, the next daemon serves every loaded version
without reading a checkpoint, new engines attach (also unprivileged, also
from other PID and network namespaces), and unload still frees the
memory once the engines are gone."""
import os
import shutil
import subprocess
import sys
import time

from conftest import HERE, MOUNT, artfsctl, engine, make_checkpoint, status
from test_rl import CK, rl, tiny_ckpt
from test_weights import finish, nvidia_used_mib, wait_for


def daemon_pid(holder):
    def one():
        with open(f"/proc/{holder}/task/{holder}/children") as f:
            kids = f.read().split()
        return int(kids[0]) if len(kids) == 1 else None
    assert wait_for(lambda: one() is not None, 30)
    return one()


def kill_daemon(holder):
    """SIGKILLs the serving daemon; returns once another one serves."""
    pid = daemon_pid(holder)
    os.kill(pid, 9)
    assert wait_for(lambda: daemon_pid(holder) != pid, 30)
    new = daemon_pid(holder)
    assert wait_for(lambda: os.path.exists(os.path.join(MOUNT, ".artfs", "metrics")), 30)
    return new


def read_bytes(pid):
    """What a process read from files and pipes so far (rchar)."""
    with open(f"/proc/{pid}/io") as f:
        return int(next(line for line in f if line.startswith("rchar:")).split()[1])


def test_engine_computes_through_five_daemon_kills(daemon):
    src = tiny_ckpt("tiny-r", 11)
    loaded = os.path.join(CK, "tiny-r-loaded")  # gone once loaded: nothing can read it again
    shutil.rmtree(loaded, ignore_errors=True)
    shutil.copytree(src, loaded)
    artfsctl("load", "t-r", loaded, "--gpus", "0")
    manifest = open(os.path.join(MOUNT, "t-r", "weights", "manifest.json")).read()
    shutil.rmtree(loaded)
    watcher = rl("watch", MOUNT, "t-r", src, stdin=subprocess.PIPE)
    assert watcher.stdout.readline().strip() == "READY", watcher.stderr.read()
    attach_s = []
    for kill in range(5):
        pid = kill_daemon(daemon.proc.pid)
        st = status("t-r")
        assert st and st["state"] == "ready" and st.get("taken_over", "").startswith("yes"), st
        assert open(os.path.join(MOUNT, "t-r", "weights", "manifest.json")).read() == manifest
        out = finish(rl("attach", MOUNT, "t-r", src))
        attach_s.append(float(out.split()[1]))
        assert read_bytes(pid) < 64 << 20, "a daemon that took over read more than requests"
        assert watcher.poll() is None, watcher.stderr.read()
    watcher.stdin.write("quit\n")
    watcher.stdin.flush()
    out = finish(watcher)
    bye, passes, wrong = out.split()
    assert bye == "BYE" and int(passes) > 0 and int(wrong) == 0, out
    print(f"attach after each of 5 kills: {', '.join(f'{s:.3f}' for s in attach_s)} s; "
          f"{passes} forward passes through them, all bit-identical")
    artfsctl("unload", "t-r")


def test_unload_after_kills_frees_the_memory(daemon, hf8):
    """8 GiB loaded, two daemon kills, an engine attaches and compares; unload
    once it is gone gives the GPU memory back (the holder let go of it)."""
    before = nvidia_used_mib(0)
    artfsctl("load", "hf-r", hf8, "--gpus", "0")
    loaded = nvidia_used_mib(0)
    assert loaded > before + 7 * 1024, (before, loaded)
    for _ in range(2):
        pid = kill_daemon(daemon.proc.pid)
    assert finish(engine("compare", MOUNT, "hf-r", "0", hf8)).startswith("OK")
    assert read_bytes(pid) < 64 << 20
    artfsctl("unload", "hf-r")
    assert wait_for(lambda: nvidia_used_mib(0) < before + 512, 60), (before, nvidia_used_mib(0))


def test_unprivileged_and_namespaced_engines_attach(daemon):
    src = tiny_ckpt("tiny-u", 12)
    if status("t-u") is None:
        artfsctl("load", "t-u", src, "--gpus", "0")
    kill_daemon(daemon.proc.pid)  # the daemon that serves them took over
    # The engine as nobody reads the checkpoint for its fingerprint and ref.pt.
    for path in (CK, src):
        os.chmod(path, 0o755)
    for name in os.listdir(src):
        os.chmod(os.path.join(src, name), 0o644)
    env = dict(os.environ, HOME="/tmp", PYTHONPATH=os.pathsep.join(
        [os.path.join(HERE, "..", "..", "contrib", "python"), HERE]))
    script = [sys.executable, os.path.join(HERE, "rl.py"), "attach", MOUNT, "t-u", src]
    nobody = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                             *script], capture_output=True, text=True, env=env)
    assert nobody.returncode == 0 and nobody.stdout.startswith("ATTACHED"), nobody.stderr
    # Its own PID and network namespaces: the socket is found by its path.
    apart = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "--net", *script], capture_output=True,
                           text=True, env=env)
    assert apart.returncode == 0 and apart.stdout.startswith("ATTACHED"), apart.stderr
    artfsctl("unload", "t-u")


def test_preloaded_weights_are_taken_over_not_loaded_again(tmp_path):
    """weights.<wv> = dir in config=: a daemon that takes over serves the
    preloaded version from the holder's descriptors; it neither reads the
    checkpoint again nor allocates a second copy, and logs no error."""
    import conftest
    small = make_checkpoint("small", 0.1, "--files", "2", "--seed", "5")
    conf = tmp_path / "artfs.conf"
    conf.write_text(f"ttl = 0\nweights.pre = {small}\n")
    mnt, store, log = str(tmp_path / "mnt"), str(tmp_path / "store"), tmp_path / "daemon.log"
    os.makedirs(mnt)
    proc = subprocess.Popen([os.path.join(conftest.BUILD, "artfs"), "-f", "-o",
                             f"store={store},config={conf}", mnt],
                            stdout=open(log, "w"), stderr=subprocess.STDOUT)
    try:
        st = os.path.join(mnt, "pre", "weights", "status")
        assert wait_for(lambda: os.path.exists(st) and "state = ready" in open(st).read(), 120)
        pid = daemon_pid(proc.pid)
        os.kill(pid, 9)
        assert wait_for(lambda: daemon_pid(proc.pid) != pid, 30)
        new = daemon_pid(proc.pid)
        text = open(st).read()
        assert "state = ready" in text and "taken_over = yes" in text, text
        assert finish(engine("compare", mnt, "pre", "0", small)).startswith("OK")
        time.sleep(3)  # past the taken-over daemon's warm-up delay
        assert read_bytes(new) < 64 << 20
        out = log.read_text()
        after = out.split("died", 1)[-1]
        assert "died" in out and "config: weights.pre" not in out, out
        assert "weights pre: loading" not in after, after
    finally:
        subprocess.run(["umount", mnt])
        proc.wait(timeout=60)
