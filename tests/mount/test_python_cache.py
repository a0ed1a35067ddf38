# SPDX-License-Identifier: Apache-2.0
"""The Python package's cache environment (contrib/python/artfs/cache.py,
DESIGN.md §9): env() without a mount, use() refusing a mount point that
serves no .cache/ tree and setting os.environ where one does."""
import os
import subprocess
import sys

import pytest

PACKAGE = os.path.join(os.path.dirname(__file__), "..", "..", "contrib", "python")
sys.path.insert(0, PACKAGE)
import artfs  # noqa: E402
from artfs import cache  # noqa: E402

VARS = {"TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton",
        "VLLM_CACHE_ROOT": "vllm", "DG_JIT_CACHE_DIR": "deep_gemm",
        "CUDA_CACHE_PATH": "cuda"}


def test_env_of_an_explicit_mount_needs_no_mount():
    got = artfs.cache_env("/nowhere/artifacts")
    assert got == {k: f"/nowhere/artifacts/.cache/{d}" for k, d in VARS.items()}
    assert list(got) == list(VARS)  # the order artfsctl prints them in
    assert not os.path.exists("/nowhere")


def test_env_makes_the_mount_absolute_without_resolving_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cache.env("mnt/")["TRITON_CACHE_DIR"] == f"{tmp_path}/mnt/.cache/triton"
    assert cache.env("/a//b///")["VLLM_CACHE_ROOT"] == "/a//b/.cache/vllm"
    assert cache.env("/")["CUDA_CACHE_PATH"] == "/.cache/cuda"


def test_env_finds_the_mount_as_the_package_does(monkeypatch):
    monkeypatch.setenv("ARTFS_MOUNT", "/from/env")
    assert cache.env()["DG_JIT_CACHE_DIR"] == "/from/env/.cache/deep_gemm"
    monkeypatch.delenv("ARTFS_MOUNT")
    assert cache.env()["DG_JIT_CACHE_DIR"] == "/mnt/artifacts/.cache/deep_gemm"


def test_env_of_chosen_tools():
    assert cache.env("/m", tools=["triton", "cuda"]) == {
        "TRITON_CACHE_DIR": "/m/.cache/triton", "CUDA_CACHE_PATH": "/m/.cache/cuda"}
    assert cache.env("/m", tools="inductor") == {
        "TORCHINDUCTOR_CACHE_DIR": "/m/.cache/inductor"}
    with pytest.raises(ValueError, match="'nvcc'"):
        cache.env("/m", tools=["triton", "nvcc"])


def test_use_refuses_a_mount_point_that_is_not_mounted(tmp_path, monkeypatch):
    """A tool pointed at an unmounted mount point would fill the disk under it."""
    (tmp_path / ".cache").mkdir()
    for var in VARS:
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(FileNotFoundError):
        cache.use(str(tmp_path))
    assert not any(var in os.environ for var in VARS)


def test_use_sets_the_environment_where_the_tree_is(tmp_path, monkeypatch):
    (tmp_path / ".cache").mkdir()
    monkeypatch.setattr(cache, "is_artfs_mount", lambda m: m == str(tmp_path))
    for var in VARS:
        monkeypatch.delenv(var, raising=False)
    got = artfs.use_cache(str(tmp_path), tools=["inductor", "triton"])
    assert got == {"TORCHINDUCTOR_CACHE_DIR": f"{tmp_path}/.cache/inductor",
                   "TRITON_CACHE_DIR": f"{tmp_path}/.cache/triton"}
    assert {k: os.environ[k] for k in got} == got
    assert "CUDA_CACHE_PATH" not in os.environ
    # a mount that serves no .cache/ tree (a daemon older than it)
    monkeypatch.setattr(cache, "is_artfs_mount", lambda m: True)
    with pytest.raises(FileNotFoundError, match=".cache"):
        cache.use(str(tmp_path / "other"))


def test_importing_artfs_does_not_import_torch():
    """use_cache() is called before torch is imported: importing artfs must
    not import it first."""
    code = "import sys, artfs; artfs.cache_env('/m'); print('torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": PACKAGE}, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"
