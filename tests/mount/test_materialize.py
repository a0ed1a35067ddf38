# SPDX-License-Identifier: Apache-2.0
"""Materializing a request through <wv>/.materialize: DESIGN.md §3.4.

Each test publishes the objects of a request through the mount (with the
independent encoder in envelope.py), writes the request text to
<wv>/.materialize and reads the .npy back from offset 0. The expected bytes
are always numpy.save of np.concatenate of the arrays that were published
(or, for the vLLM vectors, the .npy vLLM itself wrote)."""
import errno
import hashlib
import io
import json
import multiprocessing
import os
import stat
import time

import numpy as np
import pytest

from conftest import VECTORS, errname, flip_byte, publish, read_result, wait_for
from envelope import encode, npy_bytes, routed_experts

WV = "default"
MAT = ".materialize"


# ---- helpers -------------------------------------------------------------------

def vector_cases():
    with open(os.path.join(VECTORS, "vectors.json")) as f:
        return {c["name"]: c for c in json.load(f)["cases"]}


def vector(name, ext):
    with open(os.path.join(VECTORS, f"{name}.{ext}"), "rb") as f:
        return f.read()


def block_hash(i, salt="r"):
    """A distinct 64-digit lowercase block hash per (salt, i)."""
    return hashlib.sha256(f"{salt}/{i}".encode()).hexdigest()


def request_text(hashes, token_end=None, block_size=None):
    lines = []
    if token_end is not None:
        lines.append(f"token_end {token_end}")
    if block_size is not None:
        lines.append(f"block_size {block_size}")
    lines += hashes
    return "\n".join(lines) + "\n"


def read_all(fd):
    chunks = []
    off = 0
    while True:
        b = os.pread(fd, 1 << 20, off)
        if not b:
            return b"".join(chunks)
        chunks.append(b)
        off += len(b)


def materialize(m, text, wv=WV, chunk=None):
    """One transaction: open <wv>/.materialize read-write, write text (in
    chunks of `chunk` bytes, sequentially), read from offset 0. Returns the
    bytes, or the errno name of the call that failed ("read:EBADMSG")."""
    data = text.encode() if isinstance(text, str) else text
    try:
        fd = os.open(m.path(wv, MAT), os.O_RDWR)
    except OSError as e:
        return "open:" + errname(e.errno)
    try:
        step = chunk or max(len(data), 1)
        try:
            for off in range(0, len(data), step):
                assert os.write(fd, data[off:off + step]) == len(data[off:off + step])
        except OSError as e:
            return "write:" + errname(e.errno)
        try:
            return read_all(fd)
        except OSError as e:
            return "read:" + errname(e.errno)
    finally:
        os.close(fd)


def publish_request(m, arrays, wv=WV, kinds=None, starts=None, hashes=None, salt="r",
                    block_size=None):
    """Publishes one object per array (kinds and source_token_start as vLLM
    would label them, unless given) and returns their hashes."""
    os.makedirs(m.path(wv), exist_ok=True)
    if block_size is None:
        block_size = arrays[0].shape[0]
    hashes = list(hashes) if hashes else [block_hash(i, salt) for i in range(len(arrays))]
    start = 0
    for i, arr in enumerate(arrays):
        kind = kinds[i] if kinds else ("block" if arr.shape[0] == block_size else "tail")
        s = starts[i] if starts else start
        assert publish(m.path(wv, hashes[i]),
                       encode(wv, hashes[i], arr, kind=kind, source_token_start=s)) == 0
        start += arr.shape[0]
    return hashes


def standard(layers=48, top_k=8, dtype=np.uint8, rows=(16, 16, 8), seed=0):
    return [routed_experts(r, layers, top_k, dtype, seed=seed + i) for i, r in enumerate(rows)]


def expect_badmsg(m, text, reason):
    assert materialize(m, text) == "read:EBADMSG"
    assert m.wait_log(f"materialize {WV}: {reason}"), m.log()


# ---- the result ----------------------------------------------------------------

@pytest.mark.parametrize("mode", ["r+b", "w+b"])
def test_vllm_vector_request_equals_vllm_materialized_npy(mnt, mode):
    cases = vector_cases()
    names = ["req-block0", "req-block1", "req-tail"]
    os.makedirs(mnt.path(WV), exist_ok=True)
    for name in names:
        c = cases[name]
        assert c["weight_version"] == WV
        assert publish(mnt.path(WV, c["block_hash"]), vector(name, "envelope")) == 0, name
    hashes = [cases[n]["block_hash"] for n in names]
    want = vector("req-materialized", "npy")
    # As a Python client would do it: open, write, seek(0), read.
    with open(mnt.path(WV, MAT), mode) as f:
        f.write(request_text(hashes, token_end=40, block_size=16).encode())
        f.seek(0)
        got = f.read()
    assert got == want
    # The same bytes without block_size, without token_end, without both.
    assert materialize(mnt, request_text(hashes, token_end=40)) == want
    assert materialize(mnt, request_text(hashes, block_size=16)) == want
    assert materialize(mnt, request_text(hashes)) == want
    # And it is numpy.save of the concatenation of the objects as read back.
    arrays = [np.load(mnt.path(WV, cases[n]["block_hash"])) for n in names]
    assert want == npy_bytes(np.concatenate(arrays))


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
def test_many_blocks_and_a_tail(mnt, dtype):
    arrays = standard(dtype=dtype, rows=[16] * 50 + [11], seed=100)
    hashes = publish_request(mnt, arrays)
    want = npy_bytes(np.concatenate(arrays))
    got = materialize(mnt, request_text(hashes, token_end=16 * 50 + 11))
    assert isinstance(got, bytes), got
    assert got == want
    arr = np.load(io.BytesIO(got))
    assert arr.shape == (811, 48, 8) and arr.dtype == dtype
    # Written in small pieces, sequentially: the same request.
    assert materialize(mnt, request_text(hashes, token_end=811), chunk=7) == want


