# SPDX-License-Identifier: Apache-2.0
"""artfsctl (DESIGN.md §2, §3.4): status and materialize on real mounts,
through nothing but the files of the mount; exit 0 success, 1 operational
failure, 2 usage error."""
import json
import os
import re
import subprocess

import numpy as np
import pytest

from conftest import DAEMON, VECTORS, publish, read_result
from envelope import encode, npy_bytes, routed_experts

WV = "default"
REQ = ["req-block0", "req-block1", "req-tail"]


def ctl_path():
    path = os.environ.get("ARTFSCTL_BIN")
    if not path and DAEMON:
        path = os.path.join(os.path.dirname(DAEMON), "artfsctl")
    return path


@pytest.fixture(scope="module")
def ctl_bin():
    path = ctl_path()
    assert path and os.access(path, os.X_OK), \
        f"no artfsctl at {path!r} (set ARTFSCTL_BIN, or run through make check)"
    return path


@pytest.fixture
def ctl(ctl_bin):
    """ctl(*args, mount=..., stdin=b"", env={...}): the finished process,
    stdout as bytes, stderr as text. Without mount= no -m is given."""
    def run(*args, mount=None, stdin=b"", env=None, stdout=subprocess.PIPE):
        cmd = [ctl_bin] + (["-m", mount] if mount is not None else []) + list(args)
        environ = {k: v for k, v in os.environ.items() if k != "ARTFS_MOUNT"}
        environ.update(env or {})
        r = subprocess.run(cmd, input=stdin, stdout=stdout, stderr=subprocess.PIPE,
                           env=environ, timeout=60)
        r.stderr = r.stderr.decode(errors="replace")
        return r
    return run


def human(n):
    """The units artfsctl prints: 512 B, 1.5 KiB, 8.0 GiB."""
    if n < 1024:
        return f"{n} B"
    d, units = n / 1024, ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"]
    u = 0
    while d >= 1023.95 and u + 1 < len(units):
        d /= 1024
        u += 1
    return f"{d:.1f} {units[u]}"


def status_fields(text):
    """The `key   value` lines above the table, and the table rows by version."""
    head, _, table = text.partition("\n\n")
    fields = {}
    for line in head.splitlines():
        k, _, v = line.partition(" ")
        fields[k] = v.strip()
    rows = {}
    lines = table.splitlines()
    if lines and lines[0].split() == ["VERSION", "OBJECTS", "BYTES", "IDLE", "OPEN"]:
        for line in lines[1:]:
            words = line.split()
            if len(words) == 6:  # bytes with a unit; "?" where a sample is missing
                words[2:4] = [" ".join(words[2:4])]
            name, objects, size, idle, open_files = words
            rows[name] = {"objects": int(objects) if objects.isdigit() else objects,
                          "bytes": size, "idle": idle,
                          "open": int(open_files) if open_files.isdigit() else open_files}
    return fields, rows, lines


IDLE = re.compile(r"^(\d+s|\d+m\d\ds|\d+h\d\dm|\d+d\d\dh)$")


# -- status ------------------------------------------------------------------------

def test_status_of_an_empty_mount(mnt, ctl):
    r = ctl("status", mount=mnt.mountpoint)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    out = r.stdout.decode()
    fields, rows, lines = status_fields(out)
    assert fields["mount"] == mnt.mountpoint
    assert fields["store"] == mnt.store
    assert fields["objects"] == "0 in 0 versions"
    assert fields["used"] == "0 B of 8.0 GiB (0.0%)"
    assert fields["reserved"] == "0 B by 0 publishes in flight"
    assert fields["publishes"] == "0, 0 checksum failures"
    assert fields["ttl"] == "1h00m (3600 s)"
    assert rows == {} and lines == ["no weight versions"]


