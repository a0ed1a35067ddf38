# SPDX-License-Identifier: Apache-2.0
"""The usual tools' caches in the mount's write-once tree .cache/
(DESIGN.md §9): the environment that points them there.

    import artfs
    artfs.use_cache()           # before torch (or vLLM, Triton...) is imported
    import torch

env() gives the same lines as `artfsctl cache env`; use() puts them in
os.environ, after checking that the mount serves a .cache/ tree (a tool
pointed at a mount point that is not mounted would fill the local disk
under it).
"""
from __future__ import annotations

import errno
import os
import sys
import warnings
from collections.abc import Iterable

from .mount import is_artfs_mount, mount_point

__all__ = ["TOOLS", "env", "use"]

# Each tool by the name of its directory in .cache/, with the variable
# that points it there. src/cmd/artfsctl/cache.c has the same table
# (tests/mount/test_cache_tools.py checks that both say the same).
# FlashInfer is not here: its workspace is a build directory that appends
# to a log and rewrites lock and ninja files, which a write-once tree
# refuses (doc/caches.md).
TOOLS = {
    "inductor": "TORCHINDUCTOR_CACHE_DIR",
    "triton": "TRITON_CACHE_DIR",
    "vllm": "VLLM_CACHE_ROOT",
    "deep_gemm": "DG_JIT_CACHE_DIR",
    "cuda": "CUDA_CACHE_PATH",
}


def _base(mount: str | None) -> str:
    """The mount point as the tools need it: absolute (against the working
    directory, not resolved, as artfsctl does) without trailing slashes."""
    path = mount_point(mount)
    if not os.path.isabs(path):
        path = os.path.join(os.getcwd(), path)
    return path.rstrip("/")


def _chosen(tools: Iterable[str] | None) -> list[str]:
    if tools is None:
        return list(TOOLS)
    if isinstance(tools, str):
        tools = [tools]
    chosen = list(tools)
    unknown = [t for t in chosen if t not in TOOLS]
    if unknown:
        raise ValueError(f"unknown tool(s) {', '.join(map(repr, unknown))}: "
                         f"artfs knows {', '.join(TOOLS)}")
    return chosen


def env(mount: str | None = None, tools: Iterable[str] | None = None) -> dict[str, str]:
    """{variable: directory} for the tools (default all of TOOLS), each a
    directory of <mount>/.cache/. Touches nothing on the mount."""
    base = _base(mount)
    return {TOOLS[t]: f"{base}/.cache/{t}" for t in _chosen(tools)}


def use(mount: str | None = None, tools: Iterable[str] | None = None) -> dict[str, str]:
    """Sets env(mount, tools) in os.environ and returns what it set.

    Call it before the tools are imported: some read their variable once
    (CUDA's when it starts; it warns when torch is already imported).
    Raises FileNotFoundError when no artfs daemon serves the mount point
    or its daemon has no .cache/ tree, so that no tool writes its cache
    under an unmounted mount point."""
    chosen = env(mount, tools)
    where = mount_point(mount)
    tree = os.path.join(where, ".cache")
    if not is_artfs_mount(where) or not os.path.isdir(tree):
        raise FileNotFoundError(errno.ENOENT, "no artfs mount with a .cache/ tree here", tree)
    if "torch" in sys.modules:
        warnings.warn("artfs.use_cache() after torch was imported: a variable read at import "
                      "or when CUDA starts may not take effect", RuntimeWarning, stacklevel=2)
    os.environ.update(chosen)
    return chosen
