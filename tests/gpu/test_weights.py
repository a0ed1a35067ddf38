# SPDX-License-Identifier: Apache-2.0
"""GPU weights on a GPU host (DESIGN.md §4): load, attach from another
process, compare with safetensors, and every error and lifetime rule."""
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from conftest import BUILD, GPUS, MOUNT, artfsctl, engine, is_mounted, make_checkpoint, status


def nvidia_used_mib(gpu):
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                          "-i", str(gpu)], capture_output=True, text=True, check=True).stdout
    return int(out.strip())


def wait_for(cond, timeout=60, step=0.1):
    end = time.time() + timeout
    while time.time() < end:
        if cond():
            return True
        time.sleep(step)
    return cond()


def finish(proc, timeout=600):
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"engine failed:\n{out}\n{err}"
    return out


def test_hf_checkpoint_attaches_byte_identical(daemon, hf8):
    r = artfsctl("load", "hf", hf8, "--gpus", "0")
    assert "ready" in r.stdout
    st = status("hf")
    assert st["state"] == "ready" and st["bytes_done"] == st["bytes_total"]
    with open(os.path.join(MOUNT, "hf", "weights", "manifest.json")) as f:
        m = json.load(f)
    r0 = m["ranks"][0]
    assert r0["slabs"][0]["size"] % (2 << 20) == 0
    assert all(t["offset"] % 256 == 0 for t in r0["tensors"].values())
    assert m["layout"] == "huggingface" and r0["fingerprint"]["dtypes"] == "BF16,F16,F32,F8_E4M3"
    out = finish(engine("compare", MOUNT, "hf", "0", hf8))
    assert out.startswith("OK")


