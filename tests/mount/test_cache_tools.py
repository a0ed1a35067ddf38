# SPDX-License-Identifier: Apache-2.0
"""artfsctl cache and cache env (DESIGN.md §9): the environment lines,
which need no mount, the same as the Python package's; the table of a
tree and its metrics, first on a directory that looks like a mount (text
no daemon would write), then on a real one, written as the tools write;
and a mount whose daemon does not answer."""
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import artfsctl, wait_for

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "contrib", "python"))
from artfs import cache as pycache  # noqa: E402

VARS = [("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("TRITON_CACHE_DIR", "triton"),
        ("VLLM_CACHE_ROOT", "vllm"), ("DG_JIT_CACHE_DIR", "deep_gemm"),
        ("CUDA_CACHE_PATH", "cuda")]
LABELS = ["hits", "misses", "remote hits", "commits", "collisions", "evictions", "damaged",
          "bytes", "files", "capacity"]


def ctl(*args, mount=None, env=None, cwd=None):
    """artfsctl [-m mount] args: the finished process, stdout and stderr as text."""
    cmd = [artfsctl()] + (["-m", mount] if mount is not None else []) + list(args)
    environ = {k: v for k, v in os.environ.items() if k != "ARTFS_MOUNT"}
    environ.update(env or {})
    return subprocess.run(cmd, capture_output=True, text=True, errors="replace", env=environ,
                          cwd=cwd, timeout=60)


def human(n):
    """The units artfsctl prints: 512 B, 1.5 KiB, 8.0 GiB."""
    if n < 1024:
        return f"{n} B"
    d, units, u = n / 1024, ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"], 0
    while d >= 1023.95 and u + 1 < len(units):
        d /= 1024
        u += 1
    return f"{d:.1f} {units[u]}"


def parse(text):
    """The table ({name: (files, bytes text)}, notes below it) and the
    metrics ({label: value text})."""
    table, _, metrics = text.partition("\n\n")
    lines = table.splitlines()
    assert lines[0].split() == ["DIRECTORY", "FILES", "BYTES"], text
    rows, notes = {}, []
    for line in lines[1:]:
        words = line.split()
        if len(words) >= 3 and words[1].isdigit() and len(words) <= 4:
            rows[words[0]] = (int(words[1]), " ".join(words[2:]))
        else:
            notes.append(line)
    values = {line[:12].rstrip(): line[13:] for line in metrics.splitlines()}
    assert list(values) == LABELS, text
    return rows, notes, values


# ---- cache env: no mount needed ---------------------------------------------------

def test_env_lines_point_the_tools_at_the_tree():
    r = ctl("cache", "env", mount="/mnt/elsewhere")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"{v}=/mnt/elsewhere/.cache/{d}" for v, d in VARS]
    assert not os.path.exists("/mnt/elsewhere")


def test_env_lines_are_the_python_packages():
    for mount in ["/mnt/artifacts", "/a b/c", "/", "/x//y/"]:
        r = ctl("cache", "env", mount=mount)
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines() == [f"{k}={v}" for k, v in pycache.env(mount).items()]


