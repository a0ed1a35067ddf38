# SPDX-License-Identifier: Apache-2.0
"""Publishing R3 objects through the mount: DESIGN.md §3.1 and §3.2."""
import json
import multiprocessing
import os
import signal
import struct
import subprocess
import time

import numpy as np
import pytest

from conftest import VECTORS, close_result, publish, read_result
from envelope import derive_key, encode, header_fields, npy_bytes, pack, routed_experts

WV = "default"
H1 = "3da2892d37823d9298e1d5011d7dcfaaf2d9d9a6d465e99be33af5be1d87c12b"


def vector_cases():
    with open(os.path.join(VECTORS, "vectors.json")) as f:
        return json.load(f)["cases"]


def vector(name, ext):
    with open(os.path.join(VECTORS, f"{name}.{ext}"), "rb") as f:
        return f.read()


def test_vllm_vectors_publish_and_read_back(mnt):
    for case in vector_cases():
        os.makedirs(mnt.path(case["weight_version"]), exist_ok=True)
        path = mnt.path(case["weight_version"], case["block_hash"])
        assert publish(path, vector(case["name"], "envelope")) == 0, case["name"]
        assert read_result(path) == vector(case["name"], "npy"), case["name"]
        assert os.stat(path).st_size == len(vector(case["name"], "npy"))
    assert mnt.metrics()["artfs_publishes_total"] == len(vector_cases())


def test_a_committed_object_is_never_opened_for_writing(mnt):
    """Writes through the readers' inode would grow the size the kernel
    serves them (they read zeros past the .npy): a published object is
    read-only for every user, root included. Idempotent re-publishing goes
    through .put (test_batch.py)."""
    os.mkdir(mnt.path(WV))
    arr = routed_experts(16)
    env = encode(WV, H1, arr)
    p = mnt.path(WV, H1)
    assert publish(p, env) == 0
    assert publish(p, env) == "open:EACCES"
    assert publish(p, env, flags=os.O_CREAT | os.O_WRONLY) == "open:EACCES"
    assert publish(p, env, flags=os.O_RDWR) == "open:EACCES"
    assert publish(p, encode(WV, H1, routed_experts(16, seed=9))) == "open:EACCES"
    assert read_result(p) == npy_bytes(arr)
    assert os.stat(p).st_size == len(npy_bytes(arr))
    m = mnt.metrics()
    assert m["artfs_publishes_total"] == 1
    assert m["artfs_collisions_total"] == 0


def test_o_excl_on_committed_key_fails_at_open(mnt):
    os.mkdir(mnt.path(WV))
    p = mnt.path(WV, H1)
    env = encode(WV, H1, routed_experts(16))
    assert publish(p, env, flags=os.O_CREAT | os.O_WRONLY | os.O_EXCL) == 0
    assert publish(p, env, flags=os.O_CREAT | os.O_WRONLY | os.O_EXCL) == "open:EEXIST"


