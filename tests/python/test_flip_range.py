# SPDX-License-Identifier: Apache-2.0
"""artfs._range (the Python client's attachment in place) against a fake
driver, and the attach reply's layout digest in artfs._abi: the same checks
as tests/unit/test_flip_range.c makes of libartfs; a flip's rank checks of
artfs.weights (a rank the version lacks, another tensor-parallel size).
No GPU, no mount."""
import errno
import json

import pytest

from artfs import _abi, weights
from artfs._range import Range

MIB = 1 << 20


class Fake:
    """Handle h = fd + 100; what is imported, mapped, reserved."""

    def __init__(self):
        self.live, self.where = set(), {}
        self.fail_import = self.fail_map = None
        self.fail_all_maps = False
        self.reserved = self.freed = None

    def import_handle(self, fd):
        if fd == self.fail_import:
            raise OSError(errno.EBADF, f"import {fd} refused")
        assert fd + 100 not in self.live
        self.live.add(fd + 100)
        return fd + 100

    def release(self, h):
        self.live.remove(h)

    def reserve(self, size):
        self.reserved = (0x7F0000000000, size)
        return 0x7F0000000000

    def free(self, va, size):
        assert (va, size) == self.reserved
        self.freed = (va, size)

    def map(self, va, size, h):
        assert h in self.live and va not in self.where.values()
        if h == self.fail_map or self.fail_all_maps:
            raise OSError(errno.EIO, f"map of {h} refused")
        self.where[h] = va

    def unmap_at(self, va, size):
        h = next(h for h, v in self.where.items() if v == va)
        del self.where[h]


SIZES = [4 * MIB, 2 * MIB]


def test_reserved_here_placed_mapped_and_freed():
    d = Fake()
    r = Range(d, SIZES)
    assert r.owned and d.reserved == (0x7F0000000000, 6 * MIB)
    assert r.at == [0x7F0000000000, 0x7F0000000000 + 4 * MIB]
    r.map([1, 2], SIZES)
    assert d.where == {101: r.at[0], 102: r.at[1]}
    r.close()
    assert not d.live and not d.where and d.freed


def test_the_engines_range_is_checked_and_kept():
    d = Fake()
    base = 0x7E0000000000
    for args, code in (((base + 4096, 8 * MIB), errno.EINVAL), ((base, 6 * MIB - 1), errno.ENOSPC)):
        with pytest.raises(OSError) as e:
            Range(d, SIZES, *args)
        assert e.value.errno == code
    with pytest.raises(OSError):
        Range(d, [3 * MIB + 1], base, 8 * MIB)
    r = Range(d, SIZES, base, 6 * MIB)
    assert not r.owned and d.reserved is None and r.at[0] == base
    r.map([1, 2], SIZES)
    r.close()
    assert d.freed is None and not d.live


def test_flip_back_and_forth_at_the_same_addresses():
    d = Fake()
    r = Range(d, SIZES)
    r.map([1, 2], SIZES)
    at = list(r.at)
    for i in range(10):
        fds = [1, 2] if i % 2 else [3, 4]
        r.map(fds, SIZES)
        assert r.at == at and d.where == {fds[0] + 100: at[0], fds[1] + 100: at[1]}
        assert d.live == {fds[0] + 100, fds[1] + 100}
    r.close()
    assert not d.live


def test_another_layout_changes_nothing():
    d = Fake()
    r = Range(d, SIZES)
    r.map([1, 2], SIZES)
    for sizes in ([4 * MIB, 4 * MIB], [4 * MIB]):
        with pytest.raises(OSError) as e:
            r.map([3, 4][:len(sizes)], sizes)
        assert e.value.errno == errno.EXDEV and "another layout" in str(e.value)
    assert d.live == {101, 102} and d.where == {101: r.at[0], 102: r.at[1]}


def test_a_failed_flip_leaves_the_version_before():
    d = Fake()
    r = Range(d, SIZES)
    r.map([1, 2], SIZES)
    d.fail_import = 4
    with pytest.raises(OSError):
        r.map([3, 4], SIZES)
    assert d.live == {101, 102} and d.where == {101: r.at[0], 102: r.at[1]}
    d.fail_import, d.fail_map = None, 104
    with pytest.raises(OSError):
        r.map([3, 4], SIZES)
    assert d.live == {101, 102} and d.where == {101: r.at[0], 102: r.at[1]}
    d.fail_map = None
    r.map([3, 4], SIZES)
    assert d.where == {103: r.at[0], 104: r.at[1]}
    d.fail_all_maps = True
    with pytest.raises(OSError) as e:
        r.map([1, 2], SIZES)
    assert "could not be mapped again" in str(e.value)
    assert d.live == {103, 104}
    r.close()
    assert not d.live


def test_the_attach_reply_carries_the_layout():
    assert _abi.ATTACH_SIZE == 768
    buf = bytearray(_abi._pack_attach({"architecture": "", "quant_method": "",
                                       "quant_config_sha256": bytes(32), "revision": bytes(32),
                                       "dtypes": "", "tp_size": 1, "tp_rank": 0, "cc_major": 9,
                                       "cc_minor": 0, "driver_version": 1}))
    buf[768 - 32:] = bytes(range(32))           # struct artfs_attach.layout, the last 32 bytes
    buf[768 - 64:768 - 32] = b"t" * 32          # token
    count, sizes, token, layout = _abi._unpack_attach(bytes(buf))
    assert layout == bytes(range(32)) and token == b"t" * 32 and count == 0


def manifest(tmp_path, ranks):
    d = tmp_path / "wv" / "weights"
    d.mkdir(parents=True)
    (d / "manifest.json").write_text(json.dumps({"ranks": ranks}))
    return str(tmp_path)


def test_a_rank_the_version_lacks_is_enoent(tmp_path):
    """A rank of a tensor-parallel engine asks for its own rank's entry: a
    version of fewer ranks has none (ENOENT), never an IndexError."""
    one = {"fingerprint": {"tp_size": 1}, "tensors": {}}
    mnt = manifest(tmp_path, [one])
    assert weights.manifest_rank("wv", 0, mnt) == one
    with pytest.raises(OSError) as e:
        weights.manifest_rank("wv", 1, mnt)
    assert e.value.errno == errno.ENOENT and "no rank 1 (the version has 1 rank)" in str(e.value)
    for i, ranks in enumerate(([], {"0": one}, [one, "x"])):
        other = tmp_path / str(i)
        other.mkdir()
        with pytest.raises(OSError) as e:
            weights.manifest_rank("wv", 1, manifest(other, ranks))
        assert e.value.errno == errno.ENOENT


def test_a_rank_flips_only_to_its_own_tensor_parallel_size():
    weights.check_same_tp("v2/weights/rank0", 2, {"tp_size": 2})
    with pytest.raises(OSError) as e:
        weights.check_same_tp("v2/weights/rank0", 2, {"tp_size": 1})
    assert e.value.errno == errno.ESTALE and "tp_size 1" in str(e.value) and "tp_size 2" in str(e.value)
