# SPDX-License-Identifier: Apache-2.0
"""The Python package's R3 API (contrib/python/artfs/r3.py): keys and
envelopes without a mount, then publish, read_r3 and materialize through a
real one, then the batches and key-addressed reads (.keys/.put, <wv>/.put,
.keys/.get of DESIGN.md §3.6 and §3.7).

The batch tests take the `kmnt` fixture (or call with_keys), which fails
when the mounted daemon serves no .keys/ directory."""
import errno
import hashlib
import json
import os
import struct
import sys

import numpy as np
import pytest

from conftest import VECTORS, flip_byte, with_keys
from envelope import derive_key, encode, header_fields, pack, routed_experts

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "contrib", "python"))
import artfs  # noqa: E402
from artfs import r3  # noqa: E402

WV = "default"


def vector_cases():
    with open(os.path.join(VECTORS, "vectors.json")) as f:
        return json.load(f)["cases"]


def vector(name, ext):
    with open(os.path.join(VECTORS, f"{name}.{ext}"), "rb") as f:
        return f.read()


def request_vectors():
    """The three objects of the vectors' request, in token order."""
    return [c for c in vector_cases() if c["name"].startswith("req-")]


def key_hex(key):
    assert key.startswith("vllm-artifact/")
    return key[len("vllm-artifact/"):]


# ---- keys and envelopes: no mount ------------------------------------------------------

def test_key_of_matches_vllm_vectors_and_the_design_formula():
    for case in vector_cases():
        wv, h = case["weight_version"], case["block_hash"]
        raw = bytes.fromhex(h)
        msg = struct.pack(">Q", len(wv.encode())) + wv.encode() + struct.pack(">Q", len(raw)) + raw
        expected = "vllm-artifact/" + hashlib.sha256(msg).hexdigest()
        assert expected == case["key"], case["name"]
        assert artfs.key_of(wv, h) == expected
        assert artfs.key_of(wv, raw) == expected
        assert artfs.key_of(wv, bytearray(raw)) == expected
        assert artfs.key_of(wv, h.upper()) == expected
        assert derive_key(wv, h) == expected
    # Unicode versions hash their UTF-8 bytes.
    assert artfs.key_of("é", "00") == derive_key("é", "00")
    assert artfs.key_of("a", "00") != artfs.key_of("b", "00")


def test_key_of_refuses_a_non_hex_hash():
    with pytest.raises(ValueError, match="not hex"):
        artfs.key_of(WV, "xyz")


def test_encode_envelope_is_byte_identical_to_vllms_encoder():
    for case in vector_cases():
        arr = np.load(os.path.join(VECTORS, f"{case['name']}.npy"))
        got = artfs.encode_envelope(arr, key=case["key"], kind=case["kind"],
                                    source_token_start=case["source_token_start"])
        assert got == vector(case["name"], "envelope"), case["name"]


def test_encode_envelope_takes_any_layout_and_refuses_big_headers():
    arr = routed_experts(16)
    key = artfs.key_of(WV, "aa")
    want = artfs.encode_envelope(arr, key=key, kind="block", source_token_start=0)
    fortran = np.asfortranarray(arr)
    assert artfs.encode_envelope(fortran, key=key, kind="block", source_token_start=0) == want
    strided = np.repeat(arr, 2, axis=0)[::2]
    assert not strided.flags["C_CONTIGUOUS"]
    assert artfs.encode_envelope(strided, key=key, kind="block", source_token_start=0) == want
    assert want == encode(WV, "aa", arr)
    other = artfs.encode_envelope(arr, key=key, kind="block", source_token_start=0, field="logits")
    assert b'"field":"logits"' in other
    with pytest.raises(ValueError, match="exceeds 4096"):
        artfs.encode_envelope(arr, key="k" * 5000, kind="block", source_token_start=0)


def test_decode_envelope_round_trips_the_vectors():
    for case in vector_cases():
        header, arr = artfs.decode_envelope(vector(case["name"], "envelope"),
                                            expected_key=case["key"])
        for field in ("key", "kind", "dtype", "shape", "source_token_start", "payload_sha256"):
            assert header[field] == case[field], (case["name"], field)
        assert header["schema_version"] == 3 and header["field"] == "routed_experts"
        want = np.load(os.path.join(VECTORS, f"{case['name']}.npy"))
        assert arr.dtype == want.dtype and np.array_equal(arr, want)
        assert not arr.flags.writeable  # a view of the bytes, not a copy
    for dtype in (np.uint8, np.uint16, np.int32, np.float32, np.float64, np.bool_):
        arr = np.arange(24).astype(dtype).reshape(2, 3, 4)
        env = artfs.encode_envelope(arr, key=artfs.key_of(WV, "ab"), kind="tail",
                                    source_token_start=7)
        header, back = artfs.decode_envelope(memoryview(env))
        assert back.dtype == arr.dtype and np.array_equal(back, arr)
        assert header["source_token_start"] == 7


