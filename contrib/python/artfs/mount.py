# SPDX-License-Identifier: Apache-2.0
"""Where the artfs mount is, and whether an artfs daemon serves it."""
from __future__ import annotations

import os

__all__ = ["DEFAULT_MOUNT", "mount_point", "is_artfs_mount"]

DEFAULT_MOUNT = "/mnt/artifacts"


def mount_point(mount: str | None = None) -> str:
    """mount, else $ARTFS_MOUNT, else /mnt/artifacts."""
    return mount or os.environ.get("ARTFS_MOUNT") or DEFAULT_MOUNT


def is_artfs_mount(mount: str | None = None) -> bool:
    """True when an artfs daemon serves the mount point."""
    path = os.path.realpath(mount_point(mount))
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 2 and fields[1] == path and fields[2] == "fuse.artfs":
                    return True
    except OSError:
        pass
    return False
