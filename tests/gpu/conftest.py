# SPDX-License-Identifier: Apache-2.0
"""The GPU check's fixtures: one artfs daemon for the session (from the build
tree in $ARTFS_BUILD), and the test checkpoints (in $ARTFS_CKPT)."""
import os
import subprocess
import sys
import time

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.environ.get("ARTFS_BUILD", os.path.join(HERE, "..", "..", ".gpu-build"))
CKPT = os.environ.get("ARTFS_CKPT", "/tmp/artfs-ckpt")
MOUNT = os.environ.get("ARTFS_GPU_MOUNT", "/tmp/artfs-gpu-mnt")
STORE = "/dev/shm/artfs-gpu-store"
GPUS = torch.cuda.device_count()


def is_mounted(path):
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == path for line in f)


class Daemon:
    def __init__(self):
        self.proc = None
        self.log = os.path.join(os.environ.get("OUT", "/tmp"), "artfs-gpu-daemon.log")

    def start(self, *opts):
        os.makedirs(MOUNT, exist_ok=True)
        if is_mounted(MOUNT):
            subprocess.run(["umount", "-l", MOUNT])
        options = ",".join(("store=" + STORE, "allow_other") + opts)
        self.proc = subprocess.Popen([os.path.join(BUILD, "artfs"), "-f", "-o", options, MOUNT],
                                     stdout=open(self.log, "a"), stderr=subprocess.STDOUT)
        for _ in range(500):
            if is_mounted(MOUNT):
                return self
            if self.proc.poll() is not None:
                raise RuntimeError("artfs exited:\n" + open(self.log).read())
            time.sleep(0.02)
        raise RuntimeError("artfs did not mount")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            subprocess.run(["umount", MOUNT])
            self.proc.wait(timeout=60)
        self.proc = None

    def kill(self):
        self.proc.kill()
        self.proc.wait()
        subprocess.run(["umount", "-l", MOUNT])
        self.proc = None


def artfsctl(*args, check=True):
    r = subprocess.run([os.path.join(BUILD, "artfsctl"), "-m", MOUNT, *args],
                       capture_output=True, text=True)
    if check and r.returncode != 0:
        raise AssertionError(f"artfsctl {' '.join(args)}: {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r


def status(wv):
    try:
        with open(os.path.join(MOUNT, wv, "weights", "status")) as f:
            return dict(line.rstrip("\n").split(" = ", 1) for line in f if " = " in line)
    except FileNotFoundError:
        return None


def engine(*args, stdin=None, **extra_env):
    env = dict(os.environ, **extra_env)
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(HERE, "..", "..", "contrib", "python"), HERE])
    return subprocess.Popen([sys.executable, os.path.join(HERE, "engine.py"), *args],
                            stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)


def make_checkpoint(name, gib, *args):
    path = os.path.join(CKPT, name)
    done = path + ".done"
    if not os.path.exists(done):
        subprocess.run([sys.executable, os.path.join(HERE, "make_checkpoint.py"), path, str(gib),
                        *args], check=True)
        open(done, "w").close()
    return path


@pytest.fixture(scope="session")
def daemon():
    d = Daemon().start()
    yield d
    d.stop()


@pytest.fixture(scope="session")
def hf8():
    return make_checkpoint("hf8", 8, "--layout", "hf", "--files", "4")


@pytest.fixture(scope="session")
def sharded():
    ranks = min(GPUS, 2)
    return make_checkpoint(f"sharded{ranks}", 4, "--layout", "sharded", "--ranks", str(ranks),
                           "--files", "2", "--seed", "2")
