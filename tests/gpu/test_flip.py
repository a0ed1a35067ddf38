# SPDX-License-Identifier: Apache-2.0
"""Flip in place (DESIGN.md §4.3, issue #38): an HF Llama bound in place, a
CUDA graph of its forward captured on v1, flips to versions published
GPU-direct by a trainer process: the same graph replays each version's
eager logits, no data_ptr() changes, v1 freed by the flip, no memory
allocated by it, 100 flips under a replay loop, a daemon kill -9 between two
flips, another layout refused; the same tensors loaded from disk and
published GPU-direct have one layout; ranks of a tensor-parallel version
flip independently; tied tensors stay tied."""
import errno
import json
import os
import queue
import subprocess
import sys
import threading
import time

from conftest import BUILD, HERE, MOUNT, artfsctl
from flip import smi_used_mib
from test_rl import rl
from test_weights import finish


def flip(*args, stdin=None, stderr=subprocess.PIPE):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(HERE, "..", "..", "contrib", "python"), HERE])
    return subprocess.Popen([sys.executable, os.path.join(HERE, "flip.py"), *args], stdin=stdin,
                            stdout=subprocess.PIPE, stderr=stderr, text=True, env=env)


class Rank:
    """flip.py rank: one rank of a tensor-parallel engine, a command a line;
    each answer waited for at most `timeout` seconds."""

    def __init__(self, wv, rank, tmp_path):
        self.err = open(tmp_path / f"rank{rank}.err", "w+")
        self.p = flip("rank", MOUNT, wv, str(rank), stdin=subprocess.PIPE, stderr=self.err)
        self.lines = queue.Queue()
        threading.Thread(target=lambda: [self.lines.put(ln) for ln in self.p.stdout], daemon=True).start()

    def send(self, command):
        self.p.stdin.write(command + "\n")
        self.p.stdin.flush()

    def answer(self, timeout=120):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                line = self.lines.get(timeout=max(0.1, end - time.monotonic()))
            except queue.Empty:
                break
            if line.startswith("RESULT "):
                return json.loads(line[7:])
        self.err.seek(0)
        raise AssertionError(f"rank engine: no answer in {timeout} s (exit {self.p.poll()}): "
                             f"{self.err.read()[-3000:]}")

    def ask(self, command):
        self.send(command)
        return self.answer()

    def quit(self):
        if self.p.poll() is None:
            self.send("quit")
            try:
                self.p.wait(60)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.err.close()


def layout(wv):
    with open(os.path.join(MOUNT, wv, "weights", "manifest.json")) as f:
        return json.load(f)["ranks"][0]["layout"]


def results(out):
    return {r["step"]: r for r in (json.loads(line[7:]) for line in out.splitlines()
                                   if line.startswith("RESULT "))}


def test_flip_in_place_of_an_hf_llama(daemon, tmp_path):
    disk = str(tmp_path / "a")
    finish(flip("trainer", MOUNT, f"fl-a:1:4:{disk}", "fl-b:2:4", "fl-a2:1:4", "fl-o:3:3"))
    artfsctl("load", "fl-ad", disk, "--gpus", "0")
    # One layout for the same tensors, loaded from disk or published GPU-direct.
    assert layout("fl-a") == layout("fl-b") == layout("fl-a2") == layout("fl-ad")
    assert layout("fl-o") != layout("fl-a")
    artfsctl("unload", "fl-ad")
    e = flip("engine", MOUNT, str(daemon.proc.pid), os.path.join(BUILD, "artfsctl"),
             "fl-a", "fl-b", "fl-a2", "fl-o")
    out = finish(e)
    print(out)
    r = results(out)
    assert r["bind"]["graph_is_eager"], r["bind"]
    f = r["flip"]
    assert f["graph_is_eager"] and f["differs_from_a"] and f["same_ptrs"], f
    assert f["extra_during_mib"] < 64 and f["allocated_delta"] == 0, f  # no memory of the engine's
    assert f["freed_mib"] >= f["slab_mib"] - 64, f                       # v1 went with the flip
    n = r["flips"]
    assert n["wrong"] == 0 and not n["errors"] and n["replays"] > 100 and n["a2_is_a"], n
    assert r["kill"]["right"], r["kill"]
    o = r["other"]
    assert o["refused"] and "layout" in o["message"] and "bind" in o["message"] and o["intact"], o
    for wv in ("fl-b", "fl-a2", "fl-o"):
        artfsctl("unload", wv)


