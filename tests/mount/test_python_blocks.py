# SPDX-License-Identifier: Apache-2.0
"""artfs.vllm's ArtfsBlockObjectStore and get_concatenated: upstream vLLM's
auxiliary-output store over .blocks/ (DESIGN.md §10), called the way
vLLM's publish_routed_experts and materialize_routed_experts call it; and
register() against the stand-in of vLLM's auxiliary-output worker in
vllm_standin/ (vLLM itself is not installed here).

Tests that need the daemon's .blocks/ take the `bmnt` fixture or call
with_blocks, which fail when the mounted daemon lacks it. The others
(keys, records, the plugin with a mount faked) run without a daemon."""
import errno
import hashlib
import logging
import os
import random
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from conftest import run_processes, wait_for

HERE = os.path.dirname(os.path.abspath(__file__))
STANDIN = os.path.join(HERE, "vllm_standin")
PACKAGE = os.path.join(HERE, "..", "..", "contrib", "python")
sys.path[:0] = [STANDIN, PACKAGE]

import artfs.vllm  # noqa: E402
from artfs import blocks  # noqa: E402
from artfs.vllm import ArtfsBlockObjectStore, get_concatenated  # noqa: E402
from vllm.distributed.aux_output_connector import store as vllm_store  # noqa: E402
from vllm.distributed.aux_output_connector import worker as vllm_worker  # noqa: E402
from vllm.distributed.aux_output_connector.routed_experts import (  # noqa: E402
    materialize_routed_experts,
    publish_routed_experts,
    routed_experts_keys,
)
from vllm.distributed.aux_output_connector.store import (  # noqa: E402
    BackgroundBlockObjectStore,
    BlockObject,
    BlockObjectStoreError,
)
from vllm.distributed.artifact_connector import connector as vllm_connector  # noqa: E402

# vLLM's shapes: hash blocks of 16 tokens, 48 layers, top-8 of 128 experts
# (uint8), and of 512 experts (uint16).
BLOCK, LAYERS, TOP_K = 16, 48, 8
U8 = (np.dtype("uint8"), 128)
U16 = (np.dtype("uint16"), 512)
HEX64 = "0123456789abcdef" * 4


def with_blocks(m):
    """m, whose daemon serves .blocks/ (DESIGN.md §10): these tests fail,
    not skip, without it."""
    assert os.path.isdir(m.path(".blocks")), "the daemon serves no .blocks/ directory"
    return m


@pytest.fixture
def bmnt(mnt):
    return with_blocks(mnt)


def hashes(n, seed=0):
    """n block hashes of 32 bytes, as vLLM's sha256 prefix-cache hashes are."""
    rng = random.Random(seed)
    return [rng.randbytes(32) for _ in range(n)]


def request_rows(blocks_, dtype_experts, seed=0):
    """The routed experts of a request of blocks_ full hash blocks."""
    dtype, experts = dtype_experts
    rng = np.random.default_rng(seed)
    return rng.integers(0, experts, (blocks_ * BLOCK, LAYERS, TOP_K), dtype=dtype)


def nbytes(dtype_experts):
    return BLOCK * LAYERS * TOP_K * dtype_experts[0].itemsize


def publish(store, keys, rows):
    """The full blocks of one request, put as vLLM's worker puts them."""
    publish_routed_experts(store, batches=[(keys, [(s, rows[s:s + BLOCK])
                                                   for s in range(0, len(rows), BLOCK)])],
                           block_size=BLOCK)


def materialize(store, keys, dtype):
    return materialize_routed_experts(store, keys, shape_per_token=(LAYERS, TOP_K), dtype=dtype)