def _malformed():
    arr = routed_experts(16)
    good = header_fields(WV, H1, arr)
    payload = arr.tobytes()

    def with_fields(**kw):
        f = dict(good)
        for k, v in kw.items():
            if v is None:
                f.pop(k)
            else:
                f[k] = v
        return pack(f, payload)

    canonical = json.dumps(good, sort_keys=True, separators=(",", ":")).encode()
    cases = {
        "header_length_zero": (struct.pack("<I", 0) + canonical + payload, "header_length"),
        "header_length_4097": (struct.pack("<I", 4097) + canonical + b" " * 4097 + payload,
                               "header_length"),
        "only_a_length": (struct.pack("<I", 300), "truncated"),
        "json_syntax": (pack(b"{not json", payload), "json"),
        "json_not_object": (pack(b"[1, 2, 3]", payload), "json"),
        "json_not_utf8": (pack(canonical.replace(b'"block"', b'"bl\xffck"'), payload), "json"),
        "json_duplicate_key": (pack(canonical[:-1] + b',"kind":"block"}', payload), "json"),
        "json_trailing_garbage": (pack(canonical + b"x", payload), "json"),
        "extra_field": (with_fields(extra=1), "fields"),
        "schema_2": (with_fields(schema_version=2), "schema"),
        "schema_string": (with_fields(schema_version="3"), "schema"),
        "schema_float": (with_fields(schema_version=3.0), "schema"),
        "key_of_other_path": (with_fields(key=derive_key(WV, "00ff")), "key"),
        "key_of_other_version": (with_fields(key=derive_key("other", H1)), "key"),
        "key_malformed": (with_fields(key="vllm-artifact/xyz"), "key"),
        "kind_unknown": (with_fields(kind="full"), "kind"),
        "field_unknown": (with_fields(field="logits"), "field"),
        "dtype_object": (with_fields(dtype="|O"), "dtype"),
        "dtype_unicode": (with_fields(dtype="<U4"), "dtype"),
        "dtype_size_3": (with_fields(dtype="|u3"), "dtype"),
        "dtype_f1": (with_fields(dtype="|f1"), "dtype"),
        "dtype_no_order": (with_fields(dtype="u2"), "dtype"),
        "shape_empty": (with_fields(shape=[]), "shape"),
        "shape_zero": (with_fields(shape=[0, 48, 8]), "shape"),
        "shape_negative": (with_fields(shape=[-16, 48, 8]), "shape"),
        "shape_nine_axes": (with_fields(shape=[1] * 9), "shape"),
        "shape_string": (with_fields(shape=["16", 48, 8]), "shape"),
        "shape_not_list": (with_fields(shape=16), "shape"),
        "token_start_negative": (with_fields(source_token_start=-1), "source_token_start"),
        "token_start_string": (with_fields(source_token_start="0"), "source_token_start"),
        "sha_uppercase": (with_fields(payload_sha256=good["payload_sha256"].upper()),
                          "checksum_format"),
        "sha_short": (with_fields(payload_sha256="ab" * 16), "checksum_format"),
        "payload_checksum": (pack(good, payload[:-1] + bytes([payload[-1] ^ 1])), "checksum"),
        "payload_short": (pack(good, payload[:-7]), "truncated"),
        "payload_long": (pack(good, payload + b"\0"), "trailing_bytes"),
        "size_mismatch_shape": (with_fields(shape=[15, 48, 8]), "trailing_bytes"),
    }
    for field in good:
        cases[f"missing_{field}"] = (with_fields(**{field: None}), "fields")
    return cases


MALFORMED = _malformed()


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_envelope_is_ebadmsg_at_close(mnt, case):
    data, reason = MALFORMED[case]
    os.mkdir(mnt.path(WV))
    p = mnt.path(WV, H1)
    closed, write_errors = close_result(p, data)
    assert closed == "EBADMSG"
    assert write_errors <= {"EBADMSG"}
    assert not os.path.exists(p)
    assert os.listdir(mnt.path(WV)) == []
    assert os.listdir(mnt.store_file(WV, "")) == []
    assert mnt.wait_log(f"publish {WV}/{H1}: rejected ({reason})"), mnt.log()
    assert mnt.metrics()[f'artfs_rejected_total{{reason="{reason}"}}'] == 1
    # The key is still free for a good publish afterwards.
    assert publish(p, encode(WV, H1, routed_experts(16))) == 0


def test_any_valid_json_layout_is_accepted(mnt):
    os.mkdir(mnt.path(WV))
    arr = routed_experts(16, dtype=np.uint16)
    fields = header_fields(WV, H1, arr)
    header = json.dumps(dict(reversed(list(fields.items()))), indent=4).encode() + b"\n\t "
    assert publish(mnt.path(WV, H1), pack(header, arr.tobytes())) == 0
    assert read_result(mnt.path(WV, H1)) == npy_bytes(arr)


def test_any_write_sizes(mnt):
    os.mkdir(mnt.path(WV))
    for i, chunk in enumerate([1, 3, 4, 5, 333, 4096, 65536]):
        h = f"{i:04x}"
        arr = routed_experts(16, seed=i)
        assert publish(mnt.path(WV, h), encode(WV, h, arr), chunk=chunk) == 0, chunk
        assert read_result(mnt.path(WV, h)) == npy_bytes(arr)


