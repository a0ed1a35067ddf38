# SPDX-License-Identifier: Apache-2.0
"""What a batch publish (.put) may hold and how many records it takes
(DESIGN.md §3.7; README, "Choices"): the memory of every open batch file,
its queued records and its result lines alike, counts against
materialize_max= with the other transaction files'; a write that finds no
room fails with ENOMEM before any of its records is read. A batch takes
at most 1,048,576 records; the write that brings more is EFBIG, and the
result lines end with "- EFBIG"."""
import errno
import os

import pytest

from conftest import wait_for
from envelope import derive_key, encode, routed_experts

WV = "default"
RECORDS_MAX = 1 << 20


def key_hex(wv, h):
    return derive_key(wv, h).split("/", 1)[1]


def tiny(i):
    """A small, distinct envelope (one row of one layer, top_k 1)."""
    return encode(WV, "%08x" % i, routed_experts(1, layers=1, top_k=1, seed=i))


def test_open_batch_files_hold_no_more_than_materialize_max(make_mount):
    """Three .keys/.put files fed small writes of 16 records in turn: the
    memory they hold never passes materialize_max=; each in turn gets
    ENOMEM for a write of which nothing commits; every record of the
    writes before commits at fsync; closing gives everything back."""
    limit = 256 << 10
    m = make_mount(materialize_max=str(limit))
    fds = [os.open(m.path(".keys", ".put"), os.O_RDWR) for _ in range(3)]
    written = [[] for _ in fds]     # keys of the writes each file took
    refused = [None for _ in fds]   # the write each file refused: (keys, bytes)
    peak = n = 0
    try:
        for step in range(2000):
            live = [k for k in range(3) if refused[k] is None]
            if not live:
                break
            k = live[step % len(live)]
            recs = [tiny(n + j) for j in range(16)]
            keys = [key_hex(WV, "%08x" % (n + j)) for j in range(16)]
            n += 16
            try:
                assert os.write(fds[k], b"".join(recs)) == sum(map(len, recs))
                written[k] += keys
            except OSError as e:
                assert e.errno == errno.ENOMEM, e
                refused[k] = (keys, b"".join(recs))
            held = m.metrics()["artfs_materialize_held_bytes"]
            peak = max(peak, held)
            assert held <= limit
        assert all(r is not None for r in refused), "no write was refused within 2000"
        assert m.wait_log("has no room for its result lines"), m.log()
        for k, fd in enumerate(fds):
            os.fsync(fd)
            lines = os.pread(fd, 1 << 22, 0).decode().splitlines()
            assert lines == [f"{key} 0" for key in written[k]]
            assert m.metrics()["artfs_materialize_held_bytes"] <= limit
    finally:
        for fd in fds:
            os.close(fd)
    assert peak > limit // 2
    for k in range(3):
        for key in refused[k][0]:
            assert not os.path.exists(m.path(".keys", key))
        for key in written[k][::97]:
            assert os.path.exists(m.path(".keys", key))
    assert m.metrics()["artfs_objects"] == sum(map(len, written))
    # (RELEASE comes after close returns)
    assert wait_for(lambda: m.metrics()["artfs_materialize_held_bytes"] == 0)
    # Room again: a batch of what was refused commits whole.
    fd = os.open(m.path(".keys", ".put"), os.O_RDWR)
    try:
        os.write(fd, b"".join(r[1] for r in refused))
        os.fsync(fd)
        lines = os.pread(fd, 1 << 20, 0).decode().splitlines()
        assert lines == [f"{key} 0" for r in refused for key in r[0]]
    finally:
        os.close(fd)


def test_a_write_refused_for_memory_can_be_sent_again(make_mount):
    """A write refused with ENOMEM took nothing: the stream stays where it
    was, so the same bytes at the same offset go through once there is
    room (another batch file closed)."""
    limit = 128 << 10
    m = make_mount(materialize_max=str(limit))
    os.mkdir(m.path(WV))
    hog = os.open(m.path(".keys", ".put"), os.O_RDWR)
    fd = os.open(m.path(WV, ".put"), os.O_RDWR)
    try:
        n = 0
        while True:  # the hog takes the memory, write by write
            try:
                os.write(hog, b"".join(tiny(n + j) for j in range(16)))
            except OSError as e:
                assert e.errno == errno.ENOMEM
                break
            n += 16
            assert n < 100000
        data = b"".join(b"%08x\n" % (1 << 30 | i) +
                        encode(WV, "%08x" % (1 << 30 | i), routed_experts(2, seed=i))
                        for i in range(200))
        with pytest.raises(OSError) as e:
            os.write(fd, data)
        assert e.value.errno == errno.ENOMEM
        assert not os.path.exists(m.path(WV, "%08x" % (1 << 30)))
        os.close(hog)
        hog = None
        assert os.write(fd, data) == len(data)
        os.fsync(fd)
        lines = os.pread(fd, 1 << 20, 0).decode().splitlines()
        assert lines == [f"{key_hex(WV, '%08x' % (1 << 30 | i))} 0" for i in range(200)]
    finally:
        os.close(fd)
        if hog is not None:
            os.close(hog)
    assert wait_for(lambda: m.metrics()["artfs_materialize_held_bytes"] == 0)


def test_the_record_after_the_last_a_batch_holds_is_efbig(mnt):
    """1,048,576 records (the same object again and again: each is
    identical to what is stored, 0), then one more: the write that brings
    it is EFBIG, so are the writes after it; the result lines are one per
    record taken and a last "- EFBIG"; fsync and close say EFBIG, since
    every record before succeeded."""
    os.mkdir(mnt.path(WV))
    rec = b"00\n" + encode(WV, "00", routed_experts(1, layers=1, top_k=1))
    per_write = (1 << 20) // len(rec)
    chunk = rec * per_write
    line = f"{key_hex(WV, '00')} 0\n".encode()
    fd = os.open(mnt.path(WV, ".put"), os.O_RDWR)
    try:
        sent = 0
        while sent + per_write <= RECORDS_MAX:
            assert os.write(fd, chunk) == len(chunk)
            sent += per_write
        rest = RECORDS_MAX - sent
        assert os.write(fd, rec * rest) == len(rec) * rest  # exactly the last it holds
        for piece in (rec, chunk, rec):
            with pytest.raises(OSError) as e:
                os.write(fd, piece)
            assert e.value.errno == errno.EFBIG
        with pytest.raises(OSError) as e:
            os.fsync(fd)
        assert e.value.errno == errno.EFBIG
        size = RECORDS_MAX * len(line) + len(b"- EFBIG\n")
        text = os.pread(fd, size + 1, 0)
        assert len(text) == size
        assert text.count(line) == RECORDS_MAX
        assert text.endswith(line + b"- EFBIG\n")
    finally:
        with pytest.raises(OSError) as e:  # close says what fsync said
            os.close(fd)
        assert e.value.errno == errno.EFBIG
    assert mnt.wait_log(f"put {WV}: more than {RECORDS_MAX} records in one batch")
    assert mnt.metrics()["artfs_objects"] == 1
    assert wait_for(lambda: mnt.metrics()["artfs_materialize_held_bytes"] == 0)
