# SPDX-License-Identifier: Apache-2.0
"""The bookkeeping of an attachment in place (flip in place, DESIGN.md §4.3),
as libartfs's gpu/client/range.c keeps it: where each slab lies in a range of
addresses, which version's allocation is mapped there, and a flip that maps
another version's allocations at the same addresses or, failing, puts the old
ones back. Only the driver object touches the GPU (artfs._cuda's, or a fake
in tests): import_handle, release, reserve, free, map, unmap_at.
"""
from __future__ import annotations

import errno
from typing import Any, Sequence

SLAB_ALIGN = 2 << 20


class Range:
    """count slabs one after the other in [base, base + length), or in a range
    reserved here when base is 0 (freed by close)."""

    def __init__(self, drv: Any, sizes: Sequence[int], base: int = 0, length: int = 0) -> None:
        if not 1 <= len(sizes) <= 16:
            raise OSError(errno.EINVAL, f"{len(sizes)} slabs (1 to 16)")
        bad = [s for s in sizes if s <= 0 or s % SLAB_ALIGN]
        if bad:
            raise OSError(errno.EINVAL, f"slab sizes {bad} are not multiples of 2 MiB")
        if base % SLAB_ALIGN:
            raise OSError(errno.EINVAL, f"the range at {base:#x} is not 2 MiB aligned")
        need = sum(sizes)
        if base and length < need:
            raise OSError(errno.ENOSPC, f"the range holds {length} bytes; the slabs need {need}")
        self._drv = drv
        self.owned = not base
        self.base = base or drv.reserve(need)
        self.length = need if self.owned else length
        self.sizes = list(sizes)
        self.at = [self.base + sum(self.sizes[:i]) for i in range(len(sizes))]
        self.handles: list[int] | None = None     # held: what is mapped (or was)
        self.mapped = [False] * len(sizes)

    def map(self, fds: Sequence[int], sizes: Sequence[int]) -> None:
        """Maps the slabs of the descriptors (not taken) in place: the first
        version, or another of the same slab sizes (a flip; else EXDEV). On
        any failure the version before stays mapped."""
        if list(sizes) != self.sizes or len(fds) != len(self.sizes):
            raise OSError(errno.EXDEV, f"{len(sizes)} slabs of sizes {list(sizes)}, not the "
                          f"{self.sizes} in place: another layout")
        drv = self._drv
        new: list[int] = []
        try:
            for fd in fds:  # every allocation first: one that fails changes nothing
                new.append(drv.import_handle(fd))
        except BaseException:
            for h in new:
                drv.release(h)
            raise
        for i, h in enumerate(new):
            if self.mapped[i]:
                drv.unmap_at(self.at[i], self.sizes[i])
                self.mapped[i] = False
            try:
                drv.map(self.at[i], self.sizes[i], h)
                self.mapped[i] = True
            except BaseException as e:
                back = self._back(i + 1)
                for k in new:
                    drv.release(k)
                if back is not None:
                    raise OSError(e.errno if isinstance(e, OSError) else errno.EIO,
                                  f"{e}; and the version before could not be mapped again: {back}") from e
                raise
        if self.handles is not None:
            for h in self.handles:
                drv.release(h)
        self.handles = new

    def _back(self, n: int) -> str | None:
        """After a failed map of slab n - 1: slabs [0, n) back to the handles
        held (the version before), or unmapped when there is none. What
        failed, or None."""
        failed = None
        for i in range(n):
            if self.mapped[i]:
                self._drv.unmap_at(self.at[i], self.sizes[i])
                self.mapped[i] = False
            if self.handles is None:
                continue
            try:
                self._drv.map(self.at[i], self.sizes[i], self.handles[i])
                self.mapped[i] = True
            except OSError as e:
                failed = failed or str(e)
        return failed

    def close(self) -> None:
        for i, m in enumerate(self.mapped):
            if m:
                self._drv.unmap_at(self.at[i], self.sizes[i])
        self.mapped = [False] * len(self.sizes)
        if self.handles is not None:
            for h in self.handles:
                self._drv.release(h)
            self.handles = None
        if self.owned and self.base:
            self._drv.free(self.base, self.length)
            self.base = 0