def test_many_blocks_without_a_tail(mnt):
    arrays = standard(rows=[16] * 20, seed=7)
    hashes = publish_request(mnt, arrays)
    assert materialize(mnt, request_text(hashes, token_end=320)) == \
        npy_bytes(np.concatenate(arrays))
    assert materialize(mnt, request_text(hashes)) == npy_bytes(np.concatenate(arrays))


def test_block_size_given_explicitly(mnt):
    arrays = standard(rows=(16, 16, 8))
    hashes = publish_request(mnt, arrays)
    want = npy_bytes(np.concatenate(arrays))
    assert materialize(mnt, request_text(hashes, token_end=40, block_size=16)) == want
    assert materialize(mnt, request_text(hashes, block_size=16)) == want
    # A block_size the objects do not follow is a layout error.
    assert materialize(mnt, request_text(hashes, token_end=40, block_size=8)) == "read:EBADMSG"
    assert materialize(mnt, request_text(hashes, token_end=40, block_size=32)) == "read:EBADMSG"


def test_request_shorter_than_a_block_is_a_lone_tail(mnt):
    # A prompt shorter than block_size has one object: a tail.
    tail = routed_experts(5, seed=3)
    hashes = publish_request(mnt, [tail], kinds=["tail"])
    assert materialize(mnt, request_text(hashes, token_end=5, block_size=16)) == npy_bytes(tail)
    assert materialize(mnt, request_text(hashes, block_size=16)) == npy_bytes(tail)
    # Without block_size, block_size is the rows of the first object (5), so
    # that object is full and must be labelled block (DESIGN.md §3.4).
    assert materialize(mnt, request_text(hashes, token_end=5)) == "read:EBADMSG"
    assert mnt.wait_log(f"materialize {WV}: object 0 is a tail, expected a block")


def test_one_token_vllm_tail(mnt):
    c = vector_cases()["one-token-tail"]
    os.makedirs(mnt.path(c["weight_version"]), exist_ok=True)
    assert publish(mnt.path(c["weight_version"], c["block_hash"]),
                   vector("one-token-tail", "envelope")) == 0
    got = materialize(mnt, request_text([c["block_hash"]], token_end=1, block_size=16),
                      wv=c["weight_version"])
    assert got == vector("one-token-tail", "npy")


def test_u16_vector_in_its_own_version(mnt):
    c = vector_cases()["u16-block"]
    wv = c["weight_version"]
    os.makedirs(mnt.path(wv), exist_ok=True)
    assert publish(mnt.path(wv, c["block_hash"]), vector("u16-block", "envelope")) == 0
    assert materialize(mnt, request_text([c["block_hash"]]), wv=wv) == vector("u16-block", "npy")
    # The same hash is not an object of another version.
    os.makedirs(mnt.path(WV), exist_ok=True)
    assert materialize(mnt, request_text([c["block_hash"]]), wv=WV) == "read:ENOENT"


def test_token_end_omitted_is_the_sum_of_rows(mnt):
    arrays = standard(rows=(16, 16, 16, 3), seed=20)
    hashes = publish_request(mnt, arrays)
    got = materialize(mnt, request_text(hashes))
    assert got == npy_bytes(np.concatenate(arrays))
    assert np.load(io.BytesIO(got)).shape == (51, 48, 8)


def test_blank_lines_spaces_and_crlf_are_ignored(mnt):
    arrays = standard(rows=(16, 16, 8), seed=30)
    hashes = publish_request(mnt, arrays)
    text = ("\n  \n\t token_end   40  \r\n\n block_size\t16\n"
            + "".join(f"   {h}\t \r\n\n" for h in hashes) + "   ")
    assert materialize(mnt, text) == npy_bytes(np.concatenate(arrays))
    # No final newline.
    assert materialize(mnt, "\n".join(hashes)) == npy_bytes(np.concatenate(arrays))


def test_hashes_of_other_lengths(mnt):
    arrays = standard(rows=(4, 4, 4, 1), seed=40)
    hashes = ["00", "abcd", "0123456789abcdef", "f" * 128]
    publish_request(mnt, arrays, hashes=hashes)
    assert materialize(mnt, request_text(hashes, token_end=13)) == \
        npy_bytes(np.concatenate(arrays))


def test_other_shapes_and_dtypes(mnt):
    # One-dimensional rows, and a 4-dimensional float array.
    a = [np.arange(i * 8, i * 8 + n, dtype="<i4") for i, n in enumerate((8, 8, 2))]
    hashes = publish_request(mnt, a, salt="1d")
    assert materialize(mnt, request_text(hashes)) == npy_bytes(np.concatenate(a))
    rng = np.random.default_rng(5)
    b = [rng.standard_normal((n, 3, 2, 2)).astype(">f8") for n in (4, 4, 4, 4, 3)]
    hashes = publish_request(mnt, b, wv="f8")
    # (np.concatenate makes the byte order native; the objects' dtype stays.)
    assert materialize(mnt, request_text(hashes, token_end=19), wv="f8") == \
        npy_bytes(np.concatenate(b).astype(">f8"))


