# SPDX-License-Identifier: Apache-2.0
"""Key-addressed access and batches through the mount: DESIGN.md §3.6, §3.7,
with the shell tools an operator uses and many processes at once."""
import errno
import os
import subprocess
import time

import pytest

from conftest import flip_byte, publish, read_result, run_processes, transact, wait_for
from envelope import derive_key, encode, npy_bytes, routed_experts

WV = "default"


def key_hex(wv, h):
    return derive_key(wv, h).split("/", 1)[1]


def pieces(data, sizes):
    """data cut into writes of the given sizes, cycled."""
    off = i = 0
    while off < len(data):
        yield data[off:off + sizes[i % len(sizes)]]
        off += sizes[i % len(sizes)]
        i += 1


def batch(path, data, chunk=None, end="fsync"):
    """Writes data to a batch file (in writes of chunk bytes, or of the sizes
    of a list of them, cycled) and ends the transaction: with fsync, or
    (end="read") with the read of the result lines from offset 0, after
    which a write is EINVAL. Returns (the errno of fsync, or of close after
    a read, result lines)."""
    fd = os.open(path, os.O_RDWR)
    rc = 0
    try:
        for piece in pieces(data, chunk if isinstance(chunk, list) else [chunk or len(data) or 1]):
            os.write(fd, piece)
        if end == "fsync":
            try:
                os.fsync(fd)
            except OSError as e:
                rc = e.errno
        lines = os.pread(fd, 1 << 20, 0).decode().splitlines()
        if end == "read":
            with pytest.raises(OSError) as e:
                os.write(fd, data[:1] or b"x")
            assert e.value.errno == errno.EINVAL
    finally:
        try:
            os.close(fd)
        except OSError as e:
            if end == "read":
                rc = e.errno
    return rc, lines


def get(mnt, keys):
    return transact(mnt.path(".keys", ".get"), "".join(k + "\n" for k in keys).encode())


def store_files(mnt):
    found = []
    for root, _, files in os.walk(os.path.join(mnt.store, "v")):
        found += [os.path.join(root, f) for f in files]
    return found


def test_shell_tools_see_every_object_by_key(mnt):
    os.mkdir(mnt.path(WV))
    env = encode(WV, "aa", routed_experts(16))
    assert publish(mnt.path(WV, "aa"), env) == 0
    k = key_hex(WV, "aa")
    assert subprocess.run(["ls", mnt.path(".keys")], capture_output=True, text=True).stdout.split() == [k]
    assert subprocess.run(["cat", mnt.path(".keys", k)], capture_output=True).stdout == env
    assert os.stat(mnt.path(".keys", k)).st_size == len(env)
    out = subprocess.run(["getfattr", "-d", mnt.path(".keys", k)], capture_output=True, text=True).stdout
    assert f'user.artfs.key="vllm-artifact/{k}"' in out
    # One object, one copy, one charge.
    assert len(store_files(mnt)) == 1
    assert mnt.metrics()["artfs_bytes_used"] == len(env)
    # Names that can never be keys are absent; .put and .get are not listed.
    assert read_result(mnt.path(".keys", "zz")) == "open:ENOENT"
    assert read_result(mnt.path(".keys", "0" * 64)) == "open:ENOENT"


def test_publish_by_key_then_by_path_gains_the_name(mnt):
    env = encode(WV, "bb", routed_experts(8))
    k = key_hex(WV, "bb")
    assert publish(mnt.path(".keys", k), env) == 0
    assert read_result(mnt.path(".keys", k)) == env
    assert os.listdir(mnt.mountpoint).count(WV) == 0  # it has only its key
    used = mnt.metrics()["artfs_bytes_used"]
    # The key in the header must be the file's name.
    assert publish(mnt.path(".keys", "1" * 64), env) in ("write:EBADMSG", "close:EBADMSG")
    # An identical publish by path: the object gains the name, no new copy.
    os.mkdir(mnt.path(WV))
    assert publish(mnt.path(WV, "bb"), env) == 0
    assert read_result(mnt.path(WV, "bb")) == npy_bytes(routed_experts(8))
    assert read_result(mnt.path(".keys", k)) == env
    m = mnt.metrics()
    assert m["artfs_bytes_used"] == used and m["artfs_objects"] == 1
    assert len(store_files(mnt)) == 1
    # Different content by key is a collision.
    other = encode(WV, "bb", routed_experts(8, seed=5))
    rc, lines = batch(mnt.path(".keys", ".put"), other)
    assert rc == errno.EEXIST and lines == [f"{k} EEXIST"]
    # Published objects are read-only under their key too.
    assert publish(mnt.path(".keys", k), env) == "open:EACCES"