def test_engines_flip_and_attach_at_once_while_a_trainer_publishes(daemon):
    """3 engines bound in place flip back and forth (30 rounds each) while
    another process attaches and binds every version, and a trainer
    publishes a third version GPU-direct meanwhile, which all of them then
    take: every replay and forward is that version's trainer's logits, no
    data_ptr() moves."""
    finish(flip("trainer", MOUNT, "fm-a:11:4", "fm-b:12:4"))
    procs = [flip("many", MOUNT, "fm-a,fm-b", "fm-c", "30") for _ in range(3)]
    procs.append(flip("attacher", MOUNT, "fm-a,fm-b", "fm-c", "10"))
    time.sleep(3)  # the engines bound and flipping
    finish(flip("trainer", MOUNT, "fm-c:13:4"))
    outs = [results(finish(p)) for p in procs]
    print(outs)
    for r in outs[:3]:
        m = r["many"]
        assert m["flips"] == 61 and m["wrong"] == [] and m["late_right"] and m["same_ptrs"], m
    a = outs[3]["attacher"]
    assert a["binds"] == 21 and a["wrong"] == [], a
    for wv in ("fm-a", "fm-b", "fm-c"):
        artfsctl("unload", wv)


def rank_slab_mib(wv, rank):
    with open(os.path.join(MOUNT, wv, "weights", "manifest.json")) as f:
        return sum(s["size"] for s in json.load(f)["ranks"][rank]["slabs"]) / (1 << 20)


def test_ranks_of_a_tensor_parallel_version_flip_independently(daemon, tmp_path):
    """Two ranks of a tensor-parallel version (both on GPU 0 here, one
    engine process each), bound in place: one flips while the other
    replays the old version, at once; an unload frees the old version's
    slab of the rank that left it and keeps the other's until that rank
    flips too; both flip at once on cadences of their own; a version of
    another tensor-parallel size is refused (the rank it lacks: ENOENT,
    the rank it has: ESTALE), the version in place kept."""
    finish(flip("trainer-tp", MOUNT, "2", "tp-a:21:4", "tp-b:22:4", "tp-c:23:4"))
    finish(flip("trainer", MOUNT, "tp-one:24:4"))
    assert layout("tp-a") == layout("tp-b") == layout("tp-one")
    ranks = [Rank("tp-a", r, tmp_path) for r in (0, 1)]
    try:
        assert all(k.answer(300)["right"] for k in ranks)
        ranks[1].send("spin 3")
        time.sleep(0.5)  # rank 1 replaying
        f0 = ranks[0].ask("flip tp-b")
        s1 = ranks[1].answer()
        assert f0["right"] and f0["same_ptrs"], f0
        assert s1["on"] == "tp-a" and s1["wrong"] == 0 and s1["replays"] > 10, s1

        used0 = smi_used_mib()
        artfsctl("unload", "tp-a")
        time.sleep(1)
        used1 = smi_used_mib()
        slab0, slab1 = rank_slab_mib("tp-b", 0), rank_slab_mib("tp-b", 1)
        # Rank 0 left tp-a: its slab is free; rank 1 still maps its own.
        assert slab0 - 64 <= used0 - used1 < slab0 + slab1 - 64, (used0, used1, slab0, slab1)
        s1 = ranks[1].ask("spin 1")
        assert s1["on"] == "tp-a" and s1["wrong"] == 0, s1

        ranks[0].send("spin 3")
        time.sleep(0.5)
        f1 = ranks[1].ask("flip tp-b")
        s0 = ranks[0].answer()
        assert f1["right"] and f1["same_ptrs"], f1
        assert s0["on"] == "tp-b" and s0["wrong"] == 0 and s0["replays"] > 10, s0
        time.sleep(1)
        used2 = smi_used_mib()
        assert used1 - used2 >= slab1 - 64, (used1, used2, slab1)  # rank 1's tp-a went with its flip

        ranks[0].send("storm tp-c,tp-b 41")
        ranks[1].send("storm tp-c,tp-b,tp-b 30")
        st = [k.answer(300) for k in ranks]
        assert st[0]["on"] == "tp-c" and st[1]["on"] == "tp-b", st
        assert all(r["wrong"] == [] and r["same_ptrs"] for r in st), st

        lacks = ranks[1].ask("try tp-one")
        other = ranks[0].ask("try tp-one")
        assert lacks["errno"] == errno.ENOENT and "no rank 1" in lacks["message"], lacks
        assert other["errno"] == errno.ESTALE and "tp_size 1" in other["message"], other
        assert lacks["intact"] and other["intact"] and lacks["same_ptrs"] and other["same_ptrs"]
    finally:
        for k in ranks:
            k.quit()
    for wv in ("tp-b", "tp-c", "tp-one"):
        artfsctl("unload", wv)


