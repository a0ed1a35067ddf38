# SPDX-License-Identifier: Apache-2.0
"""The namespace (DESIGN.md §2): versions, .artfs, modes, what is refused."""
import os
import re
import stat
import subprocess

import pytest

from conftest import Mount, publish, read_result, wait_for
from envelope import encode, routed_experts

WV = "default"


def test_empty_mount(mnt):
    assert sorted(os.listdir(mnt.mountpoint)) == [".artfs", ".blocks", ".cache", ".keys"]
    st = os.stat(mnt.mountpoint)
    assert stat.S_ISDIR(st.st_mode)
    # attach: the socket engines fetch weight slabs on, bound by the daemon
    # in its own mount once it serves
    assert wait_for(lambda: os.path.exists(mnt.path(".artfs", "attach")))
    assert sorted(os.listdir(mnt.path(".artfs"))) == ["attach", "config", "control", "metrics"]
    st = os.stat(mnt.path(".artfs", "attach"))
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o666
    out = subprocess.run(["ls", "-la", mnt.mountpoint], capture_output=True, text=True,
                         check=True).stdout
    assert ".artfs" in out


@pytest.mark.parametrize("name", ["default", "rl-step-0042", "a", "V1.2_x-y", "z" * 128, "0"])
def test_valid_version_names(mnt, name):
    os.mkdir(mnt.path(name))
    assert stat.S_ISDIR(os.stat(mnt.path(name)).st_mode)
    assert name in os.listdir(mnt.mountpoint)
    assert os.path.isdir(mnt.store_file(name, ""))


@pytest.mark.parametrize("name", [".hidden", "-x", "_x", "a b", "z" * 129, "ä", "a:b"])
def test_invalid_version_names_are_einval(mnt, name):
    with pytest.raises(OSError) as e:
        os.mkdir(mnt.path(name))
    assert e.value.errno == 22
    r = subprocess.run(["mkdir", mnt.path(name)], capture_output=True, text=True)
    assert r.returncode != 0 and "Invalid argument" in r.stderr


def test_mkdir_existing_and_mkdir_p(mnt):
    os.mkdir(mnt.path(WV))
    with pytest.raises(FileExistsError):
        os.mkdir(mnt.path(WV))
    subprocess.run(["mkdir", "-p", mnt.path(WV)], check=True)
    subprocess.run(["mkdir", "-p", mnt.path("other")], check=True)
    assert sorted(os.listdir(mnt.mountpoint)) == [".artfs", ".blocks", ".cache", ".keys", WV, "other"]


def test_rmdir_and_rm_rf(mnt):
    os.mkdir(mnt.path("empty"))
    os.rmdir(mnt.path("empty"))
    assert not os.path.exists(mnt.path("empty"))
    assert not os.path.exists(mnt.store_file("empty", ""))
    os.mkdir(mnt.path(WV))
    for i in range(5):
        h = f"{i:02x}"
        assert publish(mnt.path(WV, h), encode(WV, h, routed_experts(4, seed=i))) == 0
    with pytest.raises(OSError) as e:
        os.rmdir(mnt.path(WV))
    assert e.value.errno == 39  # ENOTEMPTY
    subprocess.run(["rm", "-rf", mnt.path(WV)], check=True)
    assert not os.path.exists(mnt.path(WV))
    assert not os.path.exists(mnt.store_file(WV, ""))
    m = mnt.metrics()
    assert m["artfs_objects"] == 0 and m["artfs_versions"] == 0 and m["artfs_bytes_used"] == 0
    # The name is free again.
    os.mkdir(mnt.path(WV))
    assert os.listdir(mnt.path(WV)) == []


def test_removed_version_disappears_for_other_processes(mnt):
    os.mkdir(mnt.path(WV))
    assert publish(mnt.path(WV, "00"), encode(WV, "00", routed_experts(4))) == 0
    assert subprocess.run(["stat", mnt.path(WV, "00")], capture_output=True).returncode == 0
    subprocess.run(["rm", "-rf", mnt.path(WV)], check=True)
    for p in (mnt.path(WV), mnt.path(WV, "00")):
        assert subprocess.run(["stat", p], capture_output=True).returncode != 0


def test_absent_object_then_published_is_seen(mnt):
    """A negative lookup of a valid name must not hide a later publish."""
    os.mkdir(mnt.path(WV))
    p = mnt.path(WV, "abcd")
    for _ in range(3):
        assert not os.path.exists(p)
        assert subprocess.run(["stat", p], capture_output=True).returncode != 0
    assert publish(p, encode(WV, "abcd", routed_experts(4))) == 0
    assert subprocess.run(["stat", p], capture_output=True).returncode == 0


def test_metrics_are_prometheus_text(mnt):
    os.mkdir(mnt.path(WV))
    assert publish(mnt.path(WV, "00"), encode(WV, "00", routed_experts(4))) == 0
    text = open(mnt.path(".artfs", "metrics")).read()
    sample = re.compile(r'^[a-z_]+(\{[a-z_]+="[A-Za-z0-9._-]+"\})? [0-9]+$')
    typed = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in ("counter", "gauge")
            typed.add(name)
        elif line.startswith("# HELP "):
            continue
        else:
            assert sample.match(line), line
            assert line.split("{")[0].split(" ")[0] in typed, line
    m = mnt.metrics()
    for name in ["artfs_objects", "artfs_bytes_used", "artfs_capacity_bytes",
                 "artfs_publishes_total", "artfs_republish_identical_total",
                 "artfs_collisions_total", "artfs_reads_total",
                 "artfs_checksum_failures_total", 'artfs_rejected_total{reason="json"}']:
        assert name in m, name
    assert m["artfs_objects"] == 1 and m["artfs_publishes_total"] == 1
    assert m["artfs_capacity_bytes"] == 8 << 30