def test_status_after_publishing_into_two_versions(make_mount, ctl):
    m = make_mount(capacity="1M", ttl="0")
    for wv, count in [("rl-step-2", 1), ("alpha", 3)]:
        os.mkdir(m.path(wv))
        for i in range(count):
            h = f"{i:04x}"
            assert publish(m.path(wv, h), encode(wv, h, routed_experts(16, seed=i))) == 0
    os.mkdir(m.path("empty"))
    assert isinstance(read_result(m.path("alpha", "0000")), bytes)
    metrics = m.metrics()
    r = ctl("status", mount=m.mountpoint)
    assert r.returncode == 0, r.stderr
    fields, rows, _ = status_fields(r.stdout.decode())
    used = metrics["artfs_bytes_used"]
    assert fields["objects"] == "4 in 3 versions"
    assert fields["used"] == f"{human(used)} of 1.0 MiB ({100 * used / (1 << 20):.1f}%)"
    assert fields["publishes"] == "4, 0 checksum failures"
    assert fields["ttl"] == "never (0)"
    assert list(rows) == ["alpha", "empty", "rl-step-2"]  # sorted by name
    for wv, count in [("alpha", 3), ("rl-step-2", 1), ("empty", 0)]:
        assert rows[wv]["objects"] == count
        assert rows[wv]["bytes"] == human(metrics[f'artfs_version_bytes{{version="{wv}"}}'])
        assert IDLE.match(rows[wv]["idle"]), rows[wv]
        assert rows[wv]["open"] == 0
    assert rows["alpha"]["bytes"] != "0 B"


def test_status_counts_open_files(mnt, ctl):
    os.mkdir(mnt.path(WV))
    assert publish(mnt.path(WV, "aa"), encode(WV, "aa", routed_experts(4))) == 0
    with open(mnt.path(WV, "aa"), "rb"):
        r = ctl("status", mount=mnt.mountpoint)
    assert r.returncode == 0, r.stderr
    _, rows, _ = status_fields(r.stdout.decode())
    assert rows[WV]["objects"] == 1 and rows[WV]["open"] == 1