def test_unlink_by_key_removes_both_names(mnt):
    os.mkdir(mnt.path(WV))
    assert publish(mnt.path(WV, "cc"), encode(WV, "cc", routed_experts(4))) == 0
    k = key_hex(WV, "cc")
    os.unlink(mnt.path(".keys", k))
    assert not os.path.exists(mnt.path(WV, "cc"))
    assert not os.path.exists(mnt.path(".keys", k))
    assert mnt.metrics()["artfs_objects"] == 0
    assert store_files(mnt) == []


def test_keys_survive_a_restart_and_key_only_objects_expire_together(make_mount):
    m = make_mount(ttl="3")
    os.mkdir(m.path(WV))
    assert publish(m.path(WV, "dd"), encode(WV, "dd", routed_experts(4))) == 0
    only = [encode(WV, h, routed_experts(4, seed=i)) for i, h in enumerate(("e0", "e1"))]
    rc, lines = batch(m.path(".keys", ".put"), b"".join(only))
    assert rc == 0 and len(lines) == 2
    m.restart()
    keys = sorted([key_hex(WV, "dd"), key_hex(WV, "e0"), key_hex(WV, "e1")])
    assert sorted(os.listdir(m.path(".keys"))) == keys
    assert get(m, [key_hex(WV, "e1"), key_hex(WV, "dd")]) == \
        only[1] + encode(WV, "dd", routed_experts(4))
    # The key-only objects share one clock: idle, they go together, and the
    # version's object stays while it is read.
    deadline = time.time() + 10
    while time.time() < deadline and len(os.listdir(m.path(".keys"))) > 1:
        read_result(m.path(WV, "dd"))
        time.sleep(0.3)
    assert os.listdir(m.path(".keys")) == [key_hex(WV, "dd")]
    # Their store directory, shards and all, goes through trash/.
    assert wait_for(lambda: os.listdir(os.path.join(m.store, "trash")) == [])
    assert not os.path.exists(os.path.join(m.store, "v", ".keys"))
    assert m.wait_log("expire .keys:")
    # The name is free again for a key-only publish.
    rc, lines = batch(m.path(".keys", ".put"), only[0])
    assert rc == 0 and lines == [f"{key_hex(WV, 'e0')} 0"]


def test_key_only_objects_lie_in_shards_and_a_flat_store_moves_into_them(make_mount):
    """Objects with only a key lie in v/.keys/<first digit>/<key>; a store
    from before shards (every such object at the top of v/.keys) is moved
    into them at the next start and every object reads back whole."""
    m = make_mount()
    envs = [encode(WV, "%02x" % i, routed_experts(4, seed=i)) for i in range(40)]
    keys = [key_hex(WV, "%02x" % i) for i in range(40)]
    rc, lines = batch(m.path(".keys", ".put"), b"".join(envs))
    assert rc == 0 and len(lines) == 40
    top = os.path.join(m.store, "v", ".keys")
    assert sorted(store_files(m)) == sorted(os.path.join(top, k[0], k) for k in keys)
    m.stop()
    for k in keys[:30]:  # as a daemon from before shards left them
        os.rename(os.path.join(top, k[0], k), os.path.join(top, k))
    with open(os.path.join(top, "not-an-object"), "w") as f:
        f.write("x")
    m.start()
    assert sorted(os.listdir(m.path(".keys"))) == sorted(keys)
    assert get(m, keys) == b"".join(envs)
    assert sorted(store_files(m)) == sorted([os.path.join(top, k[0], k) for k in keys]
                                            + [os.path.join(top, "not-an-object")])
    assert m.wait_log("not-an-object")
    # Removal and re-publication go through the shards too.
    os.unlink(m.path(".keys", keys[0]))
    assert not os.path.exists(os.path.join(top, keys[0][0], keys[0]))
    assert batch(m.path(".keys", ".put"), envs[0])[0] == 0
    assert get(m, keys[:1]) == envs[0]