def test_config_shows_effective_settings(make_mount, tmp_path):
    m = make_mount(capacity="1G", max_object="2M", ttl="60")
    lines = open(m.path(".artfs", "config")).read().splitlines()
    cfg = dict(line.split(" = ", 1) if " = " in line else (line.rstrip(" ="), "")
               for line in lines)
    assert cfg["capacity"] == str(1 << 30)
    assert cfg["max_object"] == str(2 << 20)
    assert cfg["ttl"] == "60"
    assert cfg["store"] == m.store
    assert cfg["mountpoint"] == m.mountpoint


def test_config_file_and_command_line_precedence(tmp_path):
    conf = tmp_path / "artfs.conf"
    conf.write_text("# settings\ncapacity = 2G\nttl = 5\n\nmax_object=1M\n")
    m = Mount(tmp_path, config=str(conf), ttl="7").start()
    try:
        cfg = open(m.path(".artfs", "config")).read()
        assert f"capacity = {2 << 30}\n" in cfg
        assert f"max_object = {1 << 20}\n" in cfg
        assert "ttl = 7\n" in cfg  # -o beats the file
    finally:
        m.stop()
    conf.write_text("capacity = lots\n")
    bad = Mount(tmp_path, "bad", config=str(conf)).start(expect_fail=True)
    assert bad.proc.wait(timeout=10) != 0
    assert "artfs.conf:1: capacity=lots: not a size" in bad.log()
    bad.proc = None
    bad.log_fh.close()


def test_bad_options_are_refused(tmp_path):
    for opt, message in [({"capacity": "huge"}, "capacity=huge: not a size"),
                         ({"ttl": "-1"}, "ttl=-1: not a number"),
                         ({"store": "relative/path"}, "must be an absolute path")]:
        m = Mount(tmp_path, "m" + str(len(message)), **opt).start(expect_fail=True)
        assert m.proc.wait(timeout=10) != 0
        assert message in m.log()
        m.proc = None
        m.log_fh.close()


def test_daemon_information_is_read_only(mnt):
    for name in ("metrics", "config"):
        with pytest.raises(OSError):
            open(mnt.path(".artfs", name), "w")
    with pytest.raises(OSError):
        os.mkdir(mnt.path(".artfs", "x"))
    with pytest.raises(OSError):
        os.rmdir(mnt.path(".artfs"))


def test_immutable_objects_refuse_changes(mnt):
    os.mkdir(mnt.path(WV))
    p = mnt.path(WV, "00")
    assert publish(p, encode(WV, "00", routed_experts(4))) == 0
    before = read_result(p)
    for cmd in (["mv", p, mnt.path(WV, "01")], ["ln", p, mnt.path(WV, "02")],
                ["ln", "-s", p, mnt.path(WV, "03")], ["chmod", "666", p],
                ["touch", p], ["truncate", "-s", "10", p], ["mv", mnt.path(WV), mnt.path("x")]):
        r = subprocess.run(cmd, capture_output=True, text=True)
        assert r.returncode != 0, cmd
    assert read_result(p) == before
    assert sorted(os.listdir(mnt.path(WV))) == ["00"]
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o444


def test_statfs_reports_capacity(make_mount):
    m = make_mount(capacity="1G")
    sv = os.statvfs(m.mountpoint)
    assert sv.f_blocks * sv.f_frsize == 1 << 30
    out = subprocess.run(["df", "-B1", m.mountpoint], capture_output=True, text=True,
                         check=True).stdout
    assert str(1 << 30) in out


def test_large_listing(mnt):
    os.mkdir(mnt.path(WV))
    names = {f"{i:06x}" for i in range(3000)}
    env_of = {h: encode(WV, h, routed_experts(1, layers=2, top_k=2, seed=i))
              for i, h in enumerate(sorted(names))}
    for h, env in env_of.items():
        assert publish(mnt.path(WV, h), env) == 0
    assert set(os.listdir(mnt.path(WV))) == names
    out = subprocess.run(f"ls {mnt.path(WV)} | wc -l", shell=True, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "3000"


def test_store_directory_is_private_and_links_are_not_followed(tmp_path):
    m = Mount(tmp_path, store=str(tmp_path / "fresh" )).start()
    try:
        assert stat.S_IMODE(os.stat(tmp_path / "fresh").st_mode) == 0o700
    finally:
        m.stop()
    os.symlink(tmp_path / "fresh", tmp_path / "link")
    bad = Mount(tmp_path, "bad", store=str(tmp_path / "link")).start(expect_fail=True)
    assert bad.proc.wait(timeout=10) != 0
    assert "links are not followed" in bad.log()
    bad.proc = None
    bad.log_fh.close()