def test_tied_tensors_stay_tied(daemon, tmp_path):
    f1, f2 = str(tmp_path / "t1.safetensors"), str(tmp_path / "t2.safetensors")
    finish(rl("trainer", MOUNT, "ft-1", "0", "-1", "3", f1))
    finish(rl("trainer", MOUNT, "ft-2", "0", "-1", "4", f2))
    assert layout("ft-1") == layout("ft-2")
    r = results(finish(flip("tied", MOUNT, "ft-1", f1, "ft-2", f2)))
    assert r["tied"]["v1"] and r["tied"]["v2"], r
    artfsctl("unload", "ft-1")
    artfsctl("unload", "ft-2")


def test_libartfs_flip(daemon, tmp_path):
    """bench/flip_bench: libartfs's attach in place and flip, from C."""
    import torch
    from safetensors.torch import save_file
    dirs = {}
    for wv, seed, extra in (("fc-1", 1, False), ("fc-2", 2, False), ("fc-o", 3, True)):
        g = torch.Generator().manual_seed(seed)
        t = {"a.weight": torch.randn(1024, 1024, generator=g).to(torch.bfloat16),
             "b.weight": torch.randn(4096, generator=g)}
        if extra:
            t["c.weight"] = torch.zeros(8)
        d = tmp_path / wv
        d.mkdir()
        save_file(t, str(d / "model.safetensors"))
        dirs[wv] = (str(d), t)
        artfsctl("load", wv, str(d), "--gpus", "0")
    r = subprocess.run([os.path.join(BUILD, "flip_bench"), MOUNT, dirs["fc-1"][0], "fc-1", "fc-2",
                        "fc-o", dirs["fc-o"][0], "20"], capture_output=True, text=True)
    print(r.stdout, r.stderr)
    assert r.returncode == 0, r.stderr
    lines = {ln.split()[0]: ln.split()[1:] for ln in r.stdout.splitlines()}
    name, at, sum1 = lines["ATTACHED"]

    def bsum(wv):
        return int(dirs[wv][1][name].contiguous().view(torch.uint8).sum())

    assert int(sum1) == bsum("fc-1")
    flipped = [ln.split() for ln in r.stdout.splitlines() if ln.startswith("FLIPPED")]
    assert [f[1] for f in flipped] == ["fc-2", "fc-1"] and all(f[2] == at for f in flipped)
    assert int(flipped[0][3]) == bsum("fc-2") and int(flipped[1][3]) == bsum("fc-1")
    assert "same address 1" in r.stdout
    assert lines["OTHER"][0] == str(18) and "layout" in " ".join(lines["OTHER"])  # EXDEV
    assert int(lines["INTACT"][0]) == bsum("fc-1")  # 20 flips end on fc-1; the refusal kept it
    for wv in dirs:
        artfsctl("unload", wv)