def test_decode_envelope_checks_the_expected_key():
    env = encode(WV, "aa", routed_experts(4))
    with pytest.raises(artfs.EnvelopeError, match="not vllm-artifact/"):
        artfs.decode_envelope(env, expected_key=artfs.key_of(WV, "bb"))


def _damaged():
    arr = routed_experts(16)
    good = header_fields(WV, "aa", arr)
    payload = arr.tobytes()
    canonical = json.dumps(good, sort_keys=True, separators=(",", ":")).encode()

    def with_fields(**kw):
        f = dict(good)
        for k, v in kw.items():
            if v is None:
                f.pop(k)
            else:
                f[k] = v
        return pack(f, payload)

    cases = {
        "empty": b"",
        "only_a_length": struct.pack("<I", 300),
        "header_length_zero": struct.pack("<I", 0) + canonical + payload,
        "header_length_4097": struct.pack("<I", 4097) + canonical + b" " * 4097 + payload,
        "json_syntax": pack(b"{not json", payload),
        "json_not_object": pack(b"[1, 2, 3]", payload),
        "json_not_utf8": pack(canonical.replace(b'"block"', b'"bl\xffck"'), payload),
        "json_duplicate_key": pack(canonical[:-1] + b',"kind":"block"}', payload),
        "json_trailing_garbage": pack(canonical + b"x", payload),
        "extra_field": with_fields(extra=1),
        "schema_2": with_fields(schema_version=2),
        "schema_string": with_fields(schema_version="3"),
        "schema_float": with_fields(schema_version=3.0),
        "schema_true": with_fields(schema_version=True),
        "key_malformed": with_fields(key="vllm-artifact/xyz"),
        "key_uppercase": with_fields(key=good["key"].upper()),
        "kind_unknown": with_fields(kind="full"),
        "field_unknown": with_fields(field="logits"),
        "dtype_object": with_fields(dtype="|O"),
        "dtype_unicode": with_fields(dtype="<U4"),
        "dtype_size_3": with_fields(dtype="|u3"),
        "dtype_f1": with_fields(dtype="|f1"),
        "dtype_no_order": with_fields(dtype="u2"),
        "dtype_name": with_fields(dtype="uint8"),
        "dtype_u1_with_order": with_fields(dtype="<u1"),
        "shape_empty": with_fields(shape=[]),
        "shape_zero": with_fields(shape=[0, 48, 8]),
        "shape_negative": with_fields(shape=[-16, 48, 8]),
        "shape_nine_axes": with_fields(shape=[1] * 9),
        "shape_string": with_fields(shape=["16", 48, 8]),
        "shape_bool": with_fields(shape=[True, 48, 8]),
        "shape_not_list": with_fields(shape=16),
        "token_start_negative": with_fields(source_token_start=-1),
        "token_start_string": with_fields(source_token_start="0"),
        "token_start_float": with_fields(source_token_start=0.0),
        "sha_uppercase": with_fields(payload_sha256=good["payload_sha256"].upper()),
        "sha_short": with_fields(payload_sha256="ab" * 16),
        "payload_checksum": pack(good, payload[:-1] + bytes([payload[-1] ^ 1])),
        "payload_short": pack(good, payload[:-7]),
        "payload_long": pack(good, payload + b"\0"),
        "size_mismatch_shape": with_fields(shape=[15, 48, 8]),
    }
    for field in good:
        cases[f"missing_{field}"] = with_fields(**{field: None})
    return cases


DAMAGED = _damaged()


@pytest.mark.parametrize("case", sorted(DAMAGED))
def test_decode_envelope_rejects_what_the_daemon_rejects(case):
    with pytest.raises(artfs.EnvelopeError) as e:
        artfs.decode_envelope(DAMAGED[case])
    assert isinstance(e.value, ValueError) and e.value.errno == errno.EBADMSG