def test_a_damaged_object_is_eio_by_key_and_in_get(mnt):
    os.mkdir(mnt.path(WV))
    for h in ("f0", "f1"):
        assert publish(mnt.path(WV, h), encode(WV, h, routed_experts(4))) == 0
    flip_byte(mnt.store_file(WV, "f1"))
    k0, k1 = key_hex(WV, "f0"), key_hex(WV, "f1")
    assert read_result(mnt.path(".keys", k1)) == "read:EIO"
    with pytest.raises(OSError) as e:
        get(mnt, [k0, k1])
    assert e.value.errno == errno.EIO
    with pytest.raises(OSError) as e:  # absence before damage
        get(mnt, [k1, "ab" * 32])
    assert e.value.errno == errno.ENOENT
    assert get(mnt, [k0, k0]) == 2 * encode(WV, "f0", routed_experts(4))
    assert mnt.metrics()["artfs_checksum_failures_total"] >= 2


def damage_header(path, text, replacement):
    """Replaces text in the stored envelope's JSON header (same length)."""
    assert len(text) == len(replacement)
    with open(path, "r+b") as f:
        data = f.read()
        at = data.index(text)
        f.seek(at)
        f.write(replacement)


@pytest.mark.parametrize("where", ["payload_sha256", "shape", "source_token_start"])
def test_a_damaged_header_is_eio_after_it_was_read_once(mnt, where):
    # Once an envelope has been read (and its header remembered by digest),
    # later reads check the header by that digest: damage there is EIO too,
    # even where it leaves valid JSON with a valid checksum field.
    os.mkdir(mnt.path(WV))
    arr = routed_experts(4)
    env = encode(WV, "c0", arr)
    assert publish(mnt.path(WV, "c0"), env) == 0
    k = key_hex(WV, "c0")
    assert get(mnt, [k]) == env
    with open(mnt.path(".keys", k), "rb") as f:
        assert f.read() == env
    store = mnt.store_file(WV, "c0")
    if where == "payload_sha256":
        head = env[4:4 + int.from_bytes(env[:4], "little")]
        digits = head.split(b'"payload_sha256":"')[1][:64]
        damage_header(store, digits, digits[:-1] + (b"0" if digits[-1:] != b"0" else b"1"))
    elif where == "shape":
        damage_header(store, b"[4,48,8]", b"[8,24,8]")
    else:
        damage_header(store, b'"source_token_start":0', b'"source_token_start":1')
    assert read_result(mnt.path(".keys", k)) == "read:EIO"
    with pytest.raises(OSError) as e:
        get(mnt, [k])
    assert e.value.errno == errno.EIO


def test_a_header_written_with_spaces_is_read_and_checked(mnt):
    # Not the canonical layout: the daemon cannot find the checksum field
    # by its bytes, so it parses that header on every read, and still
    # fails closed on damage.
    from envelope import header_fields, pack
    os.mkdir(mnt.path(WV))
    arr = routed_experts(4)
    env = pack(header_fields(WV, "c1", arr, "block", 0), arr.tobytes(), canonical=False)
    assert publish(mnt.path(WV, "c1"), env) == 0
    k = key_hex(WV, "c1")
    for _ in range(2):
        assert get(mnt, [k]) == env
    flip_byte(mnt.store_file(WV, "c1"))
    with pytest.raises(OSError) as e:
        get(mnt, [k])
    assert e.value.errno == errno.EIO


def test_a_key_only_object_laid_out_otherwise_gains_its_name_and_reads_back(mnt):
    # Published by key with spaces in its JSON, then by path in the
    # canonical layout: the same content, so the key-only file moves to the
    # name, and reads give the bytes stored (the first layout), unharmed by
    # the digest of the second publish's header.
    from envelope import header_fields, pack
    os.mkdir(mnt.path(WV))
    arr = routed_experts(4, seed=3)
    spaced = pack(header_fields(WV, "c2", arr, "block", 0), arr.tobytes(), canonical=False)
    k = key_hex(WV, "c2")
    rc, lines = batch(mnt.path(".keys", ".put"), spaced)
    assert rc == 0 and lines == [f"{k} 0"]
    assert publish(mnt.path(WV, "c2"), encode(WV, "c2", arr)) == 0
    for _ in range(2):
        assert get(mnt, [k]) == spaced
        with open(mnt.path(".keys", k), "rb") as f:
            assert f.read() == spaced
    assert read_result(mnt.path(WV, "c2")) == npy_bytes(arr)