def payload_of(key, size):
    """Bytes determined by the key (many writers of a key agree on them)."""
    seed = hashlib.sha256(key.encode()).digest()
    return (seed * (size // 32 + 1))[:size]


def stored_file(m, payload):
    """The file in the daemon's store that holds payload."""
    for root, _dirs, files in os.walk(m.store):
        for name in files:
            path = os.path.join(root, name)
            if os.path.getsize(path) >= len(payload):
                with open(path, "rb") as f:
                    if payload in f.read():
                        return path
    raise AssertionError("no file in the store holds the block")


def flip_inside(path, payload):
    """Damages one byte in the middle of payload where it lies in path."""
    with open(path, "r+b") as f:
        data = f.read()
        at = data.index(payload) + len(payload) // 2
        f.seek(at)
        f.write(bytes([data[at] ^ 0x40]))


class Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines = []

    def emit(self, record):
        self.lines.append((record.levelno, record.getMessage()))


@pytest.fixture
def vllm_log():
    """What reaches vLLM's logger (it does not propagate to the root one)."""
    handler = Lines()
    logger = logging.getLogger("vllm")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield handler.lines
    logger.removeHandler(handler)
    logger.setLevel(level)


@pytest.fixture
def plugin():
    """The names register() rebinds, given back as they were after the test."""
    names = [(vllm_store, "BlockObjectStore"), (vllm_worker, "BlockObjectStore"),
             (vllm_connector, "LocalSharedMemoryArtifactStore"),
             (vllm_connector, "LocalSharedMemoryArtifactReader"),
             (artfs.vllm, "_registered_mount")]
    saved = [getattr(module, name) for module, name in names]
    yield
    for (module, name), value in zip(names, saved):
        setattr(module, name, value)


# ---- without a daemon ---------------------------------------------------------------------

def test_the_classes_are_vllms_own_when_vllm_imports():
    assert artfs.vllm.VLLM_BLOCK_CLASSES
    assert artfs.vllm.BlockObject is vllm_store.BlockObject
    assert artfs.vllm.BlockObjectStoreError is vllm_store.BlockObjectStoreError


def test_same_named_classes_without_vllm():
    code = textwrap.dedent("""
        import artfs.vllm as v
        assert not v.VLLM_BLOCK_CLASSES
        assert issubclass(v.BlockObjectStoreError, RuntimeError)
        o = v.BlockObject("k", b"p")
        assert (o.key, o.payload) == ("k", b"p")
        print(v.BlockObjectStoreError.__module__, v.BlockObject.__module__)
    """)
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=PACKAGE),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["artfs._vllm_fallback"] * 2


@pytest.mark.parametrize("key", [
    "vllm-artifact/0/" + HEX64, "vllm-artifact/1/" + HEX64, "r3-tail:" + HEX64[:32], "a",
    "A.b:c-d/e_f", "x" * 255 + "/" + "y" * 254 + "/z", "x" * 255, "/".join(["ab"] * 100) + "/c", "..a/b..", ".hidden/x", "a/.put"])
def test_keys_that_name_a_block(key):
    assert blocks.key_problem(key) is None


@pytest.mark.parametrize("key", [
    "", "x" * 256, "a/" + "x" * 256, "x" * 255 + "/" + "y" * 255 + "/z", "a//b", "/a", "a/", "a/./b", "./a", "../a", "a/..", "a b", "a\nb",
    "caf\u00e9", "a\x00b", b"vllm-artifact/0/00", None, 7, ".put", ".get", ".get/x"])
def test_keys_that_do_not(key):
    assert blocks.key_problem(key)


def test_a_put_writes_each_record_as_key_length_payload(tmp_path, monkeypatch):
    """The bytes of a .put, taken by a plain file in place of the daemon's
    transaction file."""
    os.mkdir(tmp_path / ".blocks")
    (tmp_path / ".blocks" / ".put").write_bytes(b"")
    records = [("vllm-artifact/0/" + HEX64, b"\x01" * 3), ("r3-tail:ab", bytearray(b"xy")),
               ("k", memoryview(np.arange(4, dtype=np.uint16)))]
    answer = b"".join(k.encode() + b" 0\n" for k, _ in records)
    monkeypatch.setattr(blocks, "_end_batch", lambda fd, expect: answer)
    assert blocks.put(records, str(tmp_path)) == [0, 0, 0]
    want = b"".join(k.encode() + b"\n" + len(bytes(p)).to_bytes(8, "little") + bytes(p)
                    for k, p in records)
    assert (tmp_path / ".blocks" / ".put").read_bytes() == want


@pytest.mark.parametrize(("answer", "what"), [
    (b"a 0\n", "2 blocks: the daemon answered 1"),
    (b"a 0\nc 0\n", "asked b"),
    (b"a 0\nb ENOTANERRNO\n", "unexpected result"),
])
def test_result_lines_that_do_not_answer_the_records_are_eio(answer, what):
    with pytest.raises(OSError) as e:
        blocks._parse_results(answer, ["a", "b"], "/m/.blocks/.put")
    assert e.value.errno == errno.EIO and what in str(e.value)
    assert blocks._parse_results(b"a 0\nb ENOSPC\n", ["a", "b"], "p") == [0, errno.ENOSPC]
    assert blocks._parse_results(b"a 28\nb EEXIST\n", ["a", "b"], "p") == [28, errno.EEXIST]


def test_the_store_checks_its_sizes_as_vllms_does(tmp_path):
    os.mkdir(tmp_path / ".blocks")
    with pytest.raises(ValueError, match="positive"):
        ArtfsBlockObjectStore(max_bytes=100, object_nbytes=0, mount=str(tmp_path))
    with pytest.raises(ValueError, match="at least one object"):
        ArtfsBlockObjectStore(max_bytes=99, object_nbytes=100, mount=str(tmp_path))
    store = ArtfsBlockObjectStore(max_bytes=1 << 20, object_nbytes=100, mount=str(tmp_path))
    with pytest.raises(ValueError, match="101 bytes"):
        store.put([BlockObject("k", b"x" * 101)])
    with pytest.raises(ValueError, match="0 bytes"):
        store.put([BlockObject("k", b"")])
    assert store.get_concatenated([]) == b""
    store.put([])  # nothing to send, nothing sent
    store.put([], retain_keys=["k"], release_keys=["k"])
    store.close()
    store.close()
    with pytest.raises(RuntimeError, match="closed"):
        store.put([BlockObject("k", b"x")])
    with pytest.raises(RuntimeError, match="closed"):
        store.get_concatenated(["k"])


def test_a_store_needs_a_mount_with_blocks(tmp_path):
    with pytest.raises(BlockObjectStoreError, match="serves .blocks/"):
        ArtfsBlockObjectStore(mount=str(tmp_path))
    with pytest.raises(BlockObjectStoreError, match="serves .blocks/") as e:
        get_concatenated(["k"], mount=str(tmp_path))
    assert e.value.__cause__.errno == errno.ENOENT


def test_bad_keys_are_refused_before_anything_is_sent(tmp_path):
    os.mkdir(tmp_path / ".blocks")  # no .put or .get: sending anything fails otherwise
    store = ArtfsBlockObjectStore(mount=str(tmp_path))
    for key in ("a/../b", "", "x y", "x" * 513, b"k", ".put"):
        with pytest.raises(BlockObjectStoreError, match="cannot be stored"):
            store.put([BlockObject("good", b"1"), BlockObject(key, b"2")])
        with pytest.raises(BlockObjectStoreError, match="does not exist"):
            store.get_concatenated(["good", key])


def _fake_mount(tmp_path, monkeypatch, *dirs):
    """tmp_path as an artfs mount serving dirs (as /proc/mounts would say)."""
    for d in dirs:
        os.mkdir(tmp_path / d)
    monkeypatch.setattr(artfs.vllm, "is_artfs_mount", lambda path: path == str(tmp_path))
    monkeypatch.delenv(artfs.vllm.DISABLE_ENV, raising=False)
    monkeypatch.setenv("ARTFS_MOUNT", str(tmp_path))
    return str(tmp_path)


def _worker(**kw):
    return vllm_worker.AuxOutputWorkerConnector(shape_per_token=(LAYERS, TOP_K), dtype="uint8",
                                                block_size=BLOCK, **kw)


def test_register_makes_the_worker_build_the_artfs_store(plugin, tmp_path, monkeypatch,
                                                         vllm_log):
    mnt = _fake_mount(tmp_path, monkeypatch, ".keys", ".blocks")
    assert artfs.vllm.register() is True
    assert artfs.vllm.register() is True  # vLLM may load plugins more than once
    said = [m for level, m in vllm_log if level >= logging.INFO]
    assert len(said) == 1, said
    assert mnt in said[0] and "auxiliary outputs" in said[0] and "artifact connector" in said[0]
    assert "ARTFS_VLLM_DISABLE" in said[0]
    # The worker calls BlockObjectStore by the name it imported: rebound there
    # (imported already) and in the store module (for a worker imported later).
    assert vllm_worker.BlockObjectStore is vllm_store.BlockObjectStore
    assert issubclass(vllm_worker.BlockObjectStore, ArtfsBlockObjectStore)
    worker = _worker(max_bytes=1 << 20)
    inner = worker._store._store
    assert isinstance(inner, ArtfsBlockObjectStore)
    assert (inner.mount, inner.max_bytes, inner.object_nbytes) == (mnt, 1 << 20, nbytes(U8))
    worker.close()
    # The seed's connector path is switched as before.
    assert vllm_connector.LocalSharedMemoryArtifactStore is artfs.vllm._ConnectorStore


def test_register_leaves_the_worker_alone_where_it_should(plugin, tmp_path, monkeypatch,
                                                          vllm_log):
    original = vllm_store.BlockObjectStore
    # No artfs mount.
    monkeypatch.setenv("ARTFS_MOUNT", str(tmp_path))
    monkeypatch.delenv(artfs.vllm.DISABLE_ENV, raising=False)
    assert artfs.vllm.register() is False
    # Turned off.
    _fake_mount(tmp_path, monkeypatch, ".blocks")
    for value in ("1", "yes"):
        monkeypatch.setenv(artfs.vllm.DISABLE_ENV, value)
        assert artfs.vllm.register() is False
    assert not [m for level, m in vllm_log if level >= logging.INFO]
    assert vllm_worker.BlockObjectStore is original and vllm_store.BlockObjectStore is original
    worker = _worker()
    assert type(worker._store._store) is original
    worker.close()


def test_register_refuses_a_daemon_without_blocks(plugin, tmp_path, monkeypatch, vllm_log):
    original = vllm_store.BlockObjectStore
    _fake_mount(tmp_path, monkeypatch, ".keys")
    assert artfs.vllm.register() is True  # the artifact connector only
    assert vllm_worker.BlockObjectStore is original and vllm_store.BlockObjectStore is original
    assert any(level == logging.WARNING and "no .blocks/" in m for level, m in vllm_log)
    said = [m for level, m in vllm_log if level == logging.INFO]
    assert len(said) == 1 and "auxiliary outputs" not in said[0]


# ---- through a real mount -------------------------------------------------------------------

@pytest.mark.parametrize("dtype_experts", [U8, U16], ids=["uint8", "uint16"])
def test_blocks_round_trip_as_vllm_publishes_and_materializes(bmnt, dtype_experts):
    dtype = dtype_experts[0]
    store = ArtfsBlockObjectStore(max_bytes=1 << 30, object_nbytes=nbytes(dtype_experts),
                                  mount=bmnt.mountpoint)
    hs = hashes(5)
    rows = {ns: request_rows(5, dtype_experts, seed=int(ns)) for ns in ("0", "1")}
    keys = {ns: routed_experts_keys(hs, ns) for ns in ("0", "1")}
    for ns in ("0", "1"):  # the same hashes in two namespaces: other keys, other blocks
        publish(store, keys[ns], rows[ns])
    for ns in ("0", "1"):
        np.testing.assert_array_equal(materialize(store, keys[ns], dtype), rows[ns])
        np.testing.assert_array_equal(materialize(store, keys[ns][2:4], dtype),
                                      rows[ns][2 * BLOCK:4 * BLOCK])
    # Each block is a file of its key, raw bytes.
    assert blocks.read(keys["1"][3], bmnt.mountpoint) == rows["1"][3 * BLOCK:4 * BLOCK].tobytes()
    assert os.path.isfile(bmnt.path(".blocks", "vllm-artifact", "0", hs[0].hex()))
    store.close()


def test_behind_vllms_writer_thread(bmnt):
    store = BackgroundBlockObjectStore(ArtfsBlockObjectStore(object_nbytes=nbytes(U8),
                                                             mount=bmnt.mountpoint),
                                       max_pending_batches=4)
    rows = request_rows(8, U8)
    keys = routed_experts_keys(hashes(8), "0")
    for i in range(0, 8, 2):
        publish_routed_experts(store, batches=[(keys, [(s, rows[s:s + BLOCK])
                                                       for s in (i * BLOCK, (i + 1) * BLOCK)])],
                               block_size=BLOCK, retain_keys=keys[i:i + 2],
                               release_keys=keys[i:i + 2])
    np.testing.assert_array_equal(materialize(store, keys, U8[0]), rows)
    store.close()


def test_order_and_repeats(bmnt):
    store = ArtfsBlockObjectStore(mount=bmnt.mountpoint)
    keys = [f"vllm-artifact/0/{h.hex()}" for h in hashes(4)]
    data = {k: payload_of(k, 6144) for k in keys}
    store.put([BlockObject(k, data[k]) for k in keys])
    ask = [keys[2], keys[0], keys[2], keys[3], keys[1], keys[2], keys[0]]
    assert store.get_concatenated(ask) == b"".join(data[k] for k in ask)
    assert get_concatenated(ask, mount=bmnt.mountpoint) == b"".join(data[k] for k in ask)
    assert store.get_concatenated([keys[1]] * 50) == data[keys[1]] * 50


def test_a_missing_key_does_not_exist(bmnt):
    store = ArtfsBlockObjectStore(object_nbytes=64, mount=bmnt.mountpoint)
    there = "vllm-artifact/0/" + "aa" * 32
    missing = "vllm-artifact/0/" + "bb" * 32
    store.put([BlockObject(there, b"x" * 64)])
    for ask in ([missing], [there, missing, there]):
        with pytest.raises(BlockObjectStoreError, match="does not exist") as e:
            store.get_concatenated(ask)
        assert missing in str(e.value)
        assert e.value.__cause__.errno == errno.ENOENT
    with pytest.raises(BlockObjectStoreError, match="does not exist"):
        materialize_routed_experts(store, [missing], shape_per_token=(8,), dtype=np.uint8)
    with pytest.raises(BlockObjectStoreError, match="does not exist"):
        get_concatenated([missing], mount=bmnt.mountpoint)
    assert store.get_concatenated([there]) == b"x" * 64


def test_a_damaged_block_fails_closed(bmnt):
    store = ArtfsBlockObjectStore(object_nbytes=nbytes(U8), mount=bmnt.mountpoint)
    keys = routed_experts_keys(hashes(3), "0")
    rows = request_rows(3, U8)
    publish(store, keys, rows)
    damaged = rows[BLOCK:2 * BLOCK].tobytes()
    flip_inside(stored_file(bmnt, damaged), damaged)
    for ask in ([keys[1]], keys):
        with pytest.raises(BlockObjectStoreError, match="failed its check") as e:
            store.get_concatenated(ask)
        assert e.value.__cause__.errno == errno.EIO and keys[1] in str(e.value)
    with pytest.raises(OSError) as e:
        blocks.read(keys[1], bmnt.mountpoint)
    assert e.value.errno == errno.EIO
    assert bmnt.metrics()["artfs_blocks_damaged_total"] >= 1
    # The others are whole.
    assert store.get_concatenated([keys[0], keys[2]]) == \
        rows[:BLOCK].tobytes() + rows[2 * BLOCK:].tobytes()


def test_bad_keys_are_refused_and_nothing_of_the_put_lands(bmnt):
    store = ArtfsBlockObjectStore(mount=bmnt.mountpoint)
    good = "vllm-artifact/0/" + "cc" * 32
    for bad in ("vllm-artifact/../x", "vllm-artifact//x", "a b", "x" * 256, ""):
        with pytest.raises(BlockObjectStoreError, match="cannot be stored"):
            store.put([BlockObject(good, b"g"), BlockObject(bad, b"b")])
        with pytest.raises(BlockObjectStoreError, match="does not exist"):
            store.get_concatenated([bad])
    with pytest.raises(BlockObjectStoreError, match="does not exist"):
        store.get_concatenated([good])
    # What the daemon itself says of a key that Python would have refused.
    key = b"vllm-artifact/../x"
    fd = os.open(bmnt.path(".blocks", ".put"), os.O_RDWR)
    try:
        os.write(fd, key + b"\n" + (1).to_bytes(8, "little") + b"b")
        with pytest.raises(OSError) as e:
            os.fsync(fd)
        assert e.value.errno in (errno.EINVAL, errno.EBADMSG)
    finally:
        try:
            os.close(fd)
        except OSError:
            pass


def test_a_full_tree_refuses_and_evicts_nothing(make_mount):
    m = with_blocks(make_mount(blocks_capacity="256K"))
    size = nbytes(U8)  # 6 KiB
    store = ArtfsBlockObjectStore(object_nbytes=size, mount=m.mountpoint)
    kept, batches = [], 0
    with pytest.raises(BlockObjectStoreError, match="full") as e:
        while batches < 20:  # 20 x 8 x 6 KiB: far more than 256 KiB
            batch = [f"vllm-artifact/0/{h.hex()}" for h in hashes(8, seed=batches)]
            store.put([BlockObject(k, payload_of(k, size)) for k in batch])
            kept += batch
            batches += 1
    assert e.value.__cause__.errno == errno.ENOSPC
    assert "blocks refused, the others committed" in str(e.value)
    assert len(kept) * size <= 256 * 1024
    assert len(kept) * size >= 128 * 1024, "the tree took far less than blocks_capacity="
    # Nothing was evicted: every block committed before is there, byte for byte.
    assert store.get_concatenated(kept) == b"".join(payload_of(k, size) for k in kept)
    # Those of the refused batch that landed are whole, the others absent.
    last = [f"vllm-artifact/0/{h.hex()}" for h in hashes(8, seed=batches)]
    landed = 0
    for k in last:
        try:
            assert store.get_concatenated([k]) == payload_of(k, size)
            landed += 1
        except BlockObjectStoreError as err:
            assert "does not exist" in str(err)
    assert landed < 8
    # An existing key still puts (first stays: nothing new to hold).
    store.put([BlockObject(kept[0], payload_of(kept[0], size))])


def test_a_get_past_materialize_max_is_refused_whole(make_mount):
    m = with_blocks(make_mount(materialize_max="1M", max_object="600K"))
    store = ArtfsBlockObjectStore(object_nbytes=500_000, mount=m.mountpoint)
    keys = [f"vllm-artifact/0/{h.hex()}" for h in hashes(3)]
    store.put([BlockObject(k, payload_of(k, 500_000)) for k in keys])
    assert store.get_concatenated(keys[:2]) == b"".join(payload_of(k, 500_000) for k in keys[:2])
    with pytest.raises(BlockObjectStoreError, match="materialize_max=") as e:
        store.get_concatenated(keys)
    assert e.value.__cause__.errno == errno.ENOMEM


def test_the_first_block_under_a_key_stays(bmnt):
    store = ArtfsBlockObjectStore(object_nbytes=64, mount=bmnt.mountpoint)
    key = "vllm-artifact/0/" + "dd" * 32
    store.put([BlockObject(key, b"A" * 64)])
    store.put([BlockObject(key, b"A" * 64)])  # identical: 0
    store.put([BlockObject(key, b"B" * 64)])  # other bytes: the first stays, no error
    assert store.get_concatenated([key]) == b"A" * 64
    assert bmnt.metrics()["artfs_blocks_collisions_total"] == 1  # counted
    # Within one put a key given twice is put once, with its last payload,
    # as vLLM's stores do.
    twice = "vllm-artifact/0/" + "ee" * 32
    store.put([BlockObject(twice, b"X" * 64), BlockObject(key, b"C" * 64),
               BlockObject(twice, b"Y" * 64)])
    assert store.get_concatenated([twice, key]) == b"Y" * 64 + b"A" * 64


def test_a_key_where_another_keys_directory_is_refused(bmnt):
    store = ArtfsBlockObjectStore(mount=bmnt.mountpoint)
    store.put([BlockObject("r3/a", b"1"), BlockObject("r3/b/c", b"2")])
    for key in ("r3/a/x", "r3/b"):
        with pytest.raises(BlockObjectStoreError, match="collides") as e:
            store.put([BlockObject(key, b"3"), BlockObject("r3/d", b"4")])
        assert e.value.__cause__.errno == errno.EEXIST
        assert "1 of 2 blocks refused" in str(e.value)
    assert store.get_concatenated(["r3/a", "r3/b/c", "r3/d"]) == b"124"


def test_a_tail_shorter_than_a_block_and_retain_release(bmnt):
    store = ArtfsBlockObjectStore(max_bytes=4096, object_nbytes=1024, mount=bmnt.mountpoint)
    tail = "r3-tail:" + "ab" * 16
    store.put([BlockObject(tail, b"t" * 100)], retain_keys=[tail], release_keys=[tail])
    assert store.get_concatenated([tail]) == b"t" * 100


TRAINER = textwrap.dedent("""
    import hashlib, sys
    import artfs.vllm
    keys = sys.stdin.read().split()
    data = artfs.vllm.get_concatenated(keys)
    print(artfs.vllm.VLLM_BLOCK_CLASSES, len(data), hashlib.sha256(data).hexdigest())
    try:
        artfs.vllm.get_concatenated(keys + ["vllm-artifact/0/" + "00" * 32])
    except artfs.vllm.BlockObjectStoreError as e:
        print(type(e).__module__, "does not exist" in str(e), e.__cause__.errno)
""")


def test_a_trainer_process_reads_by_key(bmnt):
    """A process without vLLM (a trainer), given the keys, reads the blocks
    of the engine's store from the mount ($ARTFS_MOUNT)."""
    store = ArtfsBlockObjectStore(object_nbytes=nbytes(U16), mount=bmnt.mountpoint)
    keys = routed_experts_keys(hashes(6), "1")
    rows = request_rows(6, U16)
    publish(store, keys, rows)
    out = subprocess.run([sys.executable, "-c", TRAINER], input="\n".join(keys),
                         env=dict(os.environ, PYTHONPATH=PACKAGE, ARTFS_MOUNT=bmnt.mountpoint),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    want = rows.tobytes()
    assert out.stdout.split() == ["False", str(len(want)), hashlib.sha256(want).hexdigest(),
                                  "artfs._vllm_fallback", "True", str(errno.ENOENT)]


def test_blocks_outlive_a_killed_daemon(bmnt):
    """kill -9 of the daemon between a put and a get: the holder starts
    another, which serves every block committed before (DESIGN.md §8); the
    store goes on putting and getting."""
    store = ArtfsBlockObjectStore(object_nbytes=nbytes(U8), mount=bmnt.mountpoint)
    keys = routed_experts_keys(hashes(16), "0")
    rows = request_rows(16, U8)
    publish(store, keys[:8], rows[:8 * BLOCK])
    pid = bmnt.kill_daemon()
    bmnt.wait_daemon_other_than(pid)
    np.testing.assert_array_equal(materialize(store, keys[:8], U8[0]), rows[:8 * BLOCK])
    publish(store, keys, rows)  # the first eight again (identical), eight new
    pid = bmnt.kill_daemon()
    bmnt.wait_daemon_other_than(pid)
    np.testing.assert_array_equal(materialize(store, keys, U8[0]), rows)
    assert get_concatenated(keys[::-1], mount=bmnt.mountpoint) == b"".join(
        rows[i * BLOCK:(i + 1) * BLOCK].tobytes() for i in range(15, -1, -1))


def test_puts_across_kills_fail_whole_and_their_retry_succeeds(bmnt):
    """Puts go on while the daemon is killed three times: each returns or
    raises BlockObjectStoreError whose cause is EIO (the batch the old
    daemon had), and the same put again succeeds; then every block is
    there, whole."""
    store = ArtfsBlockObjectStore(object_nbytes=nbytes(U8), mount=bmnt.mountpoint)
    keys = [f"vllm-artifact/0/{h.hex()}" for h in hashes(64 * 30)]
    stop, failed = threading.Event(), []

    def engine():
        for i in range(0, len(keys), 64):
            batch = [BlockObject(k, payload_of(k, nbytes(U8))) for k in keys[i:i + 64]]
            while True:
                try:
                    store.put(batch)
                    break
                except BlockObjectStoreError as e:
                    failed.append(e)
                    if e.__cause__ is None or e.__cause__.errno != errno.EIO or \
                            "putting it again is safe" not in str(e) or len(failed) > 20:
                        stop.set()
                        raise
        stop.set()

    thread = threading.Thread(target=engine)
    thread.start()
    for _ in range(3):
        if stop.wait(0.05):
            break
        pid = bmnt.kill_daemon()
        bmnt.wait_daemon_other_than(pid)
    thread.join(timeout=120)
    assert not thread.is_alive()
    assert all(e.__cause__.errno == errno.EIO for e in failed), failed
    assert store.get_concatenated(keys) == b"".join(payload_of(k, nbytes(U8)) for k in keys)


PROCESSES, ROUNDS, PER_PUT = 6, 12, 16
SIZE = nbytes(U8)


def _variant(key, writer):
    """Writer's bytes for a key that every writer puts (they differ)."""
    return payload_of(f"{key}#{writer}", SIZE)


def _engine(mount, me, shared, q):
    """One engine: puts its own blocks and every shared key (its own bytes
    for these), reads its own and others' back in shuffled order with
    repeats, and compares every byte."""
    try:
        store = ArtfsBlockObjectStore(object_nbytes=SIZE, mount=mount)
        rng = random.Random(me)
        mine, seen = [], {}
        for r in range(ROUNDS):
            batch = [f"vllm-artifact/{me % 2}/{h.hex()}" for h in hashes(PER_PUT, seed=1000 * me + r)]
            objs = [BlockObject(k, payload_of(k, SIZE)) for k in batch]
            objs += [BlockObject(k, _variant(k, me)) for k in shared[r::ROUNDS]]
            rng.shuffle(objs)
            store.put(objs)
            mine += batch
            ask = rng.sample(mine, min(len(mine), 40)) + rng.choices(mine, k=8)
            assert store.get_concatenated(ask) == b"".join(payload_of(k, SIZE) for k in ask)
            contended = shared[r::ROUNDS]
            got = store.get_concatenated(contended)
            for i, k in enumerate(contended):
                block = got[i * SIZE:(i + 1) * SIZE]
                assert block in [_variant(k, w) for w in range(PROCESSES)], k
                assert seen.setdefault(k, block) == block, f"{k} changed"
        q.put((me, "ok", {k: hashlib.sha256(b).hexdigest() for k, b in seen.items()}, mine))
    except BaseException as e:  # noqa: BLE001 (reported to the parent)
        q.put((me, repr(e)[:2000], {}, []))


def test_many_engines_at_once_every_byte_compared(bmnt):
    shared = [f"vllm-artifact/0/{h.hex()}" for h in hashes(ROUNDS * 4, seed=99)]
    results = run_processes(_engine, [(bmnt.mountpoint, me, shared) for me in range(PROCESSES)],
                            timeout=240)
    assert [r[1] for r in sorted(results)] == ["ok"] * PROCESSES
    # Every engine saw the same first block under each shared key.
    first = {}
    for _me, _ok, seen, _mine in results:
        for k, digest in seen.items():
            assert first.setdefault(k, digest) == digest, k
    assert len(first) == len(shared)
    # And afterwards every block of every engine reads back whole, at once.
    everything = [k for r in results for k in r[3]]
    data = get_concatenated(everything, mount=bmnt.mountpoint)
    assert data == b"".join(payload_of(k, SIZE) for k in everything)


# ---- the plugin against the real mount ------------------------------------------------------

def test_vllms_worker_on_artfs_and_a_trainer_reading_its_keys(plugin, bmnt, monkeypatch,
                                                              vllm_log):
    monkeypatch.delenv(artfs.vllm.DISABLE_ENV, raising=False)
    monkeypatch.setenv("ARTFS_MOUNT", bmnt.mountpoint)
    assert artfs.vllm.register() is True
    said = [m for level, m in vllm_log if level == logging.INFO]
    assert len(said) == 1 and bmnt.mountpoint in said[0], said
    worker = _worker()
    assert isinstance(worker._store._store, ArtfsBlockObjectStore)
    rows = request_rows(4, U8)
    keys = worker.keys(hashes(4))
    worker.publish(keys, rows, retain_keys=keys)
    np.testing.assert_array_equal(worker.materialize(keys[1:]), rows[BLOCK:])
    worker.close()
    assert get_concatenated(keys, mount=bmnt.mountpoint) == rows.tobytes()


def _dist_info(site):
    from test_python_vllm import _dist_info as make
    make(site)


PLUGIN_RUN = textwrap.dedent("""
    import sys
    import numpy as np
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    load_general_plugins()
    # Imported after the plugins ran, as a GPU worker does.
    from vllm.distributed.aux_output_connector.worker import AuxOutputWorkerConnector
    w = AuxOutputWorkerConnector(shape_per_token=(4, 2), dtype="uint8", block_size=4)
    print(type(w._store._store).__module__)
    rows = np.arange(8 * 4 * 2, dtype=np.uint8).reshape(8, 4, 2)
    keys = w.keys([bytes([i]) * 32 for i in range(2)])
    w.publish(keys, rows)
    assert (w.materialize(keys) == rows).all()
    w.close()
    print(" ".join(keys))
""")


@pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib reads pyproject.toml")
def test_vllm_loads_the_plugin_through_the_entry_point(bmnt, tmp_path):
    site = str(tmp_path / "site")
    _dist_info(site)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([STANDIN, site, PACKAGE]),
               ARTFS_MOUNT=bmnt.mountpoint)
    env.pop(artfs.vllm.DISABLE_ENV, None)
    out = subprocess.run([sys.executable, "-c", PLUGIN_RUN], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    module, keys = out.stdout.splitlines()
    assert module == "artfs.vllm"
    said = [line for line in out.stderr.splitlines() if "artfs mount" in line]
    assert len(said) == 1 and "auxiliary outputs" in said[0], out.stderr
    rows = np.arange(8 * 4 * 2, dtype=np.uint8).reshape(8, 4, 2)
    assert get_concatenated(keys.split(), mount=bmnt.mountpoint) == rows.tobytes()
    # Turned off: vLLM's own store, in the engine's process, and not a word.
    out = subprocess.run([sys.executable, "-c", PLUGIN_RUN], capture_output=True, text=True,
                         env=dict(env, ARTFS_VLLM_DISABLE="1"), timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0] == vllm_store.__name__
    assert "artfs" not in out.stderr


def test_the_default_mount_is_artfs_mount(bmnt, monkeypatch):
    monkeypatch.setenv("ARTFS_MOUNT", bmnt.mountpoint)
    key = "vllm-artifact/1/" + "12" * 32
    with ArtfsBlockObjectStore() as store:
        store.put([BlockObject(key, b"z" * 10)])
    assert get_concatenated([key]) == b"z" * 10
    assert wait_for(lambda: os.path.exists(bmnt.path(".blocks", key)), timeout=1)