def test_a_batch_layout_answers_as_the_parser_with_one_parse(monkeypatch):
    """ArtfsArtifactStore.put checks each header's key through r3._Layout:
    headers laid out alike are answered from the first one's layout (keys,
    checksums and starts differ), every answer is the parser's."""
    real = r3._parse_header
    calls = []
    # _Layout lives in artfs.envelope (r3 re-exports it): patch the parser there.
    monkeypatch.setattr(artfs.envelope, "_parse_header", lambda *a: calls.append(a) or real(*a))
    envs = [encode(WV, "%02x" % i, routed_experts(16, seed=i), source_token_start=16 * i)
            for i in range(80)]                                   # starts of 1 to 4 digits
    layout = r3._Layout()
    assert [layout.key_of(e) for e in envs] == [derive_key(WV, "%02x" % i) for i in range(80)]
    assert len(calls) == 1

    def answer(how, env):
        try:
            return how(env)
        except artfs.EnvelopeError as e:
            return type(e)
    good = envs[3]
    head = good[4:4 + struct.unpack_from("<I", good)[0]]
    starts = [head.replace(b'"source_token_start":48', b'"source_token_start":' + d)
              for d in (b"016", b"-1", b"1e3", b"0.0", b"48 ", b"99999999999999999999",
                        b"123456789012345678", b"1234567890123456789")]
    damaged = list(DAMAGED.values()) + [pack(h, good[4 + len(head):]) for h in starts] + [
        pack(head.replace(b'"key":"vllm-artifact/', b'"key":"vllm-artifact/A')[:-1], b""),
        pack(head.replace(b'"kind":"block"', b'"kind":"tail"'), good[4 + len(head):])]
    for i, env in enumerate(damaged):
        layout = r3._Layout()
        layout.key_of(good)
        assert answer(layout.key_of, env) == answer(lambda e: real(e)[0]["key"], env), i


def test_back_to_back_envelopes_split_at_their_own_lengths():
    envs = [vector(c["name"], "envelope") for c in vector_cases()]
    got = r3._split_envelopes(b"".join(envs))
    assert [env for _key, env in got] == envs
    assert [key for key, _env in got] == [c["key"] for c in vector_cases()]
    assert r3._split_envelopes(b"") == []
    with pytest.raises(artfs.EnvelopeError, match="cut short"):
        r3._split_envelopes(b"".join(envs)[:-1])


def test_batch_results_parse():
    k = "ab" * 32
    text = f"{k} 0\n{k} EEXIST\n{k} EBADMSG\n{k} ENOSPC\n{k} EFBIG\n{k} 5\n".encode()
    got = r3._parse_results(text, "/m/.keys/.put")
    assert [r.errno for r in got] == [0, errno.EEXIST, errno.EBADMSG, errno.ENOSPC,
                                      errno.EFBIG, 5]
    assert all(r.key == "vllm-artifact/" + k for r in got)
    assert got[0].ok and not got[1].ok
    with pytest.raises(OSError) as e:
        r3._parse_results(f"{k} EWHAT\n".encode(), "/m/.keys/.put")
    assert e.value.errno == errno.EIO


def test_arguments_are_checked_before_any_system_call(tmp_path):
    nowhere = str(tmp_path / "no-such-mount")
    env = encode(WV, "aa", routed_experts(4))
    assert artfs.publish_many(None, [], mount=nowhere) == []
    assert artfs.publish_many(WV, [], mount=nowhere) == []
    assert artfs.get_envelopes([], mount=nowhere) == []
    with pytest.raises(TypeError):
        artfs.publish_many(None, [("aa", env)], mount=nowhere)
    with pytest.raises(TypeError):
        artfs.publish_many(WV, [env], mount=nowhere)
    with pytest.raises(ValueError, match="not an artfs key"):
        artfs.get_envelopes(["vllm-artifact/xyz"], mount=nowhere)
    assert not os.path.exists(nowhere)


def test_default_mount_is_artfs_mount_env_then_mnt_artifacts(monkeypatch):
    monkeypatch.delenv("ARTFS_MOUNT", raising=False)
    assert artfs.mount_point() == "/mnt/artifacts"
    monkeypatch.setenv("ARTFS_MOUNT", "/elsewhere")
    assert artfs.mount_point() == "/elsewhere"
    assert artfs.mount_point("/given") == "/given"


# ---- the client side of the batch files, against scripted answers ------------------------