def test_non_sequential_write_is_refused(mnt):
    os.mkdir(mnt.path(WV))
    p = mnt.path(WV, H1)
    env = encode(WV, H1, routed_experts(16))
    fd = os.open(p, os.O_CREAT | os.O_WRONLY)
    os.write(fd, env[:100])
    with pytest.raises(OSError) as e:
        os.pwrite(fd, env[200:300], 200)
    assert e.value.strerror == os.strerror(74)  # EBADMSG
    with pytest.raises(OSError):
        os.close(fd)
    assert not os.path.exists(p)
    assert mnt.wait_log("rejected (out_of_order_write)")


def test_enospc_against_capacity(make_mount):
    m = make_mount(capacity="16K")
    os.mkdir(m.path(WV))
    envs = [encode(WV, f"{i:02x}", routed_experts(16, seed=i)) for i in range(3)]
    assert 2 * len(envs[0]) < 16 * 1024 < 3 * len(envs[0])
    assert publish(m.path(WV, "00"), envs[0]) == 0
    assert publish(m.path(WV, "01"), envs[1]) == 0
    closed, write_errors = close_result(m.path(WV, "02"), envs[2])
    assert closed == "ENOSPC" and write_errors <= {"ENOSPC"}
    assert not os.path.exists(m.path(WV, "02"))
    met = m.metrics()
    assert met['artfs_rejected_total{reason="no_space"}'] == 1
    assert met["artfs_bytes_used"] == len(envs[0]) + len(envs[1])
    assert met["artfs_bytes_reserved"] == 0
    os.unlink(m.path(WV, "00"))
    assert publish(m.path(WV, "02"), envs[2]) == 0
    assert m.metrics()["artfs_bytes_used"] == len(envs[1]) + len(envs[2])
    assert m.wait_log(f"publish {WV}/02: store full")


def test_efbig_against_max_object(make_mount):
    m = make_mount(max_object="4K")
    os.mkdir(m.path(WV))
    small = encode(WV, "00", routed_experts(4, layers=8))
    big = encode(WV, "01", routed_experts(16))
    assert len(small) <= 4096 < len(big)
    assert publish(m.path(WV, "00"), small) == 0
    closed, write_errors = close_result(m.path(WV, "01"), big)
    assert closed == "EFBIG" and write_errors <= {"EFBIG"}
    assert not os.path.exists(m.path(WV, "01"))
    assert m.metrics()['artfs_rejected_total{reason="too_large"}'] == 1
    assert m.wait_log(f"publish {WV}/01: object of {len(big)} bytes exceeds max_object 4096")


def _stat_in_child(path, q):
    try:
        os.stat(path)
        q.put("exists")
    except FileNotFoundError:
        q.put("ENOENT")


def stat_elsewhere(path):
    """stat from another process (the writer's own dentry must not count)."""
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_stat_in_child, args=(path, q))
    p.start()
    p.join()
    return q.get()


def test_invisible_until_close(mnt):
    os.mkdir(mnt.path(WV))
    p = mnt.path(WV, H1)
    env = encode(WV, H1, routed_experts(16))
    fd = os.open(p, os.O_CREAT | os.O_WRONLY)
    os.write(fd, env[:1000])
    assert stat_elsewhere(p) == "ENOENT"
    assert os.listdir(mnt.path(WV)) == []
    os.write(fd, env[1000:])
    assert stat_elsewhere(p) == "ENOENT"
    assert read_result(p) == "open:ENOENT"
    assert os.fstat(fd).st_size == len(env)
    os.close(fd)
    assert stat_elsewhere(p) == "exists"
    assert os.listdir(mnt.path(WV)) == [H1]


def test_fsync_returns_the_publish_result(mnt):
    os.mkdir(mnt.path(WV))
    p = mnt.path(WV, H1)
    env = encode(WV, H1, routed_experts(16))
    fd = os.open(p, os.O_CREAT | os.O_WRONLY)
    os.write(fd, env)
    os.fsync(fd)
    assert stat_elsewhere(p) == "exists"  # committed by fsync, before close
    with pytest.raises(PermissionError):
        os.write(fd, b"more")  # published objects are immutable
    os.close(fd)
    bad = encode(WV, "00", routed_experts(16), payload_sha256="0" * 64)
    assert publish(mnt.path(WV, "00"), bad, fsync=True) == "fsync:EBADMSG"