def test_a_name_looked_up_before_a_batch_gave_it_reads_after(mnt):
    """A name looked up while absent, twice, and then given by a <wv>/.put
    (a new object, or a key-only one gaining the name) reads back at once:
    the absence of an object name is never cached by the kernel."""
    os.makedirs(mnt.path(WV))
    envs = {h: encode(WV, h, routed_experts(3, seed=i)) for i, h in enumerate(("c1", "c2"))}
    assert batch(mnt.path(".keys", ".put"), envs["c2"])[0] == 0   # c2: a key only
    for h in envs:
        assert read_result(mnt.path(WV, h)) == "open:ENOENT"
        assert read_result(mnt.path(WV, h)) == "open:ENOENT"
    rc, lines = batch(mnt.path(WV, ".put"), b"".join(h.encode() + b"\n" + e for h, e in envs.items()))
    assert rc == 0 and lines == [f"{key_hex(WV, h)} 0" for h in envs]
    for i, h in enumerate(envs):
        assert read_result(mnt.path(WV, h)) == npy_bytes(routed_experts(3, seed=i)), h
        assert h in os.listdir(mnt.path(WV))


@pytest.mark.parametrize("end", ["fsync", "read"])
def test_put_by_path_records_and_their_results(mnt, end):
    os.mkdir(mnt.path(WV))
    envs = {h: encode(WV, h, routed_experts(4, seed=i)) for i, h in enumerate(("a0", "a1", "a2"))}
    bad = encode(WV, "a3", routed_experts(4), payload_sha256="0" * 64)
    data = b"".join(h.encode() + b"\n" + e for h, e in envs.items())
    data += b"a3\n" + bad + b"zz\n" + envs["a0"] + b"a4\n" + envs["a0"]
    rc, lines = batch(mnt.path(WV, ".put"), data, chunk=3, end=end)
    assert rc == errno.EBADMSG
    assert lines[:3] == [f"{key_hex(WV, h)} 0" for h in envs]
    assert lines[3] == f"{key_hex(WV, 'a3')} EBADMSG"        # checksum
    assert lines[4] == "- EBADMSG"                           # not a hash
    assert lines[5] == f"{key_hex(WV, 'a4')} EBADMSG"        # the key of a0, not a4
    assert sorted(os.listdir(mnt.path(WV))) == ["a0", "a1", "a2"]
    # Again: identical records are 0, and nothing else changes.
    rc, lines = batch(mnt.path(WV, ".put"), b"".join(h.encode() + b"\n" + e for h, e in envs.items()),
                      end=end)
    assert rc == 0 and lines == [f"{key_hex(WV, h)} 0" for h in envs]
    assert mnt.metrics()["artfs_publishes_total"] == 3
    # A header that gives no length ends the batch; what came before stands.
    rc, lines = batch(mnt.path(WV, ".put"), b"b0\n" + encode(WV, "b0", routed_experts(4))
                      + b"b1\n" + b"\x05\x00\x00\x00{oops", end=end)
    assert rc == errno.EBADMSG and lines == [f"{key_hex(WV, 'b0')} 0", "- EBADMSG"]
    assert os.path.exists(mnt.path(WV, "b0"))


def _put_get_worker(mount, seed, seconds, q):
    """Publishes batches of fresh and repeated objects by key and reads them
    back with .get, comparing every byte."""
    wrong = done = 0
    deadline = time.time() + seconds
    i = 0
    while time.time() < deadline:
        hashes = ["%02x%04x" % (seed, (i + k) % 40) for k in range(16)]
        envs = [encode(WV, h, routed_experts(4, seed=int(h, 16) % 1000)) for h in hashes]
        i += 7
        fd = os.open(os.path.join(mount, ".keys", ".put"), os.O_RDWR)
        os.write(fd, b"".join(envs))
        os.fsync(fd)
        os.close(fd)
        keys = [key_hex(WV, h) for h in hashes]
        fd = os.open(os.path.join(mount, ".keys", ".get"), os.O_RDWR)
        os.write(fd, "".join(k + "\n" for k in keys).encode())
        out = bytearray()
        while True:
            b = os.pread(fd, 1 << 20, len(out))
            if not b:
                break
            out += b
        os.close(fd)
        wrong += bytes(out) != b"".join(envs)
        done += 1
    q.put((done, wrong))


def test_many_processes_put_and_get_at_once(mnt):
    results = run_processes(_put_get_worker, [(mnt.mountpoint, s % 3, 4) for s in range(6)], 60)
    assert sum(d for d, _ in results) > 6
    assert sum(w for _, w in results) == 0, results
    assert mnt.metrics()["artfs_objects"] == 3 * 40