def test_env_finds_the_mount_as_the_other_commands(tmp_path):
    r = ctl("cache", "env", env={"ARTFS_MOUNT": "/from/env"})
    assert r.stdout.splitlines()[0] == "TORCHINDUCTOR_CACHE_DIR=/from/env/.cache/inductor"
    r = ctl("cache", "env")
    assert r.stdout.splitlines()[0] == "TORCHINDUCTOR_CACHE_DIR=/mnt/artifacts/.cache/inductor"
    r = ctl("cache", "env", "-m", "/after/the/command")  # -m may follow the command
    assert r.stdout.splitlines()[1] == "TRITON_CACHE_DIR=/after/the/command/.cache/triton"
    r = ctl("cache", "env", mount="rel/mnt/", cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[2] == f"VLLM_CACHE_ROOT={tmp_path}/rel/mnt/.cache/vllm"


@pytest.mark.parametrize("mount", ["/mnt/artifacts", "/it's a \"mount\" $HOME `x` \\ ;"])
def test_env_shell_lines_evaluate_to_the_same_values(mount):
    r = ctl("cache", "env", "--shell", mount=mount)
    assert r.returncode == 0, r.stderr
    assert all(line.startswith("export ") for line in r.stdout.splitlines())
    names = " ".join(f'"${v}"' for v, _ in VARS)
    sh = subprocess.run(["sh", "-c", r.stdout + f"printf '%s\\n' {names}"],
                        capture_output=True, text=True, env={"HOME": "/nohome"}, timeout=30)
    assert sh.returncode == 0, sh.stderr
    assert sh.stdout.splitlines() == [f"{mount.rstrip('/')}/.cache/{d}" for _, d in VARS]


def test_env_refuses_a_control_character_in_the_mount():
    r = ctl("cache", "env", mount="/mnt/a\nTRITON_CACHE_DIR=/tmp")
    assert r.returncode == 1 and "control character" in r.stderr
    assert r.stdout == ""


@pytest.mark.parametrize("args", [
    ["cache", "env", "extra"], ["cache", "bogus"], ["cache", "--shell"],
    ["cache", "env", "--timeout", "3"], ["cache", "--timeout", "0"], ["cache", "--nope"],
    ["cache", "--timeout"],
])
def test_usage_errors_exit_2(args):
    r = ctl(*args, mount="/mnt/x")
    assert r.returncode == 2, (args, r.stdout, r.stderr)
    assert "usage:" in r.stderr


def test_help_names_both():
    r = ctl("--help")
    assert r.returncode == 0
    assert "  cache [--timeout SECONDS]" in r.stdout and "  cache env [--shell]" in r.stdout


# ---- the table, on a directory that looks like a mount -------------------------------

def fake_mount(tmp_path, metrics=b""):
    d = tmp_path / "fake"
    (d / ".artfs").mkdir(parents=True)
    (d / ".artfs" / "config").write_bytes(b"")
    (d / ".artfs" / "metrics").write_bytes(metrics)
    return d


def test_table_of_a_tree_and_its_metrics(tmp_path):
    d = fake_mount(tmp_path, b"\n".join([
        b"# HELP artfs_cache_hits whatever",
        b"artfs_cache_hits 12",
        b"artfs_cache_misses_total 3",                   # a counter's Prometheus name
        b"artfs_cache_commits 1.5e1",
        b"artfs_cache_bytes 3072",
        b"artfs_cache_capacity_bytes 1073741824",
        b"artfs_cache_files{version=\"x\"} 9",            # labelled: not the metric
        b"artfs_cache_evictions NaN",                    # unusable
        b"artfs_cache_damaged_extra 4",                  # another name
        b"\x00\xff\x1b[31m garbage",
    ]))
    c = d / ".cache"
    (c / "inductor" / "a" / "b").mkdir(parents=True)
    (c / "inductor" / "a" / "f1").write_bytes(b"x" * 100)
    (c / "inductor" / "a" / "b" / "f2").write_bytes(b"y" * 2000)
    (c / "triton").mkdir()
    (c / "top").write_bytes(b"z" * 7)
    (c / "odd\x1bname").mkdir()
    r = ctl("cache", mount=str(d))
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout
    rows, notes, values = parse(r.stdout)
    assert rows == {"inductor": (2, human(2100)), "odd?name": (0, "0 B"), "top": (1, "7 B"),
                    "triton": (0, "0 B"), "total": (3, human(2107))}
    assert list(rows)[:-1] == sorted(list(rows)[:-1])
    assert notes == []
    assert values == {"hits": "12", "misses": "3", "remote hits": "-", "commits": "15",
                      "collisions": "-", "evictions": "-", "damaged": "-",
                      "bytes": "3.0 KiB", "files": "-", "capacity": "1.0 GiB"}


def test_table_of_an_empty_tree_without_metrics(tmp_path):
    d = fake_mount(tmp_path)
    (d / ".cache").mkdir()
    r = ctl("cache", mount=str(d))
    assert r.returncode == 0, r.stderr
    rows, notes, values = parse(r.stdout)
    assert rows == {"total": (0, "0 B")} and notes == []
    assert set(values.values()) == {"-"}


def test_the_walk_stops_at_depth_32_and_says_so(tmp_path):
    d = fake_mount(tmp_path)
    path = d / ".cache" / "deep"
    for level in range(1, 35):   # .cache/deep is level 1
        path.mkdir(parents=True)
        (path / "f").write_bytes(b"1234")
        path = path / "d"
    r = ctl("cache", mount=str(d))
    assert r.returncode == 0, r.stderr
    rows, notes, _ = parse(r.stdout)
    assert rows["deep"] == (32, "128 B")   # the directories of levels 1 to 32
    assert notes == ["directories deeper than 32 levels were not counted"]


def test_a_mount_without_the_tree_or_not_a_mount(tmp_path):
    d = fake_mount(tmp_path)
    r = ctl("cache", mount=str(d))
    assert r.returncode == 1 and "has no .cache/ tree" in r.stderr, r.stderr
    assert r.stdout == ""
    r = ctl("cache", mount=str(tmp_path / "nothing"))
    assert r.returncode == 1 and "is not an artfs mount" in r.stderr, r.stderr


# ---- on a real mount --------------------------------------------------------------

def tool_write(path, data):
    """As torch.compile and Triton write a cache entry: a temporary file,
    written whole, closed, renamed over the final name."""
    tmp = f"{path}.tmp.{os.getpid()}"
    fd = os.open(tmp, os.O_CREAT | os.O_TRUNC | os.O_WRONLY | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def test_table_of_a_real_mount(mnt):
    """Fails until the daemon serves .cache/ (DESIGN.md §9)."""
    assert os.path.isdir(mnt.path(".cache")), "the daemon serves no .cache/ tree"
    os.makedirs(mnt.path(".cache", "inductor", "a"), exist_ok=True)
    tool_write(mnt.path(".cache", "inductor", "a", "graph.py"), b"g" * 1500)
    tool_write(mnt.path(".cache", "inductor", "entry"), b"e" * 300)
    r = ctl("cache", mount=mnt.mountpoint)
    assert r.returncode == 0, r.stderr
    rows, notes, values = parse(r.stdout)
    assert rows["inductor"] == (2, human(1800)), r.stdout
    assert rows["total"] == (2, human(1800)), r.stdout
    assert notes == [], r.stdout
    assert "-" not in values.values(), r.stdout   # the daemon has every metric
    assert values["commits"] == "2" and values["files"] == "2", r.stdout
    assert values["bytes"] == human(1800), r.stdout


def test_a_mount_whose_daemon_does_not_answer(mnt, tmp_path):
    """The daemon stopped: the command says so within its timeout instead
    of waiting for good, and answers again once the daemon goes on."""
    # Stopped only once idle: a lookup it had read and not answered (its
    # attach socket's, at start) would hold the walking child's lookup of
    # the same name where not even SIGKILL ends it.
    assert wait_for(lambda: os.path.exists(mnt.path(".artfs", "attach")), timeout=20)
    os.listdir(mnt.mountpoint)
    pid = mnt.daemon_pid()
    os.kill(pid, signal.SIGSTOP)
    out, err = tmp_path / "out", tmp_path / "err"
    try:
        start = time.monotonic()
        # files, not pipes: the command's end is what is timed, not its
        # killed child's (which may end only once the daemon goes on)
        with open(out, "w") as o, open(err, "w") as e:
            rc = subprocess.run([artfsctl(), "-m", mnt.mountpoint, "cache", "--timeout", "2"],
                                stdout=o, stderr=e, timeout=60).returncode
        took = time.monotonic() - start
        assert rc == 1 and "does not answer within 2 s" in err.read_text(), err.read_text()
        assert out.read_text() == ""
        assert took < 20, took
    finally:
        os.kill(pid, signal.SIGCONT)
    r = ctl("cache", mount=mnt.mountpoint)
    assert r.returncode in (0, 1), r.stderr
    assert "does not answer" not in r.stderr