def test_partial_and_offset_reads(mnt):
    arrays = standard(rows=(16, 16, 8), seed=50)
    hashes = publish_request(mnt, arrays)
    want = npy_bytes(np.concatenate(arrays))
    fd = os.open(mnt.path(WV, MAT), os.O_RDWR)
    try:
        os.write(fd, request_text(hashes).encode())
        # The first read need not be at offset 0 of the result's start...
        assert os.pread(fd, 100, 1000) == want[1000:1100]
        # ...every piece comes from the same result, and EOF is at its end.
        pieces = b"".join(os.pread(fd, 333, off) for off in range(0, len(want), 333))
        assert pieces == want
        assert os.pread(fd, 4096, len(want)) == b""
        assert os.pread(fd, 4096, len(want) + 10000) == b""
        assert os.pread(fd, 4096, len(want) - 5) == want[-5:]
    finally:
        os.close(fd)


# ---- the layout rules: EBADMSG -------------------------------------------------------

def test_gap_in_source_token_start(mnt):
    arrays = standard(rows=(16, 16, 8))
    hashes = publish_request(mnt, arrays, starts=[0, 20, 36])
    expect_badmsg(mnt, request_text(hashes, token_end=40),
                  "object 1 starts at token 20, expected 16 (Bad message)")


def test_first_object_not_at_token_zero(mnt):
    arrays = standard(rows=(16, 8))
    hashes = publish_request(mnt, arrays, starts=[16, 32])
    expect_badmsg(mnt, request_text(hashes),
                  "object 0 starts at token 16, expected 0 (Bad message)")


def test_objects_out_of_order(mnt):
    arrays = standard(rows=(16, 16, 8))
    hashes = publish_request(mnt, arrays)
    expect_badmsg(mnt, request_text([hashes[1], hashes[0], hashes[2]], token_end=40),
                  "object 0 starts at token 16, expected 0 (Bad message)")


def test_same_object_twice(mnt):
    arrays = standard(rows=(16, 16, 8))
    hashes = publish_request(mnt, arrays)
    # Refused before any payload is held (a repeat breaks the layout anyway).
    expect_badmsg(mnt, request_text([hashes[0], hashes[0], hashes[2]], token_end=40),
                  "object 1 repeats object 0 (Bad message)")


def test_wrong_row_count_in_a_middle_block(mnt):
    arrays = standard(rows=(16, 12, 16, 8))
    hashes = publish_request(mnt, arrays, kinds=["block"] * 3 + ["tail"], block_size=16)
    expect_badmsg(mnt, request_text(hashes, token_end=52),
                  "object 1 has 12 rows, expected 16 (block_size 16, token_end 52) (Bad message)")
    # Labelled a tail, it is still a short object in the middle.
    hashes = publish_request(mnt, arrays, kinds=["block", "tail", "block", "tail"],
                             salt="t", block_size=16)
    expect_badmsg(mnt, request_text(hashes, token_end=52),
                  "object 1 has 12 rows, expected 16 (block_size 16, token_end 52)")


def test_full_block_labelled_tail(mnt):
    arrays = standard(rows=(16, 16, 8))
    hashes = publish_request(mnt, arrays, kinds=["block", "tail", "tail"])
    expect_badmsg(mnt, request_text(hashes, token_end=40),
                  "object 1 is a tail, expected a block (Bad message)")


def test_full_last_object_labelled_tail(mnt):
    arrays = standard(rows=(16, 16))
    hashes = publish_request(mnt, arrays, kinds=["block", "tail"])
    expect_badmsg(mnt, request_text(hashes, token_end=32),
                  "object 1 is a tail, expected a block (Bad message)")


def test_short_block_labelled_block(mnt):
    arrays = standard(rows=(16, 16, 8))
    hashes = publish_request(mnt, arrays, kinds=["block", "block", "block"])
    expect_badmsg(mnt, request_text(hashes, token_end=40),
                  "object 2 is a block, expected a tail (Bad message)")


def test_dtype_mismatch(mnt):
    arrays = standard(rows=(16, 16)) + [routed_experts(8, dtype=np.uint16, seed=9)]
    hashes = publish_request(mnt, arrays)
    expect_badmsg(mnt, request_text(hashes, token_end=40),
                  "object 2 is <u2 (8,48,8), object 0 is |u1 (16,48,8) (Bad message)")


def test_dtype_mismatch_same_itemsize(mnt):
    arrays = standard(rows=(16, 16)) + [routed_experts(8, seed=9).astype("|i1")]
    hashes = publish_request(mnt, arrays)
    expect_badmsg(mnt, request_text(hashes, token_end=40), "object 2 is |i1 (8,48,8)")


def test_byte_order_mismatch(mnt):
    arrays = standard(rows=(16, 16), dtype=np.uint16) + \
        [routed_experts(8, dtype=np.uint16, seed=9).astype(">u2")]
    hashes = publish_request(mnt, arrays)
    expect_badmsg(mnt, request_text(hashes, token_end=40), "object 2 is >u2 (8,48,8)")