def test_status_finds_the_mount_through_m_and_artfs_mount(mnt, ctl, tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    by_env = ctl("status", env={"ARTFS_MOUNT": mnt.mountpoint})
    assert by_env.returncode == 0, by_env.stderr
    assert status_fields(by_env.stdout.decode())[0]["mount"] == mnt.mountpoint
    # -m wins over $ARTFS_MOUNT, before or after the command.
    for args in (["-m", mnt.mountpoint, "status"], ["status", "-m", mnt.mountpoint],
                 ["--mount", mnt.mountpoint, "status"], [f"--mount={mnt.mountpoint}", "status"]):
        r = ctl(*args, env={"ARTFS_MOUNT": str(plain)})
        assert r.returncode == 0, (args, r.stderr)
        assert status_fields(r.stdout.decode())[0]["mount"] == mnt.mountpoint
    # A trailing slash names the same mount.
    assert ctl("status", mount=mnt.mountpoint + "/").returncode == 0
    r = ctl("status", env={"ARTFS_MOUNT": str(plain)})
    assert r.returncode == 1 and f"{plain} is not an artfs mount" in r.stderr


def test_status_refuses_a_directory_that_is_not_artfs(ctl, tmp_path):
    for path in (str(tmp_path), str(tmp_path / "missing")):
        r = ctl("status", mount=path)
        assert r.returncode == 1
        assert r.stdout == b""
        assert r.stderr.startswith(f"artfsctl: {path} is not an artfs mount (")
        assert "No such file or directory" in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1


def test_the_default_mount_point(ctl, tmp_path):
    """Without -m and $ARTFS_MOUNT, /mnt/artifacts (not mounted here)."""
    if os.path.exists("/mnt/artifacts/.artfs/config"):
        pytest.skip("an artfs is mounted on /mnt/artifacts")
    r = ctl("status")
    assert r.returncode == 1 and "/mnt/artifacts is not an artfs mount" in r.stderr


def fake_mount(tmp_path, config, metrics):
    """A directory that looks like an artfs mount, to feed status text that
    no daemon would write."""
    d = tmp_path / "fake"
    (d / ".artfs").mkdir(parents=True, exist_ok=True)
    (d / ".artfs" / "config").write_bytes(config)
    (d / ".artfs" / "metrics").write_bytes(metrics)
    return str(d)


def test_status_reads_the_exposition_format_robustly(ctl, tmp_path):
    metrics = b"\n".join([
        b"# HELP artfs_objects whatever",
        b"artfs_objects 7 1700000000000",                 # a timestamp
        b"artfs_versions\t2",
        b"artfs_bytes_used 1.5e3",                       # a float
        b"artfs_capacity_bytes 3000",
        b"artfs_uploads_in_flight NaN",                  # unusable: shown as ?
        b"artfs_version_objects{version=\"b\"} 2",
        b"artfs_version_objects{ job=\"x\" , version=\"a\" } 5",
        b"artfs_version_bytes{version=\"a\"} 2048",
        b"artfs_version_idle_seconds{version=\"a\"} 7830",
        b"artfs_version_idle_seconds{version=\"b\"} 303",
        b"artfs_version_open_files{version=\"a\"} 1",
        b"artfs_version_objects{version=\"bad name\"} 9",  # not a version name
        b"artfs_version_objects{version=\"a\\\"x\"} 9",
        b"artfs_version_objects{version=\"c\" 9",         # unterminated
        b"artfs_version_objects{version=\"d\"}",          # no value
        b"artfs_publishes_total -4",                     # negative
        b"unknown_metric{version=\"a\"} 1",
        b"artfs_checksum_failures_total " + b"9" * 5000,  # an over-long line
        b"\x00\xff\x1b[31m garbage",
    ])
    config = b"store = /dev/shm/x\x1b[2J\nttl = 90061\nnonsense\ncapacity = 99\n=\n"
    r = ctl("status", mount=fake_mount(tmp_path, config, metrics))
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode()
    fields, rows, _ = status_fields(out)
    assert "\x1b" not in out
    assert fields["store"] == "/dev/shm/x?[2J"
    assert fields["objects"] == "7 in 2 versions"
    assert fields["used"] == "1.5 KiB of 2.9 KiB (50.0%)"
    assert fields["reserved"] == "? by ? publishes in flight"
    assert fields["publishes"] == "?, ? checksum failures"
    assert fields["ttl"] == "1d01h (90061 s)"
    assert list(rows) == ["a", "b"]
    assert rows["a"] == {"objects": 5, "bytes": "2.0 KiB", "idle": "2h10m", "open": 1}
    assert rows["b"] == {"objects": 2, "bytes": "?", "idle": "5m03s", "open": "?"}


@pytest.mark.parametrize("seed", range(4))
def test_status_survives_random_bytes(ctl, tmp_path, seed):
    rng = np.random.default_rng(seed)
    lines = [b"artfs_version_objects{version=\"v%d\"} %d" % (i, i) for i in range(50)]
    text = b"\n".join(lines)
    noise = bytearray(text)
    for pos in rng.integers(0, len(noise), size=200):
        noise[pos] = int(rng.integers(0, 256))
    blob = rng.integers(0, 256, size=100000, dtype=np.uint8).tobytes()
    for config, metrics in [(blob, blob), (bytes(noise), bytes(noise)), (b"", b"")]:
        r = ctl("status", mount=fake_mount(tmp_path, config, metrics))
        assert r.returncode == 0, r.stderr
        assert b"\x1b" not in r.stdout


def test_status_with_many_versions(ctl, tmp_path):
    n = 20000
    metrics = "".join(f'artfs_version_{k}{{version="v{i:05d}"}} {i}\n'
                      for k in ("objects", "bytes", "idle_seconds", "open_files")
                      for i in reversed(range(n))).encode()
    r = ctl("status", mount=fake_mount(tmp_path, b"", metrics))
    assert r.returncode == 0, r.stderr
    _, rows, _ = status_fields(r.stdout.decode())
    assert list(rows) == [f"v{i:05d}" for i in range(n)]
    assert rows["v19999"]["objects"] == 19999


# -- materialize --------------------------------------------------------------------

def vectors():
    with open(os.path.join(VECTORS, "vectors.json")) as f:
        return {c["name"]: c for c in json.load(f)["cases"]}


def publish_request(m):
    """Publishes the vLLM-made request; returns its hashes in token order."""
    cases = vectors()
    os.mkdir(m.path(WV))
    hashes = []
    for name in REQ:
        with open(os.path.join(VECTORS, name + ".envelope"), "rb") as f:
            env = f.read()
        h = cases[name]["block_hash"]
        assert publish(m.path(WV, h), env) == 0
        hashes.append(h)
    return hashes


def expected_npy():
    with open(os.path.join(VECTORS, "req-materialized.npy"), "rb") as f:
        return f.read()


def lines(hashes):
    return "".join(h + "\n" for h in hashes).encode()


def test_materialize_the_vllm_request(mnt, ctl):
    hashes = publish_request(mnt)
    want = expected_npy()
    r = ctl("materialize", WV, "--token-end", "40", mount=mnt.mountpoint, stdin=lines(hashes))
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    assert r.stdout == want
    # The same without token_end (the rows add up), with block_size, with
    # options first and =, blank lines, CRLF and spaces, no final newline.
    stdin = b"\n  " + hashes[0].encode() + b"  \r\n\n" + hashes[1].encode() + b"\n" + \
        hashes[2].encode()
    for args in ([WV], [WV, "--block-size", "16"], ["--token-end=40", "--block-size=16", WV]):
        r = ctl("materialize", *args, mount=mnt.mountpoint, stdin=stdin)
        assert r.returncode == 0, (args, r.stderr)
        assert r.stdout == want, args


def test_materialize_writes_to_a_file(mnt, ctl, tmp_path):
    hashes = publish_request(mnt)
    out = tmp_path / "out.npy"
    with open(out, "wb") as f:
        r = ctl("materialize", WV, "--token-end", "40", mount=mnt.mountpoint,
                stdin=lines(hashes), stdout=f)
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == expected_npy()
    assert np.load(out).shape == (40, 61, 8)


def test_materialize_a_long_request(mnt, ctl):
    """More than one read and one write of the tool's buffers."""
    os.mkdir(mnt.path(WV))
    parts, hashes = [], []
    for i in range(300):
        h = f"{i:08x}" * 4
        rows = 16 if i < 299 else 5
        arr = routed_experts(rows, dtype=np.uint16, seed=i)
        assert publish(mnt.path(WV, h), encode(WV, h, arr, kind="block" if rows == 16 else "tail",
                                              source_token_start=16 * i)) == 0
        parts.append(arr)
        hashes.append(h)
    r = ctl("materialize", WV, "--token-end", str(16 * 299 + 5), mount=mnt.mountpoint,
            stdin=lines(hashes))
    assert r.returncode == 0, r.stderr
    assert r.stdout == npy_bytes(np.concatenate(parts))
    assert len(r.stdout) > 2 << 20


def test_materialize_a_missing_object(mnt, ctl):
    hashes = publish_request(mnt)
    r = ctl("materialize", WV, "--token-end", "40", mount=mnt.mountpoint,
            stdin=lines(hashes[:2] + ["00ff"]))
    assert r.returncode == 1
    assert r.stdout == b""
    assert r.stderr == ("artfsctl: materialize default: an object of the request does not exist "
                        "(No such file or directory)\n")
    assert mnt.wait_log("object 2 (00ff) does not exist")


@pytest.mark.parametrize("bad", ["XYZ", "ABCD", "abc", "a", "ab cd", "0x12", "g0", "ab" * 65,
                                 "ab" * 5000, "ab\x00cd", "token_end 40"])
def test_materialize_a_bad_hash_line(mnt, ctl, bad):
    hashes = publish_request(mnt)
    stdin = lines(hashes[:1]) + b"\n" + bad.encode() + b"\n" + lines(hashes[1:])
    r = ctl("materialize", WV, mount=mnt.mountpoint, stdin=stdin)
    assert r.returncode == 2
    assert r.stdout == b""
    assert r.stderr.startswith("artfsctl: stdin line 3: ")
    assert len(r.stderr.splitlines()) == 1


def test_materialize_with_no_hashes(mnt, ctl):
    os.mkdir(mnt.path(WV))
    for stdin in (b"", b"\n\n  \n"):
        r = ctl("materialize", WV, mount=mnt.mountpoint, stdin=stdin)
        assert r.returncode == 2 and r.stdout == b""
        assert "no block hashes on stdin" in r.stderr


@pytest.mark.parametrize("case", ["order", "token_end", "block_size", "duplicate"])
def test_materialize_a_layout_error(mnt, ctl, case):
    hashes = publish_request(mnt)
    args, stdin = [WV], lines(hashes)
    if case == "order":
        stdin = lines([hashes[1], hashes[0], hashes[2]])
    elif case == "token_end":
        args += ["--token-end", "41"]
    elif case == "block_size":
        args += ["--block-size", "8"]
    else:
        stdin = lines([hashes[0], hashes[0], hashes[1], hashes[2]])
    r = ctl("materialize", *args, mount=mnt.mountpoint, stdin=stdin)
    assert r.returncode == 1
    assert r.stdout == b""
    assert r.stderr == ("artfsctl: materialize default: the objects do not form the request "
                        "(see the daemon log) (Bad message)\n")


def test_materialize_a_corrupted_object(mnt, ctl):
    hashes = publish_request(mnt)
    path = mnt.store_file(WV, hashes[1])
    with open(path, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        b = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([b[0] ^ 1]))
    r = ctl("materialize", WV, mount=mnt.mountpoint, stdin=lines(hashes))
    assert r.returncode == 1 and r.stdout == b""
    assert "an object failed verification (Input/output error)" in r.stderr


def test_materialize_an_absent_version_or_mount(mnt, ctl, tmp_path):
    r = ctl("materialize", "nope", mount=mnt.mountpoint, stdin=b"abcd\n")
    assert r.returncode == 1 and r.stdout == b""
    assert f'no weight version "nope" in {mnt.mountpoint}' in r.stderr
    r = ctl("materialize", WV, mount=str(tmp_path), stdin=b"abcd\n")
    assert r.returncode == 1 and "is not an artfs mount" in r.stderr


def test_materialize_refuses_a_terminal(mnt, ctl):
    hashes = publish_request(mnt)
    master, slave = os.openpty()
    try:
        r = ctl("materialize", WV, mount=mnt.mountpoint, stdin=lines(hashes), stdout=slave)
        os.set_blocking(master, False)
        try:
            echoed = os.read(master, 1 << 16)
        except BlockingIOError:
            echoed = b""
    finally:
        os.close(slave)
        os.close(master)
    assert r.returncode == 1
    assert "stdout is a terminal" in r.stderr
    assert echoed == b""


# -- usage --------------------------------------------------------------------------

@pytest.mark.parametrize("args", [
    [], ["bogus"], ["-x", "status"], ["-m"], ["status", "extra"], ["status", "--json"],
    ["materialize"], ["materialize", "a", "b"], ["materialize", "bad name"],
    ["materialize", ".hidden"], ["materialize", WV, "--token-end"],
    ["materialize", WV, "--token-end", "0"], ["materialize", WV, "--token-end", "-3"],
    ["materialize", WV, "--block-size", "12x"], ["materialize", WV, "--token-end", ""],
    ["materialize", WV, "--token-end", "99999999999999999999999"],
    ["materialize", WV, "--nope"], ["-m", "", "status"],
])
def test_usage_errors_exit_2(ctl, args):
    r = ctl(*args, stdin=b"abcd\n")
    assert r.returncode == 2, (args, r.stderr)
    assert r.stdout == b""
    first, rest = r.stderr.split("\n", 1)
    assert first.startswith("artfsctl: ")
    assert "usage: artfsctl [-m MOUNTPOINT]" in rest


def test_help(ctl):
    for args in (["-h"], ["--help"], ["status", "-h"], ["materialize", "--help"]):
        r = ctl(*args)
        assert r.returncode == 0 and r.stderr == ""
        out = r.stdout.decode()
        assert out.startswith("usage: artfsctl [-m MOUNTPOINT] <command>")
        assert "status" in out and "materialize <wv> [--token-end N] [--block-size N]" in out