def test_close_early_leaves_nothing(mnt):
    os.mkdir(mnt.path(WV))
    p = mnt.path(WV, H1)
    env = encode(WV, H1, routed_experts(16))
    closed, _ = close_result(p, env[: len(env) // 2])
    assert closed == "EBADMSG"
    assert not os.path.exists(p)
    assert os.listdir(mnt.store_file(WV, "")) == []
    assert mnt.wait_log(f"publish {WV}/{H1}: rejected (truncated): closed after")
    assert mnt.metrics()["artfs_uploads_in_flight"] == 0


def _die_mid_write(path, data):
    fd = os.open(path, os.O_CREAT | os.O_WRONLY)
    os.write(fd, data)
    os.kill(os.getpid(), signal.SIGKILL)


def test_writer_killed_mid_publish_leaves_nothing(mnt):
    os.mkdir(mnt.path(WV))
    p = mnt.path(WV, H1)
    env = encode(WV, H1, routed_experts(16))
    ctx = multiprocessing.get_context("spawn")
    child = ctx.Process(target=_die_mid_write, args=(p, env[:5000]))
    child.start()
    child.join()
    assert child.exitcode == -signal.SIGKILL
    assert mnt.wait_log("rejected (truncated)")
    assert not os.path.exists(p)
    assert os.listdir(mnt.store_file(WV, "")) == []
    deadline = time.time() + 5
    while mnt.metrics()["artfs_uploads_in_flight"] and time.time() < deadline:
        time.sleep(0.05)
    assert mnt.metrics()["artfs_uploads_in_flight"] == 0
    assert publish(p, env) == 0


def _publish_worker(path, data, q):
    q.put(publish(path, data))


@pytest.mark.parametrize("same", [True, False])
def test_concurrent_publishers_of_one_key(mnt, same):
    os.mkdir(mnt.path(WV))
    p = mnt.path(WV, H1)
    arrays = [routed_experts(16, seed=0 if same else i) for i in range(8)]
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_publish_worker, args=(p, encode(WV, H1, a), q)) for a in arrays]
    for pr in procs:
        pr.start()
    for pr in procs:
        pr.join()
    results = sorted(str(q.get()) for _ in procs)
    # Those that raced into a create get close's verdict (identical 0,
    # different EEXIST); those that came after the commit find a read-only
    # object (EACCES at open).
    assert results.count("0") >= 1 and set(results) <= {"0", "close:EEXIST", "open:EACCES"}
    if same:
        assert "close:EEXIST" not in results, results
    else:
        assert results.count("0") == 1, results
    got = read_result(p)
    assert any(got == npy_bytes(a) for a in arrays)
    assert mnt.metrics()["artfs_publishes_total"] == 1


@pytest.mark.parametrize("name", ["xyz", "abc", "ABCD", "0" * 130, "0g", ".tmp.1"])
def test_invalid_object_names_are_einval(mnt, name):
    os.mkdir(mnt.path(WV))
    assert publish(mnt.path(WV, name), b"x") == "open:EINVAL"
    assert mnt.wait_log(f"create {WV}/{name}: not a block hash name")


def test_shortest_and_longest_names(mnt):
    os.mkdir(mnt.path(WV))
    for h in ["00", "ab" * 64]:
        arr = routed_experts(2)
        assert publish(mnt.path(WV, h), encode(WV, h, arr)) == 0
        assert read_result(mnt.path(WV, h)) == npy_bytes(arr)


def test_files_outside_a_version_are_refused(mnt):
    assert publish(mnt.path("file"), b"x") == "open:EPERM"
    os.mkdir(mnt.path(WV))
    with pytest.raises(PermissionError):
        os.mkdir(mnt.path(WV, "sub"))


def test_cp_publishes_and_reports_failure(mnt, tmp_path):
    os.mkdir(mnt.path(WV))
    arr = routed_experts(16)
    src = tmp_path / "obj.envelope"
    src.write_bytes(encode(WV, H1, arr))
    subprocess.run(["cp", str(src), mnt.path(WV, H1)], check=True)
    assert read_result(mnt.path(WV, H1)) == npy_bytes(arr)
    src.write_bytes(encode(WV, "00", arr, kind="nope"))
    r = subprocess.run(["cp", str(src), mnt.path(WV, "00")], capture_output=True, text=True)
    assert r.returncode != 0 and "Bad message" in r.stderr
    assert not os.path.exists(mnt.path(WV, "00"))