# Batches queue their records and stage them side by side (src/r3/put*.c); these
# hold them to DESIGN.md §3.7: each record as a single publish, in order.
BIG_ROWS = 2800  # 2800 x 48 x 8 payload bytes: more than put.c buffers (1 MiB)


def test_put_records_across_many_writes_around_a_record_too_large_to_buffer(mnt):
    """Records cut at every place by writes of 1 byte to 64 KiB, more than one
    queue's worth of them, a record larger than the buffering bound in the
    middle, one key twice with identical content and one twice with
    different content: one line each, in order, each as a single publish."""
    os.mkdir(mnt.path(WV))
    arrays = {"%04x" % i: routed_experts(1 + i % 5, seed=i) for i in range(150)}
    records = [(h, a) for h, a in arrays.items()]
    big = ("beef01", routed_experts(BIG_ROWS, seed=7))
    records.insert(40, big)
    records.insert(90, ("0005", arrays["0005"]))                     # identical: 0
    records.insert(91, ("0006", routed_experts(2, seed=1234)))       # different: EEXIST
    data = b"".join(h.encode() + b"\n" + encode(WV, h, a) for h, a in records)
    before = mnt.metrics()
    rc, lines = batch(mnt.path(WV, ".put"), data, chunk=[1, 7, 4096, 65537, 3, 300])
    assert rc == errno.EEXIST
    want = [f"{key_hex(WV, h)} {'EEXIST' if i == 91 else '0'}" for i, (h, _) in enumerate(records)]
    assert lines == want
    assert len(encode(WV, *big)) > 1 << 20
    every = dict(arrays, beef01=big[1])
    assert sorted(os.listdir(mnt.path(WV))) == sorted(every)
    keys = [key_hex(WV, h) for h in every]
    assert get(mnt, keys) == b"".join(encode(WV, h, a) for h, a in every.items())
    assert read_result(mnt.path(WV, "beef01")) == npy_bytes(big[1])
    m = mnt.metrics()
    assert m["artfs_publishes_total"] - before["artfs_publishes_total"] == len(every)
    assert m["artfs_collisions_total"] - before["artfs_collisions_total"] == 1
    assert m["artfs_republish_identical_total"] - before["artfs_republish_identical_total"] == 1
    assert m["artfs_bytes_reserved"] == 0
    assert wait_for(lambda: mnt.metrics()["artfs_uploads_in_flight"] == 0)  # released after close
    # the batch's buffer is given back at its release, which follows close
    assert wait_for(lambda: mnt.metrics()["artfs_materialize_held_bytes"] == 0)


def test_put_large_writes_stage_records_as_they_are_read(mnt):
    """Writes of 40 to 200 KiB (each begins a flush that stages its records
    while the rest is read, put.c), records cut at every write's end, keys
    twice within one write (identical: 0; different: EEXIST; refused, then
    good), three queues' worth: one line each, in order, every byte back."""
    envs = [encode(WV, "%04x" % i, routed_experts(8 + i % 9, seed=i)) for i in range(200)]
    keys = [key_hex(WV, "%04x" % i) for i in range(200)]
    other = encode(WV, "%04x" % 7, routed_experts(5, seed=4321))
    bad = encode(WV, "%04x" % 150, routed_experts(3, seed=1), payload_sha256="0" * 64)
    data, want = [], []
    for i, e in enumerate(envs):
        if i == 150:
            data.append(bad)
            want.append(f"{keys[150]} EBADMSG")
        data.append(e)
        want.append(f"{keys[i]} 0")
        if i in (9, 60, 120):           # again, a few records later
            data.append(envs[i - 3])
            want.append(f"{keys[i - 3]} 0")
        if i == 11:
            data.append(other)
            want.append(f"{keys[7]} EEXIST")
    rc, lines = batch(mnt.path(".keys", ".put"), b"".join(data), chunk=[40961, 200003, 65537, 131071])
    assert rc == errno.EEXIST
    assert lines == want
    assert get(mnt, keys) == b"".join(envs)
    m = mnt.metrics()
    assert m["artfs_objects"] == 200
    # By path, in one write: every third record's key is held by a key-only
    # object (it gains the name), the others are new, one comes twice.
    os.mkdir(mnt.path(WV))
    more = {"%04x" % i: routed_experts(4, seed=i) for i in range(0, 400, 3)}
    more.update({"%04x" % i: routed_experts(8 + i % 9, seed=i) for i in range(0, 200, 3)})
    recs = list(more.items()) + [("0003", more["0003"])]
    data = b"".join(h.encode() + b"\n" + encode(WV, h, a) for h, a in recs)
    rc, lines = batch(mnt.path(WV, ".put"), data)
    assert rc == 0 and lines == [f"{key_hex(WV, h)} 0" for h, _ in recs]
    assert sorted(os.listdir(mnt.path(WV))) == sorted(more)
    for h in ("0000", "00c6", "0105", "018f"):
        assert read_result(mnt.path(WV, h)) == npy_bytes(more[h])
    m = mnt.metrics()
    assert m["artfs_objects"] == 200 + len([i for i in range(200, 400, 3)])
    assert m["artfs_bytes_reserved"] == 0
    assert wait_for(lambda: mnt.metrics()["artfs_uploads_in_flight"] == 0)  # released after close


