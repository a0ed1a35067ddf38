# SPDX-License-Identifier: Apache-2.0
"""artfs.vllm: vLLM's artifact store protocol over a real mount, vLLM's own
store test scenarios against ArtfsArtifactStore, and register(), the
vllm.general_plugins entry point, against the stand-in of vLLM's artifact
connector in vllm_standin/ (vLLM itself is not installed here).

Tests that need the daemon's .keys/, .keys/.put, .keys/.get and <wv>/.put
(DESIGN.md §3.6, §3.7) take the `kmnt` fixture or call with_keys, which
fails when the mounted daemon lacks .keys/."""
import errno
import logging
import multiprocessing
import os
import struct
import subprocess
import sys
import textwrap
from types import SimpleNamespace
from unittest.mock import Mock

import numpy as np
import pytest

from conftest import VECTORS, flip_byte, with_keys
from envelope import encode, routed_experts

HERE = os.path.dirname(os.path.abspath(__file__))
STANDIN = os.path.join(HERE, "vllm_standin")
PACKAGE = os.path.join(HERE, "..", "..", "contrib", "python")
sys.path[:0] = [STANDIN, PACKAGE]

import artfs  # noqa: E402
import artfs.vllm  # noqa: E402
from artfs.vllm import ArtfsArtifactReader, ArtfsArtifactStore  # noqa: E402
from vllm.distributed.artifact_connector import connector as vllm_connector  # noqa: E402
from vllm.distributed.artifact_connector import shm as vllm_shm  # noqa: E402
from vllm.distributed.artifact_connector import store as vllm_store  # noqa: E402
from vllm.distributed.artifact_connector.buffer import RoutedExpertsArtifactBuffer  # noqa: E402
from vllm.distributed.artifact_connector.protocol import (  # noqa: E402
    ArtifactCommitRequest,
    ArtifactConnectorMetadata,
    ArtifactFinalizeRequest,
)
from vllm.distributed.artifact_connector.request_core import (  # noqa: E402
    RoutedExpertsRequestCore,
    encode_routed_experts_array,
    materialize_routed_experts,
    routed_experts_key,
)
from vllm.distributed.artifact_connector.store import (  # noqa: E402
    ArtifactCapacityError,
    ArtifactCorruptionError,
    ArtifactNotFoundError,
    ArtifactObject,
    ArtifactStoreError,
)

WV = "default"


@pytest.fixture
def connector():
    """vLLM's connector module, given back as it was after the test."""
    saved = (vllm_connector.LocalSharedMemoryArtifactStore,
             vllm_connector.LocalSharedMemoryArtifactReader, artfs.vllm._registered_mount)
    yield vllm_connector
    (vllm_connector.LocalSharedMemoryArtifactStore,
     vllm_connector.LocalSharedMemoryArtifactReader, artfs.vllm._registered_mount) = saved


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


def obj(weight_version, block_hash, rows, kind="block", start=0):
    key = routed_experts_key(bytes.fromhex(block_hash), weight_version)
    return ArtifactObject(key, encode_routed_experts_array(key=key, kind=kind, array=rows,
                                                           source_token_start=start))


# ---- without a mount ----------------------------------------------------------------------

def test_the_error_classes_are_vllms_own_when_vllm_imports():
    assert artfs.vllm.VLLM_CLASSES
    for name in ("ArtifactStoreError", "ArtifactCapacityError", "ArtifactCorruptionError",
                 "ArtifactNotFoundError", "ArtifactObject"):
        assert getattr(artfs.vllm, name) is getattr(vllm_store, name), name


def test_same_named_classes_without_vllm():
    code = textwrap.dedent("""
        import artfs.vllm as v
        assert not v.VLLM_CLASSES
        assert issubclass(v.ArtifactStoreError, RuntimeError)
        for name in ("ArtifactCapacityError", "ArtifactCorruptionError", "ArtifactNotFoundError"):
            assert issubclass(getattr(v, name), v.ArtifactStoreError), name
        o = v.ArtifactObject("k", b"p")
        assert (o.key, o.payload) == ("k", b"p")
        print(v.ArtifactStoreError.__module__)
    """)
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=PACKAGE),
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "artfs._vllm_fallback"