def test_attach_through_libartfs(daemon, hf8):
    """The C client (libartfs, as bench/attach_bench links it) attaches too."""
    if status("hf") is None:
        artfsctl("load", "hf", hf8, "--gpus", "0")
    r = subprocess.run([os.path.join(BUILD, "attach_bench"), MOUNT, "hf", hf8, "0", "1", "2"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def test_sharded_checkpoint_each_rank(daemon, sharded):
    ranks = min(GPUS, 2)
    artfsctl("load", "sharded", sharded)
    assert status("sharded")["state"] == "ready"
    for r in range(ranks):
        assert finish(engine("compare", MOUNT, "sharded", str(r), sharded)).startswith("OK")


@pytest.mark.parametrize("field", ["revision", "tp_size", "architecture"])
def test_fingerprint_mismatch_is_estale(daemon, hf8, field):
    if status("hf") is None:
        artfsctl("load", "hf", hf8, "--gpus", "0")
    assert finish(engine("errno", MOUNT, "hf", "0", hf8, field)).strip() == "ESTALE"


def test_quantization_allowlist(daemon):
    gptq = make_checkpoint("gptq", 0.05, "--quant", "gptq", "--files", "1")
    fp8 = make_checkpoint("fp8block", 0.05, "--quant", "fp8", "--block-fp8", "--files", "1")
    artfsctl("load", "gptq", gptq, "--gpus", "0")
    artfsctl("load", "fp8", fp8, "--gpus", "0")
    assert finish(engine("errno", MOUNT, "gptq", "0", gptq, "none")).strip() == "EOPNOTSUPP"
    assert finish(engine("errno", MOUNT, "fp8", "0", fp8, "none")).strip() == "OK"


def test_attach_while_loading_is_eagain(daemon, hf8):
    # The engine is up first; the files are evicted so the load takes a while.
    e = engine("errno", MOUNT, "hf-eagain", "0", hf8, "none", stdin=subprocess.PIPE,
               ARTFS_WAIT_STDIN="1")
    assert e.stdout.readline().strip() == "READY"
    for n in os.listdir(hf8):
        fd = os.open(os.path.join(hf8, n), os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    artfsctl("load", "hf-eagain", hf8, "--gpus", "0", "--no-wait")
    e.stdin.write("go\n")
    e.stdin.flush()
    got = finish(e).strip().splitlines()[-1]
    assert got == "EAGAIN", got
    assert wait_for(lambda: status("hf-eagain")["state"] == "ready", 300)
    artfsctl("unload", "hf-eagain")


def test_killed_engine_releases_its_attachment(daemon, hf8):
    if status("hf") is None:
        artfsctl("load", "hf", hf8, "--gpus", "0")
    e = engine("hold", MOUNT, "hf", "0", hf8, stdin=subprocess.PIPE)
    assert e.stdout.readline().strip() == "READY"
    assert status("hf")["attached"] == "1"
    e.kill()
    e.wait()
    assert wait_for(lambda: status("hf")["attached"] == "0", 30)


def test_unload_frees_gpu_memory_after_the_last_close(daemon, hf8):
    artfsctl("load", "hf-unload", hf8, "--gpus", "0")
    e = engine("hold", MOUNT, "hf-unload", "0", hf8, stdin=subprocess.PIPE)
    assert e.stdout.readline().strip() == "READY"
    before = nvidia_used_mib(0)
    artfsctl("unload", "hf-unload")
    assert not os.path.exists(os.path.join(MOUNT, "hf-unload", "weights"))
    time.sleep(2)
    still = nvidia_used_mib(0)
    assert still > before - 1024, (before, still)  # attached: not freed
    e.stdin.write("close\n")
    e.stdin.flush()
    finish(e)
    assert wait_for(lambda: nvidia_used_mib(0) < still - 7 * 1024, 60), (still, nvidia_used_mib(0))


def test_loads_side_by_side_beside_attaches(daemon, hf8):
    """Four loads at once from separate processes, from the page cache and
    from tmpfs (one load takes the daemon's pinned buffers, the others pin
    their own; each file's read size follows where its pages are), while two
    engines attach and compare a version loaded before: every version
    byte-identical to its files."""
    if status("hf") is None:
        artfsctl("load", "hf", hf8, "--gpus", "0")
    shm = "/dev/shm/artfs-gpu-side-by-side"
    shutil.rmtree(shm, ignore_errors=True)
    shutil.copytree(hf8, shm)
    sources = {"side0": hf8, "side1": shm, "side2": hf8, "side3": shm}
    try:
        engines = [engine("compare", MOUNT, "hf", "0", hf8) for _ in range(2)]
        loads = {wv: subprocess.Popen([os.path.join(BUILD, "artfsctl"), "-m", MOUNT, "load", wv, src,
                                       "--gpus", "0"], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True)
                 for wv, src in sources.items()}
        for wv, p in loads.items():
            out, err = p.communicate(timeout=600)
            assert p.returncode == 0, (wv, out, err)
        for e in engines:
            assert finish(e).startswith("OK")
        for wv, src in sources.items():
            st = status(wv)
            assert st["state"] == "ready" and st["bytes_done"] == st["bytes_total"], (wv, st)
            assert finish(engine("compare", MOUNT, wv, "0", src)).startswith("OK"), wv
    finally:
        for wv in sources:
            artfsctl("unload", wv, check=False)
        shutil.rmtree(shm, ignore_errors=True)


@pytest.mark.skipif(GPUS < 2, reason="needs two GPUs")
def test_replicated_load_reads_the_files_once(daemon, hf8):
    pid = daemon.proc.pid
    rchar = lambda: int(next(l.split()[1] for l in open(f"/proc/{pid}/io") if l.startswith("rchar")))
    before = rchar()
    artfsctl("load", "hf2", hf8, "--gpus", "0,1")
    read = rchar() - before
    st = status("hf2")
    data = int(st["bytes_total"])
    assert st["broadcast"] == "nccl", st
    assert int(st["bytes_done"]) == data
    assert data <= read < 1.1 * data, (read, data)  # once, not once per GPU
    for r in (0, 1):
        assert finish(engine("compare", MOUNT, "hf2", str(r), hf8)).startswith("OK")
    artfsctl("unload", "hf2")


def test_killed_daemon_is_seen_by_the_engine(daemon, hf8):
    if status("hf") is None:
        artfsctl("load", "hf", hf8, "--gpus", "0")
    e = engine("watch", MOUNT, "hf", "0", hf8)
    assert e.stdout.readline().strip() == "READY"
    daemon.kill()
    out = e.stdout.readline()
    assert out.startswith("DEAD ENOTCONN"), out + e.stderr.read()
    e.wait(timeout=30)
    daemon.start()


def test_preload_from_the_config_file_and_the_disk_fallback(tmp_path):
    """weights.<wv> = dir in config= loads at mount; without a mount the
    Python client loads the checkpoint from disk instead."""
    import conftest
    small = make_checkpoint("small", 0.1, "--files", "2", "--seed", "5")
    conf = tmp_path / "artfs.conf"
    conf.write_text(f"ttl = 0\nweights.pre = {small}\n")
    mnt, store = str(tmp_path / "mnt"), str(tmp_path / "store")
    os.makedirs(mnt)
    proc = subprocess.Popen([os.path.join(conftest.BUILD, "artfs"), "-f", "-o",
                             f"store={store},config={conf}", mnt],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        st = os.path.join(mnt, "pre", "weights", "status")
        assert wait_for(lambda: os.path.exists(st) and "state = ready" in open(st).read(), 120)
        e = engine("compare", mnt, "pre", "0", small)
        assert finish(e).startswith("OK")
    finally:
        subprocess.run(["umount", mnt])
        proc.wait(timeout=60)
    code = ("import artfs, torch\n"
            f"w = artfs.attach_weights('pre', 0, checkpoint_dir={small!r}, mount={mnt!r})\n"
            "assert all(t.is_cuda for t in w.values()) and len(w) > 0\n"
            "print('DISK', len(w))\n")
    env = dict(os.environ, PYTHONPATH=os.path.join(conftest.HERE, "..", "..", "contrib", "python"))
    r = subprocess.run([__import__("sys").executable, "-c", code], capture_output=True, text=True,
                       env=env)
    assert r.returncode == 0 and r.stdout.startswith("DISK"), r.stderr


def test_checkpoint_cut_short_while_loading(tmp_path):
    """A checkpoint in memory that shrinks while it loads (a trainer writing
    the same path again): the load fails naming the file, the daemon lives
    on and loads the next one. Such files are read out of a mapping
    (gpu/source.h), where a shrink faults (SIGBUS) instead of reading short.
    One reader thread, so that the load lasts long enough to be cut."""
    import conftest
    ckpt = "/dev/shm/artfs-cut"

    def make_cut():  # anew each time: a cut file stays cut
        shutil.rmtree(ckpt, ignore_errors=True)
        subprocess.run([sys.executable, os.path.join(conftest.HERE, "make_checkpoint.py"), ckpt, "4",
                        "--files", "1", "--seed", "11"], check=True)
        return [os.path.join(ckpt, f) for f in os.listdir(ckpt) if f.endswith(".safetensors")]

    files = make_cut()
    small = make_checkpoint("small", 0.1, "--files", "2", "--seed", "5")
    mnt, store = str(tmp_path / "mnt"), str(tmp_path / "store")
    os.makedirs(mnt)
    env = dict(os.environ, ARTFS_LOAD_READERS="1")
    proc = subprocess.Popen([os.path.join(conftest.BUILD, "artfs"), "-f", "-o", f"store={store}", mnt],
                            stdout=open(tmp_path / "artfs.log", "w"), stderr=subprocess.STDOUT, env=env)
    ctl = os.path.join(conftest.BUILD, "artfsctl")
    try:
        assert wait_for(lambda: is_mounted(mnt), 30)
        st = os.path.join(mnt, "cut", "weights", "status")
        outcomes = []
        for attempt in range(3):
            subprocess.run([ctl, "-m", mnt, "load", "cut", ckpt, "--gpus", "0", "--no-wait"], check=True)
            # Cut the file once some of it is loaded.
            assert wait_for(lambda: os.path.exists(st) and
                            int(dict(l.rstrip("\n").split(" = ", 1) for l in open(st)
                                     if " = " in l).get("bytes_done", "0")) > 0, 60, 0.002)
            os.truncate(files[0], os.path.getsize(files[0]) // 2)
            assert wait_for(lambda: "state = loading" not in open(st).read(), 120)
            text = open(st).read()
            error = [l for l in text.splitlines() if l.startswith("error = ")]
            outcomes.append(error[0] if "state = failed" in text else "ready")
            if "state = failed" in text:
                assert "shrank" in text or "changed since" in text, text
            subprocess.run([ctl, "-m", mnt, "unload", "cut"], check=True)
            assert proc.poll() is None, "the daemon died"
            if outcomes[-1] != "ready":
                break
            files = make_cut()  # the load beat the cut: again
        print("outcomes", outcomes)
        assert outcomes[-1] != "ready", "every load finished before the file was cut"
        subprocess.run([ctl, "-m", mnt, "load", "after", small, "--gpus", "0"], check=True)
        e = engine("compare", mnt, "after", "0", small)
        assert finish(e).startswith("OK")
    finally:
        subprocess.run(["umount", mnt])
        proc.wait(timeout=60)
        shutil.rmtree(ckpt, ignore_errors=True)