def test_put_a_large_write_that_finds_the_queue_full_keeps_the_record_in_progress(make_mount):
    """Small writes (no flush of their own) queue ~16 MiB of records, and a
    write of 64 KiB arrives in the middle of the last one, when the queue's
    buffer has no room for it: the records before commit, the one in
    progress keeps its bytes, all read back exactly."""
    m = make_mount(capacity="256M")
    hl = len(encode(WV, "%04x" % 0, routed_experts(1))) - 384
    rows = (419000 - hl) // 384
    envs = [encode(WV, "%04x" % i, routed_experts(rows, seed=i)) for i in range(45)]
    size = len(envs[0])
    assert all(len(e) == size for e in envs) and 40 * size <= 16 << 20 < 41 * size
    data = b"".join(envs)
    at = (16 << 20) - 65536 + 1000           # inside record 39: the 64 KiB write lands here
    assert 39 * size < at < 40 * size
    sizes = [31000] * (at // 31000) + [at % 31000, 65536] + [31000] * 100
    rc, lines = batch(m.path(".keys", ".put"), data, chunk=sizes)
    keys = [key_hex(WV, "%04x" % i) for i in range(45)]
    assert rc == 0 and lines == [f"{k} 0" for k in keys]
    assert get(m, keys) == data
    assert m.metrics()["artfs_bytes_reserved"] == 0


@pytest.mark.parametrize("end", ["fsync", "read"])
def test_put_writes_that_end_where_the_queue_fills(mnt, end):
    """A write that ends with the queue's 64th record is answered before
    its records commit; the next request (a write of 64 more, whose first
    records repeat earlier keys, identical and different, or the end)
    waits for them. Then 64 records in one write each (a queue filled by
    writes too small to begin a flush), a large write, and the end: one
    line each, in order, every byte back."""
    n = 64
    envs = [encode(WV, "%04x" % i, routed_experts(16, seed=i)) for i in range(4 * n)]
    keys = [key_hex(WV, "%04x" % i) for i in range(4 * n)]
    other = encode(WV, "%04x" % 10, routed_experts(16, seed=999))
    recs = envs[:n] + [other, envs[20]] + envs[n:2 * n] + envs[2 * n:]
    want = ([f"{k} 0" for k in keys[:n]] + [f"{keys[10]} EEXIST", f"{keys[20]} 0"] +
            [f"{k} 0" for k in keys[n:]])
    sizes = ([sum(map(len, recs[:n])), sum(map(len, recs[n:2 * n + 2]))] +
             [len(e) for e in recs[2 * n + 2:3 * n + 2]] + [sum(map(len, recs[3 * n + 2:]))])
    assert sizes[0] >= 32 << 10 and sum(sizes) == sum(map(len, recs))
    rc, lines = batch(mnt.path(".keys", ".put"), b"".join(recs), chunk=sizes, end=end)
    assert rc == errno.EEXIST
    assert lines == want
    assert get(mnt, keys) == b"".join(envs)
    # Exactly one queue in one write, ended at once.
    more = [encode(WV, "%04x" % i, routed_experts(16, seed=i)) for i in range(4 * n, 5 * n)]
    rc, lines = batch(mnt.path(".keys", ".put"), b"".join(more), end=end)
    assert rc == 0 and lines == [f"{key_hex(WV, '%04x' % i)} 0" for i in range(4 * n, 5 * n)]
    m = mnt.metrics()
    assert m["artfs_objects"] == 5 * n and m["artfs_bytes_reserved"] == 0
    # The batch's publishes are released with its file, after close returns.
    assert wait_for(lambda: mnt.metrics()["artfs_uploads_in_flight"] == 0)


@pytest.mark.parametrize("end", ["fsync", "read"])
def test_put_by_key_with_a_large_record_and_a_key_twice(mnt, end):
    envs = [encode(WV, "%02x" % i, routed_experts(3, seed=i)) for i in range(70)]
    big = encode(WV, "beef02", routed_experts(BIG_ROWS, seed=3))
    other = encode(WV, "05", routed_experts(3, seed=555))
    data = envs[:3] + [big] + envs[3:] + [envs[0], other, big]
    rc, lines = batch(mnt.path(".keys", ".put"), b"".join(data), chunk=[65536, 1, 9999], end=end)
    assert rc == errno.EEXIST
    keys = [key_hex(WV, "%02x" % i) for i in range(70)]
    kb = key_hex(WV, "beef02")
    want = [f"{k} 0" for k in keys[:3]] + [f"{kb} 0"] + [f"{k} 0" for k in keys[3:]]
    want += [f"{keys[0]} 0", f"{keys[5]} EEXIST", f"{kb} 0"]
    assert lines == want
    assert get(mnt, keys + [kb]) == b"".join(envs) + big
    assert mnt.metrics()["artfs_objects"] == 71


def test_put_results_are_read_from_offset_0_or_after_the_end(mnt):
    """Only a read from offset 0 ends a batch; one from further on before
    the end is EINVAL and the batch goes on."""
    envs = [encode(WV, "%02x" % i, routed_experts(4, seed=i)) for i in range(3)]
    fd = os.open(mnt.path(".keys", ".put"), os.O_RDWR)
    try:
        os.write(fd, envs[0] + envs[1])
        with pytest.raises(OSError) as e:
            os.pread(fd, 100, 10)
        assert e.value.errno == errno.EINVAL
        os.write(fd, envs[2])
        lines = os.pread(fd, 1 << 20, 0).decode().splitlines()
        assert os.pread(fd, 1 << 20, len(lines[0]) + 1).decode().splitlines() == lines[1:]
    finally:
        os.close(fd)
    assert lines == [f"{key_hex(WV, '%02x' % i)} 0" for i in range(3)]
    assert get(mnt, [key_hex(WV, "%02x" % i) for i in range(3)]) == b"".join(envs)


def test_put_a_bad_record_then_the_same_key_good(mnt):
    """Same key twice in one batch, the first refused (checksum): the second
    commits, as it would after a failed single publish."""
    os.mkdir(mnt.path(WV))
    good = encode(WV, "c0", routed_experts(4))
    bad = encode(WV, "c0", routed_experts(4), payload_sha256="0" * 64)
    rc, lines = batch(mnt.path(WV, ".put"), b"c0\n" + bad + b"c0\n" + good + b"c0\n" + bad)
    k = key_hex(WV, "c0")
    assert rc == errno.EBADMSG and lines == [f"{k} EBADMSG", f"{k} 0", f"{k} EBADMSG"]
    assert read_result(mnt.path(WV, "c0")) == npy_bytes(routed_experts(4))


@pytest.mark.parametrize("end", ["fsync", "read"])
@pytest.mark.parametrize("cut_big", [False, True])
def test_put_a_last_record_cut_short_commits_nothing_of_itself(mnt, cut_big, end):
    os.mkdir(mnt.path(WV))
    envs = [encode(WV, "%02x" % i, routed_experts(4, seed=i)) for i in range(5)]
    last = encode(WV, "ff", routed_experts(BIG_ROWS if cut_big else 4, seed=9))
    data = b"".join(b"%02x\n" % i + e for i, e in enumerate(envs)) + b"ff\n" + last[:len(last) // 2]
    before = mnt.metrics()['artfs_rejected_total{reason="truncated"}']
    rc, lines = batch(mnt.path(WV, ".put"), data, chunk=5000, end=end)
    assert rc == errno.EBADMSG
    assert lines == [f"{key_hex(WV, '%02x' % i)} 0" for i in range(5)] + [f"{key_hex(WV, 'ff')} EBADMSG"]
    assert sorted(os.listdir(mnt.path(WV))) == ["%02x" % i for i in range(5)]
    m = mnt.metrics()
    assert m['artfs_rejected_total{reason="truncated"}'] == before + 1
    assert m["artfs_bytes_reserved"] == 0
    # its buffer is given back at its release, which the kernel sends after close
    assert wait_for(lambda: mnt.metrics()["artfs_materialize_held_bytes"] == 0)


def test_put_fills_the_store_in_the_middle_of_a_batch(make_mount):
    """ENOSPC mid-batch: the records before it are committed, it and the
    large ones after it are ENOSPC, and a small one after them still fits,
    exactly as one publish after another would go."""
    m = make_mount(capacity="64K")
    os.mkdir(m.path(WV))
    envs = [encode(WV, "%02x" % i, routed_experts(16, seed=i)) for i in range(14)]
    tiny = encode(WV, "aa", routed_experts(1, layers=8))
    size = len(envs[0])
    fit = (64 << 10) // size
    assert fit < len(envs) and (64 << 10) - fit * size >= len(tiny)
    data = b"".join(b"%02x\n" % i + e for i, e in enumerate(envs)) + b"aa\n" + tiny
    rc, lines = batch(m.path(WV, ".put"), data, chunk=[8192, 1])
    assert rc == errno.ENOSPC
    want = [f"{key_hex(WV, '%02x' % i)} {'0' if i < fit else 'ENOSPC'}" for i in range(len(envs))]
    assert lines == want + [f"{key_hex(WV, 'aa')} 0"]
    assert sorted(os.listdir(m.path(WV))) == sorted(["%02x" % i for i in range(fit)] + ["aa"])
    met = m.metrics()
    assert met["artfs_bytes_used"] == fit * size + len(tiny)
    assert met["artfs_bytes_reserved"] == 0
    assert met['artfs_rejected_total{reason="no_space"}'] == len(envs) - fit


def test_put_never_refuses_a_record_for_room_that_later_records_hold(make_mount):
    """The store has room for exactly the first record of a batch and for
    none of the small ones after it: the first commits and the others are
    ENOSPC, every time, however the batch's records are staged."""
    m = make_mount(capacity="64K")
    os.mkdir(m.path(WV))
    # Records before it that need no room: identical to committed ones.
    again = [encode(WV, "%02x" % i, routed_experts(2, layers=8, seed=i)) for i in range(30)]
    olds = b"".join(b"%02x\n" % i + e for i, e in enumerate(again))
    assert batch(m.path(WV, ".put"), olds)[0] == 0
    assert publish(m.path(WV, "ff"), encode(WV, "ff", routed_experts(80))) == 0
    tinies = [encode(WV, "%04x" % i, routed_experts(1, layers=8, seed=i)) for i in range(20)]
    for r in range(12):
        room = (64 << 10) - m.metrics()["artfs_bytes_used"]
        h = "ab%02x" % r
        rows = (room - len(encode(WV, h, routed_experts(1, layers=8))) + 64) // 64 + 1
        while len(first := encode(WV, h, routed_experts(rows, layers=8, seed=r))) > room:
            rows -= 1
        assert room - len(first) < min(map(len, tinies))
        data = olds + h.encode() + b"\n" + first
        data += b"".join(b"%04x\n" % i + e for i, e in enumerate(tinies))
        rc, lines = batch(m.path(WV, ".put"), data)
        assert rc == errno.ENOSPC
        assert lines == ([f"{key_hex(WV, '%02x' % i)} 0" for i in range(30)] + [f"{key_hex(WV, h)} 0"]
                         + [f"{key_hex(WV, '%04x' % i)} ENOSPC" for i in range(20)])
        os.unlink(m.path(WV, h))
    assert m.metrics()["artfs_bytes_reserved"] == 0


def test_a_batch_buffers_within_its_bound(mnt):
    """A batch holds the bytes of the records it has queued, charged with
    the other transaction files' memory, and gives them back at close.
    Records come one write each: a write of several is staged from the
    write itself and committed before it returns, and holds nothing."""
    envs = [encode(WV, "%04x" % i, routed_experts(16, seed=i)) for i in range(40)]
    fd = os.open(mnt.path(".keys", ".put"), os.O_RDWR)
    try:
        for e in envs:
            assert os.write(fd, e) == len(e)
        held = mnt.metrics()["artfs_materialize_held_bytes"]
        assert sum(map(len, envs)) <= held <= 16 << 20
        os.fsync(fd)
        assert os.pread(fd, 1 << 20, 0).decode().split()[1::2] == ["0"] * len(envs)
    finally:
        os.close(fd)
    # the kernel sends the release after close returns
    assert wait_for(lambda: mnt.metrics()["artfs_materialize_held_bytes"] == 0, timeout=10)