class Scripted:
    """Stands in for the os module inside artfs.r3: the batch files answer
    as scripted, per DESIGN.md §3.7, and every call is recorded."""

    def __init__(self, files):
        self.files = files          # path -> dict(answer, fsync, read, close, old_daemon)
        self.written = {}           # path -> bytes written
        self.opened = []
        self.made = []
        self.writev_max = None      # a writev takes at most this many bytes
        self.writevs = 0
        self.fsyncs = 0
        self._fds = {}
        self._synced = set()

    def __getattr__(self, name):
        return getattr(os, name)

    def mkdir(self, path, mode=0o777):
        self.made.append(path)

    def open(self, path, flags, mode=0o777):
        if path not in self.files:
            raise FileNotFoundError(errno.ENOENT, "not scripted", path)
        fd = 1000 + len(self.opened)
        self.opened.append(path)
        self._fds[fd] = path
        self.written[path] = b""
        return fd

    def _fail(self, fd, what):
        code = self.files[self._fds[fd]].get(what)
        if code:
            raise OSError(code, os.strerror(code))

    def write(self, fd, data):
        self._fail(fd, "write")
        self.written[self._fds[fd]] += bytes(data)
        return len(data)

    def writev(self, fd, bufs):
        self._fail(fd, "write")
        self.writevs += 1
        data = b"".join(bytes(b) for b in bufs)[:self.writev_max]
        self.written[self._fds[fd]] += data
        return len(data)

    def fsync(self, fd):
        self.fsyncs += 1
        self._synced.add(fd)
        self._fail(fd, "fsync")

    def pread(self, fd, n, off):
        if self.files[self._fds[fd]].get("old_daemon") and fd not in self._synced:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))  # results after fsync only
        self._fail(fd, "read")
        return self.files[self._fds[fd]].get("answer", b"")[off:off + n]

    def close(self, fd):
        self._fail(fd, "close")


@pytest.fixture
def scripted(monkeypatch):
    def install(files, readable=()):
        fake = Scripted(files)
        monkeypatch.setattr(r3, "os", fake)

        def fake_read_file(path):  # the probe of .keys/<hex> after a failed .get
            if path not in readable:
                raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
            return b""
        monkeypatch.setattr(r3, "_read_file", fake_read_file)
        return fake
    return install


def _answer(*pairs):
    return "".join(f"{key_hex(k)} {status}\n" for k, status in pairs).encode()


def test_publish_many_is_one_transaction_with_a_result_per_record(scripted):
    envs = [encode(WV, h, routed_experts(4, seed=i)) for i, h in enumerate(("aa", "bb", "cc"))]
    ka, kb, kc = (artfs.key_of(WV, h) for h in ("aa", "bb", "cc"))
    put = "/m/.keys/.put"
    fake = scripted({put: dict(answer=_answer((ka, 0), (kb, "EEXIST"), (kc, 0)),
                               fsync=errno.EEXIST, close=errno.EEXIST)})
    results = artfs.publish_many(None, envs, mount="/m")
    assert [(r.key, r.errno, r.ok) for r in results] == [
        (ka, 0, True), (kb, errno.EEXIST, False), (kc, 0, True)]
    assert fake.opened == [put] and fake.written[put] == b"".join(envs)
    assert fake.fsyncs == 0  # the read of the result lines ends the transaction
    with pytest.raises(FileExistsError) as e:
        artfs.publish_many(None, envs, mount="/m", check=True)
    assert e.value.filename == put and "record 1" in str(e.value) and kb in str(e.value)