@pytest.mark.parametrize("shape, text", [
    ((16, 47, 8), "16,47,8"),
    ((16, 48, 6), "16,48,6"),
    ((16, 48), "16,48"),
    ((16, 48, 8, 1), "16,48,8,1"),
])
def test_shape_mismatch(mnt, shape, text):
    rng = np.random.default_rng(11)
    odd = rng.integers(0, 256, size=shape, dtype=np.uint8)
    arrays = [routed_experts(16, seed=1), odd, routed_experts(8, seed=2)]
    hashes = publish_request(mnt, arrays)
    expect_badmsg(mnt, request_text(hashes, token_end=40),
                  f"object 1 is |u1 ({text}), object 0 is |u1 (16,48,8) (Bad message)")


def test_shape_mismatch_in_the_tail(mnt):
    arrays = standard(rows=(16, 16)) + [routed_experts(8, layers=61, seed=9)]
    hashes = publish_request(mnt, arrays)
    expect_badmsg(mnt, request_text(hashes), "object 2 is |u1 (8,61,8)")


@pytest.mark.parametrize("token_end, reason", [
    (39, "object 2 has 8 rows, expected 7 (block_size 16, token_end 39)"),
    (33, "object 2 has 8 rows, expected 1 (block_size 16, token_end 33)"),
    (32, "object 2 has 8 rows, expected 0 (block_size 16, token_end 32)"),
    (20, "object 1 has 16 rows, expected 4 (block_size 16, token_end 20)"),
    (1, "object 0 has 16 rows, expected 1 (block_size 16, token_end 1)"),
])
def test_token_end_short(mnt, token_end, reason):
    hashes = publish_request(mnt, standard(rows=(16, 16, 8)))
    expect_badmsg(mnt, request_text(hashes, token_end=token_end), reason + " (Bad message)")


@pytest.mark.parametrize("token_end, reason", [
    (41, "object 2 has 8 rows, expected 9 (block_size 16, token_end 41)"),
    (48, "object 2 has 8 rows, expected 16 (block_size 16, token_end 48)"),
    (1000, "object 2 has 8 rows, expected 16 (block_size 16, token_end 1000)"),
])
def test_token_end_long(mnt, token_end, reason):
    hashes = publish_request(mnt, standard(rows=(16, 16, 8)))
    expect_badmsg(mnt, request_text(hashes, token_end=token_end), reason + " (Bad message)")


def test_token_end_long_after_full_blocks(mnt):
    # Every object is as it should be: only the rows' sum misses token_end.
    hashes = publish_request(mnt, standard(rows=(16, 16, 16)))
    expect_badmsg(mnt, request_text(hashes, token_end=64),
                  "objects hold 48 rows, token_end is 64 (Bad message)")
    expect_badmsg(mnt, request_text(hashes, token_end=49),
                  "objects hold 48 rows, token_end is 49 (Bad message)")


def test_token_end_huge(mnt):
    hashes = publish_request(mnt, standard(rows=(16, 16)))
    expect_badmsg(mnt, request_text(hashes, token_end=2**64 - 1),
                  f"objects hold 32 rows, token_end is {2**64 - 1} (Bad message)")


def test_extra_trailing_object(mnt):
    arrays = standard(rows=(16, 16, 8, 8))
    hashes = publish_request(mnt, arrays, kinds=["block", "block", "tail", "tail"])
    want3 = npy_bytes(np.concatenate(arrays[:3]))
    assert materialize(mnt, request_text(hashes[:3], token_end=40)) == want3
    expect_badmsg(mnt, request_text(hashes, token_end=40),
                  "object 3 has 8 rows, expected 0 (block_size 16, token_end 40) (Bad message)")
    # Without token_end the sum (48) makes the old tail short in the middle.
    expect_badmsg(mnt, request_text(hashes),
                  "object 2 has 8 rows, expected 16 (block_size 16, token_end 48)")


def test_extra_trailing_full_block(mnt):
    arrays = standard(rows=(16, 16, 16))
    hashes = publish_request(mnt, arrays)
    expect_badmsg(mnt, request_text(hashes, token_end=32),
                  "object 2 has 16 rows, expected 0 (block_size 16, token_end 32)")


# ---- ENOENT, EIO and their precedence --------------------------------------------------

def test_missing_object_is_enoent(mnt):
    hashes = publish_request(mnt, standard(rows=(16, 16, 8)))
    absent = block_hash(99, "absent")
    text = request_text([hashes[0], absent, hashes[2]], token_end=40)
    assert materialize(mnt, text) == "read:ENOENT"
    assert mnt.wait_log(f"materialize {WV}: object 1 ({absent}) does not exist "
                        "(No such file or directory)"), mnt.log()
    # Missing at the end, too.
    assert materialize(mnt, request_text(hashes + [absent])) == "read:ENOENT"
    assert mnt.wait_log(f"materialize {WV}: object 3 ({absent}) does not exist")


def test_unlinked_object_is_enoent(mnt):
    arrays = standard(rows=(16, 16, 8))
    hashes = publish_request(mnt, arrays)
    text = request_text(hashes, token_end=40)
    assert materialize(mnt, text) == npy_bytes(np.concatenate(arrays))
    os.unlink(mnt.path(WV, hashes[1]))
    assert materialize(mnt, text) == "read:ENOENT"
    assert mnt.wait_log(f"materialize {WV}: object 1 ({hashes[1]}) does not exist")


def test_missing_version_is_enoent_at_open(mnt):
    assert materialize(mnt, request_text(["aa"]), wv="nosuch") == "open:ENOENT"
    assert not os.path.exists(mnt.path("nosuch", MAT))