def test_each_daemon_errno_is_vllms_class():
    want = {errno.ENOSPC: ArtifactCapacityError, errno.EFBIG: ArtifactCapacityError,
            errno.ENOENT: ArtifactNotFoundError, errno.EIO: ArtifactCorruptionError,
            errno.EBADMSG: ArtifactCorruptionError, errno.EEXIST: ArtifactCorruptionError,
            errno.EACCES: ArtifactStoreError, errno.ENOTCONN: ArtifactStoreError}
    for code, cls in want.items():
        e = artfs.vllm._store_error(code, "vllm-artifact/00")
        assert type(e) is cls, errno.errorcode[code]
        assert isinstance(e, RuntimeError)
        assert errno.errorcode[code] in str(e) and "vllm-artifact/00" in str(e)
    assert "does not exist" in str(artfs.vllm._store_error(errno.ENOENT, "k"))
    assert "collision" in str(artfs.vllm._store_error(errno.EEXIST, "k"))


def test_a_reader_needs_a_mount_with_keys(tmp_path):
    with pytest.raises(ArtifactStoreError, match="serves .keys/"):
        ArtfsArtifactReader(str(tmp_path))
    with pytest.raises(ArtifactStoreError):
        ArtfsArtifactStore(str(tmp_path))


def test_register_leaves_vllm_alone_without_an_artfs_mount(connector, tmp_path, monkeypatch,
                                                            vllm_log):
    monkeypatch.delenv(artfs.vllm.DISABLE_ENV, raising=False)
    monkeypatch.setenv("ARTFS_MOUNT", str(tmp_path))
    assert artfs.vllm.register() is False
    assert connector.LocalSharedMemoryArtifactStore is vllm_shm.LocalSharedMemoryArtifactStore
    assert connector.LocalSharedMemoryArtifactReader is vllm_shm.LocalSharedMemoryArtifactReader
    assert not [m for level, m in vllm_log if level >= logging.INFO]


def test_register_is_turned_off_by_the_environment(connector, mnt, monkeypatch, vllm_log):
    monkeypatch.setenv("ARTFS_MOUNT", mnt.mountpoint)
    for value in ("1", "yes"):
        monkeypatch.setenv(artfs.vllm.DISABLE_ENV, value)
        assert artfs.vllm.register() is False
    assert connector.LocalSharedMemoryArtifactStore is vllm_shm.LocalSharedMemoryArtifactStore
    assert not [m for level, m in vllm_log if level >= logging.INFO]


def test_register_refuses_a_daemon_without_keys(connector, tmp_path, monkeypatch, vllm_log):
    # An older daemon: an artfs mount (as /proc/mounts would say) with no .keys/.
    monkeypatch.setattr(artfs.vllm, "is_artfs_mount", lambda path: path == str(tmp_path))
    monkeypatch.delenv(artfs.vllm.DISABLE_ENV, raising=False)
    monkeypatch.setenv("ARTFS_MOUNT", str(tmp_path))
    assert artfs.vllm.register() is False
    assert connector.LocalSharedMemoryArtifactStore is vllm_shm.LocalSharedMemoryArtifactStore
    assert any(level == logging.WARNING and "no .keys/" in m for level, m in vllm_log)