def test_publish_many_writes_every_byte_when_the_kernel_takes_part(scripted):
    envs = [encode(WV, "%02x" % i, routed_experts(4, seed=i)) for i in range(40)]
    keys = [artfs.key_of(WV, "%02x" % i) for i in range(40)]
    put = "/m/.keys/.put"
    fake = scripted({put: dict(answer=_answer(*((k, 0) for k in keys)))})
    fake.writev_max = 1000  # cuts inside pieces and across them
    assert all(r.ok for r in artfs.publish_many(None, envs, mount="/m"))
    assert fake.written[put] == b"".join(envs)
    assert fake.writevs == -(-len(b"".join(envs)) // 1000)


def test_publish_many_by_path_writes_hash_lines(scripted):
    envs = [encode(WV, h, routed_experts(4, seed=i)) for i, h in enumerate(("aa", "bbcc"))]
    put = "/m/default/.put"
    fake = scripted({put: dict(answer=_answer((artfs.key_of(WV, "aa"), 0),
                                              (artfs.key_of(WV, "bbcc"), 0)))})
    results = artfs.publish_many(WV, [(b"\xaa", envs[0]), ("bbcc", envs[1])], mount="/m")
    assert all(r.ok for r in results)
    assert fake.made == ["/m/default"]
    assert fake.written[put] == b"aa\n" + envs[0] + b"bbcc\n" + envs[1]


def test_publish_many_ends_the_batch_with_fsync_on_an_older_daemon(scripted):
    """A daemon from before reads ended batches answers a read before fsync
    with EINVAL: the client then ends the batch with fsync and reads."""
    envs = [encode(WV, h, routed_experts(4, seed=i)) for i, h in enumerate(("aa", "bb"))]
    ka, kb = (artfs.key_of(WV, h) for h in ("aa", "bb"))
    put = "/m/.keys/.put"
    fake = scripted({put: dict(answer=_answer((ka, 0), (kb, "EEXIST")), old_daemon=True,
                               fsync=errno.EEXIST, close=errno.EEXIST)})
    results = artfs.publish_many(None, envs, mount="/m")
    assert [(r.key, r.errno) for r in results] == [(ka, 0), (kb, errno.EEXIST)]
    assert fake.fsyncs == 1


@pytest.mark.parametrize(("script", "code"), [
    (dict(answer=b""), errno.EIO),                                  # no result lines
    (dict(answer=b"", close=errno.ENOSPC), errno.ENOSPC),            # nor after a failure
    (dict(answer=b"", old_daemon=True, fsync=errno.ENOSPC, close=errno.ENOSPC), errno.ENOSPC),
    (dict(answer="{} 0\n".format("ab" * 32).encode(), close=errno.EBADMSG), errno.EBADMSG),
    (dict(write=errno.ENOTCONN), errno.ENOTCONN),                    # the daemon died
    (dict(read=errno.EIO), errno.EIO),
    (dict(answer="{} 0\n".format("ab" * 32).encode(), close=errno.EIO), errno.EIO),
])
def test_publish_many_raises_when_the_transaction_fails(scripted, script, code):
    scripted({"/m/.keys/.put": script})
    with pytest.raises(OSError) as e:
        artfs.publish_many(None, [encode(WV, "aa", routed_experts(4))], mount="/m")
    assert e.value.errno == code and e.value.filename == "/m/.keys/.put"


def test_get_envelopes_is_one_transaction(scripted):
    envs = [vector(c["name"], "envelope") for c in vector_cases()]
    keys = [c["key"] for c in vector_cases()]
    get = "/m/.keys/.get"
    fake = scripted({get: dict(answer=b"".join(envs))})
    assert artfs.get_envelopes(keys, mount="/m") == envs
    assert fake.opened == [get]
    assert fake.written[get] == "".join(key_hex(k) + "\n" for k in keys).encode()
    for answer in (b"".join(envs[::-1]), b"".join(envs[:-1]), b"".join(envs)[:-1],
                   b"".join(envs) + envs[0]):
        scripted({get: dict(answer=answer)})
        with pytest.raises(OSError) as e:
            artfs.get_envelopes(keys, mount="/m")
        assert e.value.errno == errno.EIO


def test_get_envelopes_names_the_key_that_failed(scripted):
    ka, kb = artfs.key_of(WV, "aa"), artfs.key_of(WV, "bb")
    scripted({"/m/.keys/.get": dict(read=errno.ENOENT)},
             readable={"/m/.keys/" + key_hex(ka)})
    with pytest.raises(FileNotFoundError) as e:
        artfs.get_envelopes([ka, kb], mount="/m")
    assert kb in str(e.value) and ka not in str(e.value)


# ---- publish, read_r3, materialize: a real mount ----------------------------------------

def test_publish_then_read_r3_through_the_mount(mnt):
    for case in vector_cases():
        artfs.publish(case["weight_version"], case["block_hash"], vector(case["name"], "envelope"),
                      mount=mnt.mountpoint)
        got = artfs.read_r3(case["weight_version"], case["block_hash"], mount=mnt.mountpoint)
        assert np.array_equal(got, np.load(os.path.join(VECTORS, f"{case['name']}.npy")))
        with open(mnt.path(case["weight_version"], case["block_hash"]), "rb") as f:
            assert f.read() == vector(case["name"], "npy")
        attrs = artfs.r3_attributes(case["weight_version"], bytes.fromhex(case["block_hash"]),
                                    mount=mnt.mountpoint)
        assert attrs["key"] == case["key"]


def test_publish_takes_the_mount_from_the_environment(mnt, monkeypatch):
    monkeypatch.setenv("ARTFS_MOUNT", mnt.mountpoint)
    arr = routed_experts(16)
    artfs.publish(WV, "aa", artfs.encode_envelope(arr, key=artfs.key_of(WV, "aa"), kind="block",
                                                  source_token_start=0))
    assert np.array_equal(artfs.read_r3(WV, "aa"), arr)


def test_identical_publish_is_success(mnt):
    env = encode(WV, "aa", routed_experts(16))
    for _ in range(3):
        artfs.publish(WV, "aa", env, mount=mnt.mountpoint)
    assert mnt.metrics()["artfs_publishes_total"] == 1


def test_publish_raises_the_daemons_errno_with_path_and_key(mnt):
    artfs.publish(WV, "aa", encode(WV, "aa", routed_experts(16, seed=1)), mount=mnt.mountpoint)
    with pytest.raises(FileExistsError) as e:
        artfs.publish(WV, "aa", encode(WV, "aa", routed_experts(16, seed=2)), mount=mnt.mountpoint)
    assert e.value.errno == errno.EEXIST
    assert e.value.filename == mnt.path(WV, "aa")
    assert artfs.key_of(WV, "aa") in str(e.value)
    with pytest.raises(OSError) as e:
        artfs.publish(WV, "bb", encode(WV, "aa", routed_experts(16)), mount=mnt.mountpoint)
    assert e.value.errno == errno.EBADMSG and artfs.key_of(WV, "bb") in str(e.value)
    with pytest.raises(OSError) as e:
        artfs.publish("-bad", "aa", b"", mount=mnt.mountpoint)
    assert e.value.errno == errno.EINVAL and "-bad" in str(e.value)


def test_publish_raises_enospc_and_efbig(make_mount):
    small = make_mount(capacity="16K", max_object="8K")
    with pytest.raises(OSError) as e:
        artfs.publish(WV, "cc", encode(WV, "cc", routed_experts(32)), mount=small.mountpoint)
    assert e.value.errno == errno.EFBIG
    for i in range(2):
        artfs.publish(WV, f"{i:02x}", encode(WV, f"{i:02x}", routed_experts(16, seed=i)),
                      mount=small.mountpoint)
    with pytest.raises(OSError) as e:
        artfs.publish(WV, "02", encode(WV, "02", routed_experts(16, seed=2)), mount=small.mountpoint)
    assert e.value.errno == errno.ENOSPC


def test_read_r3_errors(mnt):
    with pytest.raises(FileNotFoundError) as e:
        artfs.read_r3(WV, "dd", mount=mnt.mountpoint)
    assert artfs.key_of(WV, "dd") in str(e.value)
    artfs.publish(WV, "aa", encode(WV, "aa", routed_experts(16)), mount=mnt.mountpoint)
    flip_byte(mnt.store_file(WV, "aa"))
    with pytest.raises(OSError) as e:
        artfs.read_r3(WV, "aa", mount=mnt.mountpoint)
    assert e.value.errno == errno.EIO


def test_materialize_the_vectors_request(mnt):
    cases = request_vectors()
    for case in cases:
        artfs.publish(WV, case["block_hash"], vector(case["name"], "envelope"), mount=mnt.mountpoint)
    hashes = [c["block_hash"] for c in cases]
    want = np.load(os.path.join(VECTORS, "req-materialized.npy"))
    assert np.array_equal(artfs.materialize(WV, hashes, token_end=40, mount=mnt.mountpoint), want)
    got = artfs.materialize(WV, [bytes.fromhex(h) for h in hashes], token_end=40, block_size=16,
                            mount=mnt.mountpoint)
    assert np.array_equal(got, want)
    with pytest.raises(OSError) as e:
        artfs.materialize(WV, hashes, token_end=41, mount=mnt.mountpoint)
    assert e.value.errno == errno.EBADMSG
    with pytest.raises(FileNotFoundError):
        artfs.materialize(WV, hashes[:2] + ["ee"], token_end=40, mount=mnt.mountpoint)


# ---- batches and key-addressed reads (DESIGN.md §3.6, §3.7) -------------------------------
#
# Expected of the daemon: .keys/.put takes envelopes back to back, <wv>/.put
# records "<hash hex>\n" + envelope; each record commits or fails on its own,
# in order, as a single publish would; fsync() (and close()) return 0 or the
# errno of the first failing record; read from offset 0 after fsync gives one
# line per record, "<key hex> <0|EEXIST|EBADMSG|ENOSPC|EFBIG>". .keys/.get takes
# keys one a line and reads back the envelopes as published, in the order
# asked; ENOENT when a key is absent, EIO when an object fails its checksum.
# .keys/<64 hex> reads one envelope, and a key-only object gains its
# <wv>/<hash> name when the same content is published by path.

def test_publish_many_by_key_then_get_envelopes(kmnt):
    cases = vector_cases()
    envs = [vector(c["name"], "envelope") for c in cases]
    results = artfs.publish_many(None, envs, mount=kmnt.mountpoint)
    assert [(r.key, r.errno) for r in results] == [(c["key"], 0) for c in cases]
    keys = [c["key"] for c in cases]
    assert artfs.get_envelopes(keys, mount=kmnt.mountpoint) == envs
    # In the order asked, repeats included, bare hex accepted.
    order = [2, 0, 2, 4]
    asked = [key_hex(keys[i]) if i == 4 else keys[i] for i in order]
    assert artfs.get_envelopes(asked, mount=kmnt.mountpoint) == [envs[i] for i in order]
    for key, env in zip(keys, envs):
        with open(kmnt.path(".keys", key_hex(key)), "rb") as f:
            assert f.read() == env
        assert os.stat(kmnt.path(".keys", key_hex(key))).st_size == len(env)
        assert key_hex(key) in os.listdir(kmnt.path(".keys"))
    # Published by key only: no <wv>/<hash> name.
    assert not os.path.exists(kmnt.path(cases[0]["weight_version"], cases[0]["block_hash"]))
    # Again: identical content is success, for every record.
    assert all(r.ok for r in artfs.publish_many(None, envs, mount=kmnt.mountpoint, check=True))


def test_publish_many_by_path_then_materialize(kmnt):
    cases = request_vectors()
    records = [(c["block_hash"], vector(c["name"], "envelope")) for c in cases]
    results = artfs.publish_many(WV, records, mount=kmnt.mountpoint, check=True)
    assert [(r.key, r.errno) for r in results] == [(c["key"], 0) for c in cases]
    want = np.load(os.path.join(VECTORS, "req-materialized.npy"))
    got = artfs.materialize(WV, [c["block_hash"] for c in cases], token_end=40,
                            mount=kmnt.mountpoint)
    assert np.array_equal(got, want)
    assert artfs.get_envelopes([c["key"] for c in cases], mount=kmnt.mountpoint) == \
        [env for _h, env in records]
    for c in cases:
        assert np.array_equal(artfs.read_r3(WV, c["block_hash"], mount=kmnt.mountpoint),
                              np.load(os.path.join(VECTORS, f"{c['name']}.npy")))


def test_publish_many_creates_the_version(kmnt):
    env = encode("rl-step-7", "aa", routed_experts(16))
    assert artfs.publish_many("rl-step-7", [(b"\xaa", env)], mount=kmnt.mountpoint)[0].ok
    assert os.path.isdir(kmnt.path("rl-step-7"))


def test_a_key_only_object_gains_its_name_when_published_by_path(kmnt):
    cases = request_vectors()
    envs = [vector(c["name"], "envelope") for c in cases]
    assert all(r.ok for r in artfs.publish_many(None, envs, mount=kmnt.mountpoint))
    used = kmnt.metrics()["artfs_bytes_used"]
    hashes = [c["block_hash"] for c in cases]
    os.makedirs(kmnt.path(WV), exist_ok=True)
    with pytest.raises(FileNotFoundError):
        artfs.materialize(WV, hashes, token_end=40, mount=kmnt.mountpoint)
    results = artfs.publish_many(WV, list(zip(hashes, envs)), mount=kmnt.mountpoint, check=True)
    assert all(r.ok for r in results)
    got = artfs.materialize(WV, hashes, token_end=40, mount=kmnt.mountpoint)
    assert np.array_equal(got, np.load(os.path.join(VECTORS, "req-materialized.npy")))
    # One object, one copy, one charge against capacity.
    assert kmnt.metrics()["artfs_bytes_used"] == used


def test_every_record_commits_or_fails_on_its_own(kmnt):
    a, b, c = (routed_experts(16, seed=i) for i in range(3))
    ka, kb, kc = (artfs.key_of(WV, h) for h in ("aa", "bb", "cc"))
    env_a = artfs.encode_envelope(a, key=ka, kind="block", source_token_start=0)
    collision = artfs.encode_envelope(b, key=ka, kind="block", source_token_start=0)
    bad = encode(WV, "bb", b, payload_sha256="0" * 64)
    env_c = artfs.encode_envelope(c, key=kc, kind="block", source_token_start=0)
    results = artfs.publish_many(None, [env_a, collision, bad, env_c], mount=kmnt.mountpoint)
    assert [(r.key, r.errno) for r in results] == [
        (ka, 0), (ka, errno.EEXIST), (kb, errno.EBADMSG), (kc, 0)]
    assert artfs.get_envelopes([ka, kc], mount=kmnt.mountpoint) == [env_a, env_c]
    with pytest.raises(FileNotFoundError):
        artfs.get_envelopes([kb], mount=kmnt.mountpoint)
    with pytest.raises(FileExistsError) as e:
        artfs.publish_many(None, [env_a, collision, bad], mount=kmnt.mountpoint, check=True)
    assert "record 1" in str(e.value) and ka in str(e.value)
    assert e.value.filename == kmnt.path(".keys", ".put")
    # The same through <wv>/.put.
    results = artfs.publish_many(WV, [("aa", env_a), ("aa", collision), ("bb", bad), ("cc", env_c)],
                                 mount=kmnt.mountpoint)
    assert [r.errno for r in results] == [0, errno.EEXIST, errno.EBADMSG, 0]
    # A record whose envelope is for another path is refused by <wv>/.put.
    results = artfs.publish_many(WV, [("dd", env_a)], mount=kmnt.mountpoint)
    assert results[0].errno == errno.EBADMSG


def test_batch_capacity_and_object_size(make_mount):
    m = with_keys(make_mount(capacity="64K", max_object="40K"))
    small = encode(WV, "aa", routed_experts(16))                  # 6 KiB
    large = encode(WV, "bb", routed_experts(100))                 # 37.5 KiB
    huge = encode(WV, "cc", routed_experts(120))                  # 45 KiB > max_object
    assert len(small) + 2 * len(large) > 64 * 1024 > len(small) + len(large)
    results = artfs.publish_many(None, [small, huge, large], mount=m.mountpoint)
    assert [r.errno for r in results] == [0, errno.EFBIG, 0]
    more = encode(WV, "dd", routed_experts(100, seed=9))
    results = artfs.publish_many(WV, [("dd", more), ("aa", small)], mount=m.mountpoint)
    assert [r.errno for r in results] == [errno.ENOSPC, 0]
    with pytest.raises(OSError) as e:
        artfs.publish_many(None, [more], mount=m.mountpoint, check=True)
    assert e.value.errno == errno.ENOSPC


def test_batch_records_span_writes_and_a_truncated_last_record_is_ebadmsg(kmnt):
    envs = [encode(WV, h, routed_experts(16, seed=i)) for i, h in enumerate(("aa", "bb", "cc"))]
    keys = [artfs.key_of(WV, h) for h in ("aa", "bb", "cc")]
    data = envs[0] + envs[1] + envs[2][:len(envs[2]) // 2]
    fd = os.open(kmnt.path(".keys", ".put"), os.O_RDWR)
    try:
        for off in range(0, len(data), 7):
            os.write(fd, data[off:off + 7])
        with pytest.raises(OSError) as e:
            os.fsync(fd)
        assert e.value.errno == errno.EBADMSG
        lines = os.pread(fd, 1 << 16, 0).decode().splitlines()
        assert lines[:2] == [f"{key_hex(keys[0])} 0", f"{key_hex(keys[1])} 0"]
        assert lines[2:] == [] or lines[2].endswith(" EBADMSG")
    finally:
        try:
            os.close(fd)  # repeats fsync's EBADMSG
        except OSError:
            pass
    assert artfs.get_envelopes(keys[:2], mount=kmnt.mountpoint) == envs[:2]
    with pytest.raises(FileNotFoundError):
        artfs.get_envelopes(keys[2:], mount=kmnt.mountpoint)
    # <wv>/.put: the hash line too may be cut anywhere.
    os.makedirs(kmnt.path(WV), exist_ok=True)
    data = b"".join(h.encode() + b"\n" + e for h, e in zip(("aa", "bb", "cc"), envs))
    fd = os.open(kmnt.path(WV, ".put"), os.O_RDWR)
    try:
        for off in range(0, len(data), 5):
            os.write(fd, data[off:off + 5])
        os.fsync(fd)
        assert os.pread(fd, 1 << 16, 0).decode().splitlines() == [f"{key_hex(k)} 0" for k in keys]
    finally:
        os.close(fd)
    assert os.path.exists(kmnt.path(WV, "cc"))


def test_get_envelopes_names_a_missing_or_damaged_key(kmnt):
    env = encode(WV, "aa", routed_experts(16))
    artfs.publish(WV, "aa", env, mount=kmnt.mountpoint)
    ka, kb = artfs.key_of(WV, "aa"), artfs.key_of(WV, "bb")
    with pytest.raises(FileNotFoundError) as e:
        artfs.get_envelopes([ka, kb], mount=kmnt.mountpoint)
    assert kb in str(e.value) and e.value.filename == kmnt.path(".keys", ".get")
    flip_byte(kmnt.store_file(WV, "aa"))
    with pytest.raises(OSError) as e:
        artfs.get_envelopes([ka], mount=kmnt.mountpoint)
    assert e.value.errno == errno.EIO and ka in str(e.value)
    with pytest.raises(OSError) as e:
        with open(kmnt.path(".keys", key_hex(ka)), "rb") as f:
            f.read()
    assert e.value.errno == errno.EIO


def test_large_batches_round_trip(kmnt):
    arrays = [routed_experts(16, seed=i) for i in range(300)]
    hashes = [f"{i:08x}" for i in range(300)]
    envs = [encode(WV, h, a, source_token_start=16 * i)
            for i, (h, a) in enumerate(zip(hashes, arrays))]
    assert all(r.ok for r in artfs.publish_many(WV, list(zip(hashes, envs)),
                                                mount=kmnt.mountpoint))
    keys = [artfs.key_of(WV, h) for h in hashes]
    assert artfs.get_envelopes(keys, mount=kmnt.mountpoint) == envs
    got = artfs.materialize(WV, hashes, mount=kmnt.mountpoint)
    assert np.array_equal(got, np.concatenate(arrays))