def test_corrupt_object_is_eio_and_recovers_in_a_new_open(mnt):
    arrays = standard(rows=(16, 16, 8))
    hashes = publish_request(mnt, arrays)
    want = npy_bytes(np.concatenate(arrays))
    text = request_text(hashes, token_end=40)
    failures = mnt.metrics()["artfs_checksum_failures_total"]
    flip_byte(mnt.store_file(WV, hashes[1]), offset_from_end=50)
    fd = os.open(mnt.path(WV, MAT), os.O_RDWR)
    try:
        os.write(fd, text.encode())
        with pytest.raises(OSError) as e:
            os.pread(fd, 4096, 0)
        assert e.value.errno == errno.EIO
        assert mnt.wait_log(f"materialize {WV}: object 1 ({hashes[1]}) cannot be served "
                            "(Input/output error)"), mnt.log()
        assert mnt.wait_log(f"read {WV}/{hashes[1]}: stored object fails verification")
        assert mnt.metrics()["artfs_checksum_failures_total"] > failures
        # Flipped back: the open transaction keeps its outcome...
        flip_byte(mnt.store_file(WV, hashes[1]), offset_from_end=50)
        with pytest.raises(OSError) as e:
            os.pread(fd, 4096, 0)
        assert e.value.errno == errno.EIO
    finally:
        os.close(fd)
    # ...and a new open of the same request succeeds.
    assert materialize(mnt, text) == want


@pytest.mark.parametrize("damage", ["payload", "header", "truncate"])
def test_other_store_damage_is_eio(mnt, damage):
    arrays = standard(rows=(16, 16, 8))
    hashes = publish_request(mnt, arrays)
    f = mnt.store_file(WV, hashes[2])
    if damage == "payload":
        flip_byte(f)
    elif damage == "header":
        with open(f, "r+b") as fh:
            fh.seek(20)
            fh.write(b"X")
    else:
        os.truncate(f, os.path.getsize(f) - 1)
    assert materialize(mnt, request_text(hashes)) == "read:EIO"
    assert mnt.wait_log(f"materialize {WV}: object 2 ({hashes[2]}) cannot be served")


def test_enoent_before_eio_before_ebadmsg(mnt):
    arrays = standard(rows=(16, 16, 8))
    # Object 1 is labelled wrong (EBADMSG), object 2 will be corrupt (EIO).
    hashes = publish_request(mnt, arrays, kinds=["block", "tail", "tail"])
    flip_byte(mnt.store_file(WV, hashes[2]))
    absent = block_hash(7, "absent")
    # A missing object after the corrupt one still wins.
    assert materialize(mnt, request_text(hashes + [absent])) == "read:ENOENT"
    assert materialize(mnt, request_text([absent] + hashes)) == "read:ENOENT"
    # Corruption wins over a layout error found before it.
    assert materialize(mnt, request_text(hashes, token_end=40)) == "read:EIO"
    # Wrong token_end too: still EIO.
    assert materialize(mnt, request_text(hashes, token_end=7)) == "read:EIO"
    flip_byte(mnt.store_file(WV, hashes[2]))
    assert materialize(mnt, request_text(hashes, token_end=40)) == "read:EBADMSG"
    # A malformed request is refused before any object is looked at.
    assert materialize(mnt, request_text([absent], token_end=0)) == "read:EINVAL"


# ---- malformed requests: EINVAL ---------------------------------------------------------