def _dist_info(site):
    """artfs's dist-info as pip writes it from pyproject.toml (METADATA and
    entry_points.txt are all that importlib.metadata reads)."""
    import tomllib
    with open(os.path.join(PACKAGE, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    info = os.path.join(site, f"artfs-{project['version']}.dist-info")
    os.makedirs(info)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    with open(os.path.join(info, "entry_points.txt"), "w") as f:
        for group, entries in project["entry-points"].items():
            f.write(f"[{group}]\n")
            f.writelines(f"{name} = {target}\n" for name, target in entries.items())


PLUGIN_RUN = textwrap.dedent("""
    from importlib.metadata import entry_points
    print([e.value for e in entry_points(group="vllm.general_plugins")])
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    load_general_plugins()
    from vllm.distributed.artifact_connector import connector
    print(connector.LocalSharedMemoryArtifactStore.__module__)
    print(connector.LocalSharedMemoryArtifactReader.__module__)
""")


@pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib reads pyproject.toml")
def test_vllm_loads_register_through_the_entry_point(mnt, tmp_path):
    site = str(tmp_path / "site")
    _dist_info(site)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([STANDIN, site, PACKAGE]),
               ARTFS_MOUNT=mnt.mountpoint)
    env.pop(artfs.vllm.DISABLE_ENV, None)
    out = subprocess.run([sys.executable, "-c", PLUGIN_RUN], env=env, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "['artfs.vllm:register']"
    if os.path.isdir(mnt.path(".keys")):
        assert lines[1:] == ["artfs.vllm", "artfs.vllm"]
        said = [line for line in out.stderr.splitlines() if "artfs mount" in line]
        assert len(said) == 1 and mnt.mountpoint in said[0], out.stderr
    else:
        assert lines[1:] == [vllm_shm.__name__] * 2
        assert "no .keys/" in out.stderr
    out = subprocess.run([sys.executable, "-c", PLUGIN_RUN], capture_output=True, text=True,
                         env=dict(env, ARTFS_VLLM_DISABLE="1"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[1:] == [vllm_shm.__name__] * 2
    assert "artfs" not in out.stderr


# ---- the store through .keys/.put and .keys/.get -------------------------------------------

def test_put_then_get_returns_the_envelopes_as_published(kmnt):
    store = ArtfsArtifactStore(kmnt.mountpoint)
    objects = []
    for i, name in enumerate(("req-block0", "req-block1", "req-tail", "u16-block")):
        with open(os.path.join(VECTORS, f"{name}.envelope"), "rb") as f:
            payload = f.read()
        key = artfs.decode_envelope(payload)[0]["key"]
        objects.append(ArtifactObject(key, payload))
    store.put(objects)
    store.put([])
    keys = [o.key for o in objects]
    assert store.get(keys) == [o.payload for o in objects]
    assert store.get([]) == []
    with ArtfsArtifactReader(kmnt.mountpoint) as reader:
        assert reader.get(keys[::-1]) == [o.payload for o in objects][::-1]
    store.close()


def test_the_default_mount_is_artfs_mount(kmnt, monkeypatch):
    monkeypatch.setenv("ARTFS_MOUNT", kmnt.mountpoint)
    o = obj(WV, "aa", routed_experts(4))
    ArtfsArtifactStore().put([o])
    assert ArtfsArtifactReader().get([o.key]) == [o.payload]


def test_store_capacity_failure_raises(make_mount):
    m = with_keys(make_mount(capacity="8K"))
    store = ArtfsArtifactStore(m.mountpoint)
    small = obj(WV, "aa", routed_experts(4))      # 1.5 KiB
    large = obj(WV, "bb", routed_experts(20))     # 7.5 KiB
    with pytest.raises(ArtifactCapacityError):
        store.put([small, large])
    assert store.get([small.key]) == [small.payload]
    with pytest.raises(ArtifactNotFoundError, match="does not exist"):
        store.get([large.key])
    store.close()


def test_an_object_over_max_object_is_a_capacity_error(make_mount):
    m = with_keys(make_mount(max_object="4K"))
    with pytest.raises(ArtifactCapacityError) as e:
        ArtfsArtifactStore(m.mountpoint).put([obj(WV, "aa", routed_experts(16))])
    assert "EFBIG" in str(e.value)
    assert e.value.__cause__.errno == errno.EFBIG


def test_store_rejects_different_value_for_same_key(kmnt):
    store = ArtfsArtifactStore(kmnt.mountpoint)
    first = obj(WV, "aa", routed_experts(4, seed=1))
    store.put([first])
    other = obj(WV, "aa", routed_experts(4, seed=2))
    with pytest.raises(ArtifactCorruptionError, match="collision"):
        store.put([other])
    assert store.get([first.key]) == [first.payload]


def test_only_a_user_who_may_publish_puts_and_any_user_gets(make_mount):
    """On a mount with the default umask only its owner publishes, also
    through .put and also content identical to what is stored (an
    unprivileged user could otherwise publish a key first); every user
    reads."""
    m = with_keys(make_mount(allow_other=None))
    objects = [obj(WV, f"{i:02x}", routed_experts(4, seed=i)) for i in range(3)]
    ArtfsArtifactStore(m.mountpoint).put(objects)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: nobody, in the mount (no path above it to traverse)
        os.close(read)
        try:
            os.chdir(m.mountpoint)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            store = ArtfsArtifactStore(".")
            assert store.get([o.key for o in objects]) == [o.payload for o in objects]
            for batch in (objects, [obj(WV, "ff", routed_experts(4, seed=9))]):
                try:
                    store.put(batch)
                    raise AssertionError("nobody's put succeeded")
                except ArtifactStoreError as e:
                    cause = e.__cause__
                    assert isinstance(cause, PermissionError), repr(cause)
            os.write(write, b"ok")
        except BaseException as e:  # noqa: BLE001 (reported to the parent)
            os.write(write, repr(e).encode()[:4000])
        finally:
            os._exit(0)
    os.close(write)
    said = os.read(read, 4096).decode()
    os.close(read)
    os.waitpid(pid, 0)
    assert said == "ok"
    assert not os.path.exists(m.path(WV, "ff"))


def test_put_refuses_what_artfs_cannot_hold(kmnt):
    store = ArtfsArtifactStore(kmnt.mountpoint)
    good = obj(WV, "aa", routed_experts(4))
    # vLLM's own store takes any bytes under any key; artfs holds R3 envelopes.
    with pytest.raises(ArtifactCorruptionError, match="not \"vllm-artifact/\""):
        store.put([ArtifactObject("small", b"1234")])
    with pytest.raises(ArtifactCorruptionError, match="not a schema-3 envelope"):
        store.put([ArtifactObject(good.key, b"1234")])
    with pytest.raises(ArtifactCorruptionError, match="holds the envelope of"):
        store.put([ArtifactObject(routed_experts_key(b"\xbb", WV), good.payload)])
    damaged = good.payload[:-1] + bytes([good.payload[-1] ^ 1])
    with pytest.raises(ArtifactCorruptionError, match="EBADMSG"):
        store.put([ArtifactObject(good.key, damaged)])
    with pytest.raises(ArtifactNotFoundError):
        store.get([good.key])
    with pytest.raises(ArtifactNotFoundError, match="does not exist"):
        store.get(["missing"])


def test_put_checks_every_header_of_a_batch_laid_out_alike(kmnt):
    """The headers after the first are checked against its layout: one
    that JSON cannot read (a start with a leading zero) or that carries
    another key still refuses the whole put, and nothing is sent."""
    store = ArtfsArtifactStore(kmnt.mountpoint)
    good = [obj(WV, "%02x" % i, routed_experts(16, seed=i), start=16 * i) for i in range(8)]
    env = bytearray(good[5].payload)
    h = struct.unpack_from("<I", env)[0]
    head = bytes(env[4:4 + h]).replace(b'"source_token_start":80', b'"source_token_start":080')
    bad = ArtifactObject(good[5].key, struct.pack("<I", len(head)) + head + bytes(env[4 + h:]))
    with pytest.raises(ArtifactCorruptionError, match="not a schema-3 envelope"):
        store.put(good[:5] + [bad] + good[6:])
    other = ArtifactObject(good[6].key, good[7].payload)
    with pytest.raises(ArtifactCorruptionError, match="holds the envelope of"):
        store.put(good[:6] + [other])
    with pytest.raises(ArtifactNotFoundError):
        store.get([good[0].key])
    store.put(good)
    assert store.get([o.key for o in good]) == [o.payload for o in good]


def test_a_damaged_object_fails_closed(kmnt):
    store = ArtfsArtifactStore(kmnt.mountpoint)
    env = encode(WV, "aa", routed_experts(16))
    artfs.publish(WV, "aa", env, mount=kmnt.mountpoint)
    key = artfs.key_of(WV, "aa")
    flip_byte(kmnt.store_file(WV, "aa"))
    with pytest.raises(ArtifactCorruptionError) as e:
        store.get([key])
    assert key in str(e.value) and e.value.__cause__.errno == errno.EIO


# ---- vLLM's own store scenarios (tests/distributed/artifact_connector/test_shm.py) ---------

class Harness:
    """vLLM's request core over ArtfsArtifactStore: 12 logical rows of 3
    layers x top-2, hash blocks of 4 tokens."""

    def __init__(self, mount):
        self.store = ArtfsArtifactStore(mount)
        self.buffer = RoutedExpertsArtifactBuffer(np.dtype("uint8"), (3, 2))
        self.core = RoutedExpertsRequestCore(self.store, self.buffer)
        self.logical = np.arange(12 * 3 * 2, dtype=np.uint8).reshape(12, 3, 2)

    def close(self):
        self.store.close()


@pytest.fixture
def harness(kmnt):
    h = Harness(kmnt.mountpoint)
    yield h
    h.close()


def _request(request_id, attempt, *, token_end=10):
    return ArtifactFinalizeRequest(
        request_id=request_id, request_attempt_id=attempt, weight_version=WV,
        block_hashes=[bytes([i]) * 32 for i in range(3)],
        tail_block_hash=b"t" * 32 if token_end % 4 else None,
        token_end=token_end, hash_block_size=4)


def _commit_request(request):
    block_end = request.token_end // request.hash_block_size * request.hash_block_size
    if block_end <= 0:
        return None
    return ArtifactCommitRequest(
        request_id=request.request_id, weight_version=request.weight_version,
        block_hashes=request.block_hashes[:block_end // request.hash_block_size],
        block_start=0, hash_block_size=request.hash_block_size)


def _prepare_and_finalize(harness, request):
    harness.buffer.capture(request.request_id, 0, harness.logical[:request.token_end])
    commit = _commit_request(request)
    if commit is not None:
        harness.core.publish_commits([harness.core.prepare_commit(commit)])
    return harness.core.finalize(request)


def test_core_returns_ordered_keys_and_value(harness):
    request = _request("request-a", "a" * 32)
    keys = _prepare_and_finalize(harness, request)
    assert keys == [routed_experts_key(h, WV) for h in request.block_hashes[:2]] + \
        [routed_experts_key(request.tail_block_hash, WV)]
    np.testing.assert_array_equal(materialize_routed_experts(harness.store, keys),
                                  harness.logical[:10])


def test_exact_block_request_has_no_tail(harness):
    keys = _prepare_and_finalize(harness, _request("request-a", "a" * 32, token_end=8))
    assert len(keys) == 2
    np.testing.assert_array_equal(materialize_routed_experts(harness.store, keys),
                                  harness.logical[:8])


def test_finalize_recovers_tail_from_released_full_block(harness):
    harness.buffer.capture("request-a", 0, harness.logical[:8])
    commit = ArtifactCommitRequest(request_id="request-a", weight_version=WV,
                                   block_hashes=[bytes([i]) * 32 for i in range(2)],
                                   block_start=0, hash_block_size=4)
    harness.core.publish_commits([harness.core.prepare_commit(commit)])
    keys = harness.core.finalize(_request("request-a", "attempt-a", token_end=6))
    assert len(keys) == 2
    np.testing.assert_array_equal(materialize_routed_experts(harness.store, keys),
                                  harness.logical[:6])


@pytest.mark.parametrize("token_end", [1, 4, 5, 8, 9, 12])
def test_key_count_is_ceiling_of_executed_tokens(harness, token_end):
    request = _request(f"request-{token_end}", f"{token_end:032x}", token_end=token_end)
    keys = _prepare_and_finalize(harness, request)
    assert len(keys) == (token_end + 3) // 4
    np.testing.assert_array_equal(
        materialize_routed_experts(harness.store, keys, expected_token_end=token_end,
                                   hash_block_size=4),
        harness.logical[:token_end])


def test_cached_blocks_are_reused_without_put(harness):
    first_keys = _prepare_and_finalize(harness, _request("request-a", "a" * 32, token_end=8))
    second = _request("request-b", "b" * 32, token_end=10)
    harness.buffer.capture(second.request_id, 8, harness.logical[8:10])
    harness.store.put = Mock(wraps=harness.store.put)
    keys = harness.core.finalize(second)
    assert harness.store.put.call_count == 1
    assert len(harness.store.put.call_args.args[0]) == 1
    assert keys[:2] == first_keys
    np.testing.assert_array_equal(materialize_routed_experts(harness.store, keys),
                                  harness.logical[:10])


def test_missing_cached_block_fails_closed(harness):
    keys = harness.core.finalize(_request("request-a", "a" * 32, token_end=4))
    with pytest.raises(RuntimeError, match="does not exist"):
        materialize_routed_experts(harness.store, keys)


@pytest.mark.parametrize(("expected_shape", "expected_dtype", "error"),
                         [((3, 1), np.dtype("uint8"), "shape"),
                          ((3, 2), np.dtype("uint16"), "dtype")])
def test_materialize_rejects_model_schema_mismatch(harness, expected_shape, expected_dtype,
                                                   error):
    keys = _prepare_and_finalize(harness, _request("request-a", "a" * 32, token_end=4))
    with pytest.raises(ArtifactCorruptionError, match=error):
        materialize_routed_experts(harness.store, keys, expected_shape_per_token=expected_shape,
                                   expected_dtype=expected_dtype)


@pytest.mark.parametrize("expected_token_end", [9, 12])
def test_materialize_rejects_terminal_range_mismatch(harness, expected_token_end):
    keys = _prepare_and_finalize(harness, _request("request-a", "a" * 32, token_end=10))
    with pytest.raises(ArtifactCorruptionError, match="terminal token range"):
        materialize_routed_experts(harness.store, keys, expected_token_end=expected_token_end,
                                   hash_block_size=4)


def _read_in_child(mount, keys, queue):
    queue.put(materialize_routed_experts(ArtfsArtifactReader(mount), keys).tolist())


def test_reader_materializes_from_another_process(harness, kmnt):
    keys = _prepare_and_finalize(harness, _request("request-a", "a" * 32))
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_read_in_child, args=(kmnt.mountpoint, keys, queue))
    process.start()
    process.join(timeout=60)
    if process.is_alive():
        process.terminate()
        process.join(timeout=5)
    assert process.exitcode == 0
    np.testing.assert_array_equal(np.asarray(queue.get(timeout=5)), harness.logical[:10])


def test_a_request_materialized_by_the_daemon_from_what_put_stored(harness, kmnt):
    """What vLLM put by key, published again by path with its hashes
    (identical content: no second copy), is one .materialize read that
    equals vLLM's own materialization."""
    request = _request("request-a", "a" * 32, token_end=10)
    keys = _prepare_and_finalize(harness, request)
    hashes = list(request.block_hashes[:2]) + [request.tail_block_hash]
    envelopes = harness.store.get(keys)
    results = artfs.publish_many(WV, list(zip(hashes, envelopes)), mount=kmnt.mountpoint,
                                 check=True)
    assert [r.key for r in results] == keys
    by_daemon = artfs.materialize(WV, hashes, token_end=10, block_size=4, mount=kmnt.mountpoint)
    by_vllm = materialize_routed_experts(harness.store, keys, expected_token_end=10,
                                         hash_block_size=4)
    np.testing.assert_array_equal(by_daemon, by_vllm)
    np.testing.assert_array_equal(by_daemon, harness.logical[:10])


# ---- register() and vLLM's connector ----------------------------------------------------------

def _vllm_config(shm_dir):
    return SimpleNamespace(
        artifact_config=SimpleNamespace(enabled=True, enable_routed_experts=True,
                                        shm_dir=str(shm_dir), max_shm_bytes=1 << 20,
                                        shm_ttl_seconds=60),
        parallel_config=SimpleNamespace(data_parallel_rank=0, rank=0),
        cache_config=SimpleNamespace(prefix_caching_hash_algo="sha256"),
        model_config=SimpleNamespace(hf_text_config=SimpleNamespace(
            num_hidden_layers=3, num_experts_per_tok=2, num_experts=256)),
        instance_id="instance")


def _run_request(config, logical, token_end):
    """One request through vLLM's worker and scheduler connectors: the
    worker captures, commits the full blocks and finalizes; the scheduler
    materializes from the keys the worker reports."""
    worker = vllm_connector.ArtifactWorkerConnector(config, Mock())
    scheduler = vllm_connector.ArtifactSchedulerConnector(config)
    hashes = [bytes([i]) * 32 for i in range(3)]
    worker._capture_step("request-a", 0, logical[:token_end])
    finalize = scheduler.add_finalize("request-a", hashes, b"t" * 32, token_end, 4)
    commit = ArtifactCommitRequest(request_id="request-a", weight_version=WV,
                                   block_hashes=hashes[:token_end // 4], block_start=0,
                                   hash_block_size=4)
    metadata = scheduler.build_connector_meta()
    output = worker.start_step(ArtifactConnectorMetadata(commits=[commit],
                                                         finalizes=metadata.finalizes),
                               finished_req_ids={"request-a"})
    assert output.results[0].request_attempt_id == finalize.request_attempt_id
    ((request_id, rows),) = scheduler.consume_output(output)
    worker.shutdown()
    scheduler.shutdown()
    return output.results[0].keys, rows, (worker, scheduler)


def test_without_register_the_connector_uses_vllms_shm_store(connector, tmp_path):
    logical = np.arange(12 * 3 * 2, dtype=np.uint8).reshape(12, 3, 2)
    _keys, rows, (worker, scheduler) = _run_request(_vllm_config(tmp_path / "shm"), logical, 10)
    np.testing.assert_array_equal(rows, logical[:10])
    assert type(worker._store) is vllm_shm.LocalSharedMemoryArtifactStore
    assert type(scheduler._reader) is vllm_shm.LocalSharedMemoryArtifactReader
    assert os.listdir(tmp_path / "shm")


def test_register_puts_the_connector_on_artfs(connector, kmnt, tmp_path, monkeypatch, vllm_log):
    monkeypatch.delenv(artfs.vllm.DISABLE_ENV, raising=False)
    monkeypatch.setenv("ARTFS_MOUNT", kmnt.mountpoint)
    assert artfs.vllm.register() is True
    assert artfs.vllm.register() is True  # vLLM may load plugins more than once
    said = [m for level, m in vllm_log if level == logging.INFO]
    assert len(said) == 1 and kmnt.mountpoint in said[0] and "ARTFS_VLLM_DISABLE" in said[0]
    logical = np.arange(12 * 3 * 2, dtype=np.uint8).reshape(12, 3, 2)
    shm_dir = tmp_path / "shm"
    keys, rows, (worker, scheduler) = _run_request(_vllm_config(shm_dir), logical, 10)
    np.testing.assert_array_equal(rows, logical[:10])
    assert isinstance(worker._store, ArtfsArtifactStore)
    assert isinstance(scheduler._reader, ArtfsArtifactReader)
    assert not shm_dir.exists()  # nothing went to vLLM's own store
    # The objects are the daemon's: any reader on the node has them.
    assert [artfs.decode_envelope(e)[0]["key"] for e in
            artfs.get_envelopes(keys, mount=kmnt.mountpoint)] == keys
