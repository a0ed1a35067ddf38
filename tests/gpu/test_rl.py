# SPDX-License-Identifier: Apache-2.0
"""New versions while serving (DESIGN.md §4.3, issue #10): ENOMEM at once
with attached versions untouched, artfs.torch.bind of a real module, a flip
while an engine runs, v1 freed, GPU-direct publish on one GPU and across."""
import os
import subprocess
import sys
import time

import pytest
import torch

from conftest import GPUS, HERE, MOUNT, artfsctl, engine, make_checkpoint, status
from test_weights import finish, wait_for

CK = os.environ.get("ARTFS_CKPT", "/tmp/artfs-ckpt")


def rl(*args, stdin=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(HERE, "..", "..", "contrib", "python"), HERE])
    return subprocess.Popen([sys.executable, os.path.join(HERE, "rl.py"), *args], stdin=stdin,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def tiny_ckpt(name, seed):
    d = os.path.join(CK, name)
    if not os.path.exists(os.path.join(d, "ref.pt")):
        finish(rl("save", d, str(seed)))
        finish(rl("reference", d))
    return d


def test_new_version_without_room_is_enomem_at_once(daemon, hf8):
    small = make_checkpoint("small", 0.1, "--files", "2", "--seed", "5")
    artfsctl("load", "nm-v1", small, "--gpus", "0")
    e = engine("hold", MOUNT, "nm-v1", "0", small, stdin=subprocess.PIPE)
    assert e.stdout.readline().strip() == "READY"
    free, _ = torch.cuda.mem_get_info(0)
    filler = torch.empty(free - (1 << 30), dtype=torch.uint8, device="cuda:0")  # 1 GiB left
    try:
        t0 = time.perf_counter()
        r = artfsctl("load", "nm-v2", hf8, "--gpus", "0", check=False)
        took = time.perf_counter() - t0
        assert r.returncode == 1 and "memory" in r.stderr.lower(), r
        assert took < 2, took
        assert status("nm-v2") is None
    finally:
        del filler
        torch.cuda.empty_cache()
    assert status("nm-v1")["attached"] == "1" and status("nm-v1")["state"] == "ready"
    e.stdin.write("close\n")
    e.stdin.flush()
    finish(e)
    assert finish(engine("compare", MOUNT, "nm-v1", "0", small)).startswith("OK")
    artfsctl("unload", "nm-v1")


def test_bind_flip_while_serving_and_v1_freed(daemon):
    v1, v2 = tiny_ckpt("tiny-v1", 1), tiny_ckpt("tiny-v2", 2)
    artfsctl("load", "t-v1", v1, "--gpus", "0")
    artfsctl("load", "t-v2", v2, "--gpus", "0")
    s = rl("serve", MOUNT, "t-v1", v1, stdin=subprocess.PIPE)
    line = s.stdout.readline()
    assert line.strip() == "READY", line + s.stderr.read()
    assert status("t-v1")["attached"] == "1"
    time.sleep(0.5)
    s.stdin.write(f"flip t-v2 {v2}\n")
    s.stdin.flush()
    got = s.stdout.readline().split()
    assert got[:2] == ["FLIPPED", "True"], got
    # v1's attachment closed once nothing used it: unload frees it at once.
    assert wait_for(lambda: status("t-v1")["attached"] == "0", 10), status("t-v1")
    assert status("t-v2")["attached"] == "1"
    artfsctl("unload", "t-v1")
    s.stdin.write("quit\n")
    s.stdin.flush()
    out = finish(s)
    assert "BYE" in out
    artfsctl("unload", "t-v2")


def test_bind_refuses_mismatches_listing_names():
    code = ("import torch, artfs.torch\n"
            "m = torch.nn.Linear(4, 3)\n"
            "w = {'weight': torch.zeros(3, 4), 'bias': torch.zeros(2), 'extra': torch.zeros(1)}\n"
            "try:\n    artfs.torch.bind(m, w)\nexcept artfs.torch.BindError as e:\n"
            "    print(sorted(e.names))\n")
    env = dict(os.environ, PYTHONPATH=os.path.join(HERE, "..", "..", "contrib", "python"))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.stdout.strip() == "['bias', 'extra']", r.stdout + r.stderr


@pytest.mark.parametrize("target", ["same", "other"])
def test_gpu_direct_publish_from_a_trainer(daemon, tmp_path, target):
    if target == "other" and GPUS < 2:
        pytest.skip("needs two GPUs")
    wv = f"pub-{target}"
    f = str(tmp_path / "src.safetensors")
    t = rl("trainer", MOUNT, wv, "0", "-1" if target == "same" else "1", "3", f)
    out = finish(t)
    assert "PUBLISHED" in out, out
    st = status(wv)
    assert st["state"] == "ready" and st["source"].startswith("gpu-direct from GPU "), st
    assert st["gpus"] == ("0" if target == "same" else "1"), st
    assert finish(rl("compare", MOUNT, wv, f)).startswith("OK"), st
    artfsctl("unload", wv)
