# SPDX-License-Identifier: Apache-2.0
"""Reading R3 objects: DESIGN.md §3.3 (numpy.save bytes, st_size, checksum
before the first byte, xattrs), kernel caching, unlink, restart."""
import os
import subprocess

import numpy as np
import pytest

from conftest import Mount, flip_byte, publish, read_result
from envelope import encode, npy_bytes, pack, routed_experts

WV = "default"

SHAPES = [(1, 1, 1), (16, 48, 8), (16, 61, 8), (1, 61, 8), (3,), (1,), (7, 5),
          (2, 3, 4, 5, 6, 7, 1, 2), (123456, 2), (1000, 1), (4096, 61, 8), (9, 99, 999)]
R3_DTYPES = [np.uint8, np.uint16]
OTHER_DTYPES = ["|b1", "|i1", "<i2", "<i4", "<u4", "<i8", "<u8", "<f2", "<f4", "<f8", ">u2",
                ">i4", ">f8"]


def sample(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.integers(0, 2, size=shape).astype(dt)
    if dt.kind == "f":
        return rng.standard_normal(size=shape).astype(dt)
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, size=shape, dtype=dt.newbyteorder("=")).astype(dt)


def roundtrip(m, h, arr):
    p = m.path(WV, h)
    assert publish(p, encode(WV, h, arr)) == 0
    expected = npy_bytes(arr)
    assert read_result(p) == expected
    assert os.stat(p).st_size == len(expected)
    loaded = np.load(p)
    assert loaded.dtype == arr.dtype and loaded.shape == arr.shape
    assert np.array_equal(loaded, arr)
    return p


def test_numpy_save_bytes_for_many_shapes_and_r3_dtypes(mnt):
    os.mkdir(mnt.path(WV))
    n = 0
    for dtype in R3_DTYPES:
        for shape in SHAPES:
            roundtrip(mnt, f"{n:04x}", sample(shape, dtype, seed=n))
            n += 1


def test_numpy_save_bytes_for_every_accepted_dtype(mnt):
    os.mkdir(mnt.path(WV))
    for i, dt in enumerate(OTHER_DTYPES):
        roundtrip(mnt, f"{i:04x}", sample((5, 3, 2), dt, seed=i))


def test_header_alignment_boundaries(mnt):
    """First-axis widths that move the header across 64-byte boundaries."""
    os.mkdir(mnt.path(WV))
    for i, rows in enumerate([1, 9, 10, 99, 100, 999, 1000, 9999, 10000, 99999, 100000]):
        roundtrip(mnt, f"{i:04x}", sample((rows, 2), np.uint8, seed=i))


def test_partial_and_offset_reads(mnt):
    os.mkdir(mnt.path(WV))
    arr = sample((300, 61, 8), np.uint16)
    p = roundtrip(mnt, "abcd", arr)
    want = npy_bytes(arr)
    fd = os.open(p, os.O_RDONLY)
    try:
        for off, size in [(0, 1), (1, 127), (127, 2), (4000, 100000), (len(want) - 3, 10),
                          (len(want), 10), (len(want) + 100, 10)]:
            assert os.pread(fd, size, off) == want[off:off + size], (off, size)
    finally:
        os.close(fd)


def test_shell_tools_see_the_npy(mnt, tmp_path):
    os.mkdir(mnt.path(WV))
    arr = routed_experts(16)
    p = roundtrip(mnt, "0123", arr)
    out = subprocess.run(["cat", p], capture_output=True, check=True).stdout
    assert out == npy_bytes(arr)
    subprocess.run(["cp", p, str(tmp_path / "copy.npy")], check=True)
    assert np.array_equal(np.load(tmp_path / "copy.npy"), arr)
    size = subprocess.run(["stat", "-c", "%s %A", p], capture_output=True, text=True,
                          check=True).stdout.split()
    assert size == [str(len(npy_bytes(arr))), "-r--r--r--"]
    ls = subprocess.run(["ls", "-l", mnt.path(WV)], capture_output=True, text=True,
                        check=True).stdout
    assert "0123" in ls and str(len(npy_bytes(arr))) in ls


def getfattr_dump(path):
    out = subprocess.run(["getfattr", "-d", "--absolute-names", path], capture_output=True,
                         text=True, check=True).stdout
    attrs = {}
    for line in out.splitlines():
        if "=" in line and not line.startswith("#"):
            k, v = line.split("=", 1)
            attrs[k] = v.strip('"')
    return attrs


def test_xattrs_rebuild_the_envelope(mnt):
    os.mkdir(mnt.path(WV))
    arr = routed_experts(8, dtype=np.uint16)
    h = "feedbeef"
    env = encode(WV, h, arr, kind="tail", source_token_start=32)
    p = mnt.path(WV, h)
    assert publish(p, env) == 0
    attrs = getfattr_dump(p)
    assert set(attrs) == {"user.artfs.key", "user.artfs.kind", "user.artfs.dtype",
                          "user.artfs.shape", "user.artfs.source_token_start",
                          "user.artfs.payload_sha256"}
    assert attrs["user.artfs.shape"] == "8,48,8"
    assert attrs["user.artfs.kind"] == "tail"
    assert attrs["user.artfs.source_token_start"] == "32"
    # The array bytes plus the attributes give back the published envelope.
    served = np.load(p)
    fields = {
        "schema_version": 3,
        "key": attrs["user.artfs.key"],
        "kind": attrs["user.artfs.kind"],
        "field": "routed_experts",
        "dtype": attrs["user.artfs.dtype"],
        "shape": [int(x) for x in attrs["user.artfs.shape"].split(",")],
        "source_token_start": int(attrs["user.artfs.source_token_start"]),
        "payload_sha256": attrs["user.artfs.payload_sha256"],
    }
    assert pack(fields, served.tobytes()) == env
    one = subprocess.run(["getfattr", "--only-values", "-n", "user.artfs.dtype", p],
                         capture_output=True, text=True, check=True).stdout
    assert one == "<u2"
    r = subprocess.run(["getfattr", "-n", "user.artfs.nope", p], capture_output=True, text=True)
    assert r.returncode != 0 and "No such attribute" in r.stderr
    r = subprocess.run(["setfattr", "-n", "user.artfs.kind", "-v", "block", p],
                       capture_output=True, text=True)
    assert r.returncode != 0