H = block_hash(0)
MALFORMED = {
    "nothing_written": "",
    "only_blank_lines": "\n \n\t\n",
    "only_token_end": "token_end 16\n",
    "only_keywords": "token_end 16\nblock_size 16\n",
    "unknown_keyword": f"token_start 16\n{H}\n",
    "keyword_uppercase": f"TOKEN_END 16\n{H}\n",
    "keyword_without_value": f"token_end\n{H}\n",
    "token_end_zero": f"token_end 0\n{H}\n",
    "token_end_negative": f"token_end -16\n{H}\n",
    "token_end_plus": f"token_end +16\n{H}\n",
    "token_end_not_a_number": f"token_end sixteen\n{H}\n",
    "token_end_hex": f"token_end 0x10\n{H}\n",
    "token_end_float": f"token_end 16.0\n{H}\n",
    "token_end_two_values": f"token_end 16 17\n{H}\n",
    "token_end_overflow": f"token_end 18446744073709551616\n{H}\n",
    "token_end_twice": f"token_end 16\ntoken_end 16\n{H}\n",
    "block_size_zero": f"block_size 0\n{H}\n",
    "block_size_negative": f"block_size -1\n{H}\n",
    "block_size_not_a_number": f"block_size x\n{H}\n",
    "block_size_twice": f"block_size 16\nblock_size 8\n{H}\n",
    "hash_uppercase": f"{H.upper()}\n",
    "hash_odd_length": f"{H[:-1]}\n",
    "hash_one_digit": "a\n",
    "hash_not_hex": f"{H[:-1]}g\n",
    "hash_too_long": "ab" * 65 + "\n",
    "hash_with_prefix": f"0x{H}\n",
    "two_hashes_on_a_line": f"{H} {H}\n",
    "line_too_long": "token_end " + "0" * 300 + "1\n" + H + "\n",
    "nul_byte": f"{H}\n\0\n",
    "nul_in_hash": f"{H[:10]}\0{H[11:]}\n",
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_request_is_einval(mnt, case):
    # The request would otherwise be a valid one: the object exists.
    publish_request(mnt, [routed_experts(16)], hashes=[H])
    assert materialize(mnt, MALFORMED[case]) == "read:EINVAL"
    assert mnt.wait_log(f"materialize {WV}: bad request: "), mnt.log()
    # The text without the fault is accepted.
    assert materialize(mnt, f"token_end 16\nblock_size 16\n{H}\n") == \
        npy_bytes(routed_experts(16))


def test_einval_reasons_in_the_log(mnt):
    os.makedirs(mnt.path(WV))
    for text, reason in [
        (f"color 3\n{H}\n", 'line 1: unknown keyword "color"'),
        (f"\n\ntoken_end 0\n{H}\n", "line 3: token_end needs one positive integer"),
        (f"{H}\nnot-a-hash\n", 'line 2: "not-a-hash" is not a block hash'),
        ("token_end 4\n", "no object hashes"),
    ]:
        assert materialize(mnt, text) == "read:EINVAL"
        assert mnt.wait_log(f"materialize {WV}: bad request: {reason} (Invalid argument)"), \
            (reason, mnt.log())


# ---- one transaction per open -----------------------------------------------------------

def test_each_open_is_its_own_transaction(mnt):
    a = standard(rows=(16, 16, 8), seed=60)
    b = standard(rows=(16, 5), seed=70)
    ha = publish_request(mnt, a, salt="a")
    hb = publish_request(mnt, b, salt="b")
    want_a, want_b = npy_bytes(np.concatenate(a)), npy_bytes(np.concatenate(b))
    fa = os.open(mnt.path(WV, MAT), os.O_RDWR)
    fb = os.open(mnt.path(WV, MAT), os.O_RDWR)
    try:
        # Interleaved: neither open sees the other's text.
        os.write(fa, request_text(ha)[:30].encode())
        os.write(fb, request_text(hb).encode())
        os.write(fa, request_text(ha)[30:].encode())
        assert read_all(fb) == want_b
        assert read_all(fa) == want_a
        # Writing after the first read is refused, and the result stays.
        with pytest.raises(OSError) as e:
            os.pwrite(fa, request_text(hb).encode(), 0)
        assert e.value.errno == errno.EINVAL
        with pytest.raises(OSError) as e:
            os.pwrite(fa, b"\n", len(request_text(ha)))
        assert e.value.errno == errno.EINVAL
        assert read_all(fa) == want_a
        assert read_all(fb) == want_b
    finally:
        os.close(fa)
        os.close(fb)
    assert mnt.wait_log(f"materialize {WV}: write refused (Invalid argument)")
    # A later open starts over.
    assert materialize(mnt, request_text(hb)) == want_b


def test_write_after_a_failed_read_is_einval_too(mnt):
    hashes = publish_request(mnt, standard(rows=(16, 8)))
    fd = os.open(mnt.path(WV, MAT), os.O_RDWR)
    try:
        with pytest.raises(OSError) as e:
            os.pread(fd, 4096, 0)  # nothing written yet: no hashes
        assert e.value.errno == errno.EINVAL
        with pytest.raises(OSError) as e:
            os.write(fd, request_text(hashes).encode())
        assert e.value.errno == errno.EINVAL
        with pytest.raises(OSError) as e:
            os.pread(fd, 4096, 0)
        assert e.value.errno == errno.EINVAL
    finally:
        os.close(fd)
    assert materialize(mnt, request_text(hashes)) == \
        npy_bytes(np.concatenate(standard(rows=(16, 8))))


def test_python_file_object_reopen(mnt):
    arrays = standard(rows=(16, 16, 8), seed=80)
    hashes = publish_request(mnt, arrays)
    want = npy_bytes(np.concatenate(arrays))
    p = mnt.path(WV, MAT)
    with open(p, "r+b") as f:
        f.write(request_text(hashes).encode())
        f.seek(0)
        assert f.read() == want
        f.seek(0)
        assert f.read() == want
    with open(p, "w+b") as f:
        f.write(request_text(hashes[:2]).encode())
        f.seek(0)
        assert f.read() == npy_bytes(np.concatenate(arrays[:2]))
    # The file itself is still empty: nothing was stored.
    assert os.stat(p).st_size == 0


def _materialize_loop(mountpoint, text, want_sha, rounds, barrier, out):
    barrier.wait()
    ok = 0
    for _ in range(rounds):
        fd = os.open(os.path.join(mountpoint, WV, MAT), os.O_RDWR)
        try:
            os.write(fd, text.encode())
            if hashlib.sha256(read_all(fd)).hexdigest() == want_sha:
                ok += 1
        finally:
            os.close(fd)
    out.put(ok)


def test_two_processes_materialize_different_requests_concurrently(mnt):
    a = standard(rows=[16] * 30 + [9], seed=200)
    b = standard(rows=[16] * 12 + [3], dtype=np.uint16, seed=300)
    ha = publish_request(mnt, a, salt="pa")
    hb = publish_request(mnt, b, salt="pb")
    want = {
        "a": hashlib.sha256(npy_bytes(np.concatenate(a))).hexdigest(),
        "b": hashlib.sha256(npy_bytes(np.concatenate(b))).hexdigest(),
    }
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(2)
    out = {k: ctx.Queue() for k in "ab"}
    rounds = 25
    procs = [
        ctx.Process(target=_materialize_loop,
                    args=(mnt.mountpoint, request_text(ha), want["a"], rounds, barrier, out["a"])),
        ctx.Process(target=_materialize_loop,
                    args=(mnt.mountpoint, request_text(hb), want["b"], rounds, barrier, out["b"])),
    ]
    for p in procs:
        p.start()
    results = {k: out[k].get(timeout=120) for k in "ab"}
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert results == {"a": rounds, "b": rounds}


# ---- the name -----------------------------------------------------------------------------

def test_materialize_is_hidden_but_stats(mnt):
    os.makedirs(mnt.path(WV))
    assert MAT not in os.listdir(mnt.path(WV))
    hashes = publish_request(mnt, standard(rows=(16, 8)))
    assert sorted(os.listdir(mnt.path(WV))) == sorted(hashes)
    st = os.stat(mnt.path(WV, MAT))
    assert stat.S_ISREG(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o666
    assert st.st_size == 0
    assert os.path.exists(mnt.path(WV, MAT))
    # Not at the root, not in .artfs.
    assert not os.path.exists(mnt.path(MAT))
    assert not os.path.exists(mnt.path(".artfs", MAT))


def test_materialize_cannot_be_removed_or_changed(mnt):
    os.makedirs(mnt.path(WV))
    p = mnt.path(WV, MAT)
    with pytest.raises(OSError) as e:
        os.unlink(p)
    assert e.value.errno == errno.EPERM
    assert os.stat(p).st_size == 0
    with pytest.raises(OSError) as e:
        os.chmod(p, 0o600)
    assert e.value.errno == errno.EPERM
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o666
    # Nothing it did reached the store.
    assert not os.path.exists(mnt.store_file(WV, MAT))
    # The version is still empty: rmdir works.
    os.rmdir(mnt.path(WV))
    assert not os.path.exists(mnt.path(WV))


def test_materialize_leaves_the_store_as_it_was(mnt):
    arrays = standard(rows=(16, 16, 8))
    hashes = publish_request(mnt, arrays)
    before = sorted(os.listdir(mnt.store_file(WV, "")))
    metrics_before = mnt.metrics()
    assert materialize(mnt, request_text(hashes)) == npy_bytes(np.concatenate(arrays))
    assert sorted(os.listdir(mnt.store_file(WV, ""))) == before
    assert sorted(os.listdir(mnt.path(WV))) == sorted(hashes)
    m = mnt.metrics()
    assert m["artfs_publishes_total"] == metrics_before["artfs_publishes_total"]
    assert m["artfs_checksum_failures_total"] == 0
    # Objects still read back as themselves.
    for h, arr in zip(hashes, arrays):
        assert read_result(mnt.path(WV, h)) == npy_bytes(arr)


# ---- more edges -----------------------------------------------------------------------------

def test_uncommitted_object_is_enoent(mnt):
    arrays = standard(rows=(16, 16, 8), seed=90)
    hashes = publish_request(mnt, arrays[:2])
    env = encode(WV, block_hash(2), arrays[2], kind="tail", source_token_start=32)
    hashes.append(block_hash(2))
    text = request_text(hashes, token_end=40)
    fd = os.open(mnt.path(WV, hashes[2]), os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        os.write(fd, env[:len(env) // 2])
        assert materialize(mnt, text) == "read:ENOENT"
        assert mnt.wait_log(f"materialize {WV}: object 2 ({hashes[2]}) does not exist")
        os.write(fd, env[len(env) // 2:])
    finally:
        os.close(fd)
    assert materialize(mnt, text) == npy_bytes(np.concatenate(arrays))


def test_many_objects_loaded_in_parallel(mnt):
    # Hundreds of objects: the daemon loads them on several threads; the
    # order of the result is still the order of the request.
    arrays = standard(layers=3, top_k=2, rows=[4] * 700 + [1], seed=1000)
    hashes = publish_request(mnt, arrays)
    want = npy_bytes(np.concatenate(arrays))
    assert materialize(mnt, request_text(hashes, token_end=2801)) == want
    # Reordering two objects' hashes is a layout error, not another array.
    swapped = list(hashes)
    swapped[500], swapped[501] = swapped[501], swapped[500]
    expect_badmsg(mnt, request_text(swapped),
                  "object 500 starts at token 2004, expected 2000 (Bad message)")
    # Corrupt objects far apart: EIO names the first in request order.
    flip_byte(mnt.store_file(WV, hashes[650]))
    flip_byte(mnt.store_file(WV, hashes[123]))
    assert materialize(mnt, request_text(hashes)) == "read:EIO"
    assert mnt.wait_log(f"materialize {WV}: object 123 ({hashes[123]}) cannot be served")
    flip_byte(mnt.store_file(WV, hashes[123]))
    flip_byte(mnt.store_file(WV, hashes[650]))
    assert materialize(mnt, request_text(hashes)) == want


def test_store_file_gone_behind_the_daemon_is_enoent_even_after_a_corrupt_one(mnt):
    # ENOENT before EIO: an object whose store file disappeared does not
    # exist (as a plain read of it says), whatever comes before it.
    arrays = standard(rows=(16, 16, 8), seed=95)
    hashes = publish_request(mnt, arrays)
    os.unlink(mnt.store_file(WV, hashes[2]))
    assert read_result(mnt.path(WV, hashes[2])) == "open:ENOENT"
    assert materialize(mnt, request_text(hashes)) == "read:ENOENT"
    flip_byte(mnt.store_file(WV, hashes[0]))
    assert materialize(mnt, request_text(hashes)) == "read:ENOENT"


def test_request_text_limit(mnt):
    hashes = publish_request(mnt, [routed_experts(16, seed=4)])
    limit = 8 << 20
    body = request_text(hashes).encode()
    text = b"\n" * (limit - len(body)) + body
    fd = os.open(mnt.path(WV, MAT), os.O_RDWR)
    try:
        for off in range(0, len(text), 1 << 20):
            os.write(fd, text[off:off + (1 << 20)])
        with pytest.raises(OSError) as e:
            os.write(fd, b"\n")
        assert e.value.errno == errno.EFBIG
        # The text up to the limit stands.
        assert read_all(fd) == npy_bytes(routed_experts(16, seed=4))
    finally:
        os.close(fd)


def test_non_sequential_write_is_einval(mnt):
    hashes = publish_request(mnt, standard(rows=(16, 8)))
    text = request_text(hashes).encode()
    fd = os.open(mnt.path(WV, MAT), os.O_RDWR)
    try:
        with pytest.raises(OSError) as e:
            os.pwrite(fd, text, 10)
        assert e.value.errno == errno.EINVAL
        os.pwrite(fd, text[:20], 0)
        with pytest.raises(OSError) as e:
            os.pwrite(fd, text[20:], 0)
        assert e.value.errno == errno.EINVAL
        os.pwrite(fd, text[20:], 20)
        assert read_all(fd) == npy_bytes(np.concatenate(standard(rows=(16, 8))))
    finally:
        os.close(fd)


def test_read_only_open_has_no_request(mnt):
    publish_request(mnt, standard(rows=(16, 8)))
    assert read_result(mnt.path(WV, MAT)) == "read:EINVAL"
    fd = os.open(mnt.path(WV, MAT), os.O_RDONLY)
    try:
        with pytest.raises(OSError) as e:
            os.write(fd, b"aa\n")
        assert e.value.errno == errno.EBADF
    finally:
        os.close(fd)


def test_version_removed_while_open(mnt):
    os.makedirs(mnt.path("gone"))
    fd = os.open(mnt.path("gone", MAT), os.O_RDWR)
    try:
        os.write(fd, b"aa\n")
        os.rmdir(mnt.path("gone"))
        with pytest.raises(OSError) as e:
            os.pread(fd, 4096, 0)
        assert e.value.errno == errno.ENOENT
    finally:
        os.close(fd)
    assert not os.path.exists(mnt.path("gone"))


def test_objects_indexed_at_restart_materialize(mnt):
    arrays = standard(rows=(16, 16, 8), seed=110)
    hashes = publish_request(mnt, arrays)
    want = npy_bytes(np.concatenate(arrays))
    mnt.restart()
    assert materialize(mnt, request_text(hashes, token_end=40)) == want
    mnt.restart()
    flip_byte(mnt.store_file(WV, hashes[1]))
    assert materialize(mnt, request_text(hashes, token_end=40)) == "read:EIO"


def test_truncating_materialize_does_not_touch_other_opens(mnt):
    arrays = standard(rows=(16, 16, 8), seed=120)
    hashes = publish_request(mnt, arrays)
    text = request_text(hashes).encode()
    p = mnt.path(WV, MAT)
    fd = os.open(p, os.O_RDWR)
    try:
        os.write(fd, text[:40])
        os.truncate(p, 0)  # what open(O_TRUNC) does: nothing to cut
        with open(p, "w+b") as f:
            f.write(request_text(hashes[:1]).encode())
            f.seek(0)
            assert f.read() == npy_bytes(arrays[0])
        os.write(fd, text[40:])
        assert read_all(fd) == npy_bytes(np.concatenate(arrays))
    finally:
        os.close(fd)
    with pytest.raises(OSError) as e:
        os.truncate(p, 10)
    assert e.value.errno == errno.EPERM
    assert os.stat(p).st_size == 0


def test_open_materialize_counts_as_an_open_file_of_its_version(mnt):
    hashes = publish_request(mnt, standard(rows=(16, 8)))
    gauge = f'artfs_version_open_files{{version="{WV}"}}'
    # (release after close is asynchronous in FUSE: the publishes' go soon.)
    assert wait_for(lambda: mnt.metrics()[gauge] == 0)
    fa = os.open(mnt.path(WV, MAT), os.O_RDWR)
    fb = os.open(mnt.path(WV, MAT), os.O_RDWR)
    try:
        assert mnt.metrics()[gauge] == 2
        os.write(fa, request_text(hashes).encode())
        assert isinstance(read_all(fa), bytes)
        with pytest.raises(OSError):
            read_all(fb)
        assert mnt.metrics()[gauge] == 2
    finally:
        os.close(fa)
        os.close(fb)
    assert wait_for(lambda: mnt.metrics()[gauge] == 0)


def test_open_materialize_keeps_its_version_from_expiring(make_mount):
    m = make_mount(ttl="1")
    arrays = standard(rows=(16, 8), seed=130)
    hashes = publish_request(m, arrays)
    fd = os.open(m.path(WV, MAT), os.O_RDWR)
    try:
        time.sleep(3)  # well past ttl: only the open file holds the version
        assert os.path.isdir(m.path(WV))
        os.write(fd, request_text(hashes).encode())
        assert read_all(fd) == npy_bytes(np.concatenate(arrays))
    finally:
        os.close(fd)
    # Closed, the version is idle and is collected.
    assert wait_for(lambda: not os.path.exists(m.path(WV)), timeout=10)
    assert m.wait_log(f"expire {WV}: idle")