def test_corrupted_store_fails_closed_with_eio(mnt):
    os.mkdir(mnt.path(WV))
    arr = routed_experts(16)
    p = mnt.path(WV, "aa")
    assert publish(p, encode(WV, "aa", arr)) == 0
    flip_byte(mnt.store_file(WV, "aa"))
    assert read_result(p) == "read:EIO"
    r = subprocess.run(["cat", p], capture_output=True)
    assert r.returncode != 0 and r.stdout == b""
    assert mnt.metrics()["artfs_checksum_failures_total"] >= 1
    assert mnt.wait_log(f"read {WV}/aa: stored object fails verification")
    # Flipping it back restores it: nothing was lost, nothing wrong served.
    flip_byte(mnt.store_file(WV, "aa"))
    assert read_result(p) == npy_bytes(arr)


def test_corruption_after_a_cached_read_still_fails_closed(mnt):
    os.mkdir(mnt.path(WV))
    arr = routed_experts(16)
    p = mnt.path(WV, "bb")
    assert publish(p, encode(WV, "bb", arr)) == 0
    assert read_result(p) == npy_bytes(arr)
    assert read_result(p) == npy_bytes(arr)
    assert mnt.metrics()["artfs_verifications_total"] == 1  # the second came from page cache
    flip_byte(mnt.store_file(WV, "bb"), offset_from_end=100)
    assert read_result(p) == "read:EIO"


@pytest.mark.parametrize("damage", ["header", "truncate", "swap"])
def test_other_store_damage_is_eio(mnt, damage):
    os.mkdir(mnt.path(WV))
    p = mnt.path(WV, "cc")
    assert publish(p, encode(WV, "cc", routed_experts(16))) == 0
    assert publish(mnt.path(WV, "dd"), encode(WV, "dd", routed_experts(16))) == 0
    f = mnt.store_file(WV, "cc")
    if damage == "header":
        with open(f, "r+b") as fh:
            fh.seek(20)
            fh.write(b"X")
    elif damage == "truncate":
        os.truncate(f, os.path.getsize(f) - 1)
    else:  # a valid object of another key moved in its place
        os.replace(mnt.store_file(WV, "dd"), f)
    assert read_result(p) == "read:EIO"


def test_unlink_removes_for_everyone_and_open_readers_finish(mnt):
    os.mkdir(mnt.path(WV))
    arr = routed_experts(16)
    p = mnt.path(WV, "ee")
    assert publish(p, encode(WV, "ee", arr)) == 0
    size = os.stat(p).st_size
    fd = os.open(p, os.O_RDONLY)
    os.unlink(p)
    assert not os.path.exists(p)
    assert subprocess.run(["stat", p], capture_output=True).returncode != 0
    assert os.listdir(mnt.path(WV)) == []
    assert not os.path.exists(mnt.store_file(WV, "ee"))
    assert os.read(fd, size + 10) == npy_bytes(arr)
    os.close(fd)
    m = mnt.metrics()
    assert m["artfs_objects"] == 0 and m["artfs_bytes_used"] == 0 and m["artfs_unlinks_total"] == 1
    # Re-publishing the key after removal works and serves the new content.
    other = routed_experts(16, seed=9)
    assert publish(p, encode(WV, "ee", other)) == 0
    assert read_result(p) == npy_bytes(other)


def test_objects_survive_a_restart(mnt):
    os.mkdir(mnt.path(WV))
    os.mkdir(mnt.path("v2"))
    arrays = {f"{i:02x}": routed_experts(16, seed=i) for i in range(20)}
    for h, a in arrays.items():
        assert publish(mnt.path(WV, h), encode(WV, h, a)) == 0
    assert publish(mnt.path("v2", "00"), encode("v2", "00", arrays["00"])) == 0
    mnt.restart()
    assert sorted(os.listdir(mnt.path(WV))) == sorted(arrays)
    for h, a in arrays.items():
        assert os.stat(mnt.path(WV, h)).st_size == len(npy_bytes(a))
        assert read_result(mnt.path(WV, h)) == npy_bytes(a)
    assert read_result(mnt.path("v2", "00")) == npy_bytes(arrays["00"])
    m = mnt.metrics()
    assert m["artfs_objects"] == 21 and m["artfs_versions"] == 2
    assert "indexed 21 objects" in mnt.log()


def test_second_daemon_on_the_same_store_is_refused(mnt, tmp_path):
    other = Mount(tmp_path, "mnt2", store=mnt.store).start(expect_fail=True)
    assert other.proc.wait(timeout=10) != 0
    assert "is in use by another artfs daemon" in other.log()
    other.proc = None
    other.log_fh.close()
