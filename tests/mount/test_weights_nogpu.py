"""GPU weights where there is no GPU (DESIGN.md §4.2, issue: "without a
GPU ... no weights/ appears and the control file answers ENODEV")."""
import errno
import os
import shutil
import subprocess

import pytest

from conftest import DAEMON

ARTFSCTL = os.environ.get("ARTFSCTL_BIN") or os.path.join(os.path.dirname(os.path.abspath(DAEMON or ".")), "artfsctl")
HAS_GPU = shutil.which("nvidia-smi") is not None and \
    subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0
pytestmark = pytest.mark.skipif(HAS_GPU, reason="this machine has a GPU: tests/gpu covers it")


def control(mnt, line):
    fd = os.open(mnt.path(".artfs", "control"), os.O_WRONLY)
    try:
        os.write(fd, line.encode())
        return 0
    except OSError as e:
        return e.errno
    finally:
        os.close(fd)


def test_load_answers_enodev_and_no_weights_appear(mnt, tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")
    assert control(mnt, f"load default {ckpt}\n") == errno.ENODEV
    assert mnt.wait_log("load default: ")
    assert not os.path.exists(mnt.path("default", "weights"))
    r = subprocess.run([ARTFSCTL, "-m", mnt.mountpoint, "load", "default", str(ckpt)],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "no GPU" in r.stderr
    assert subprocess.run([ARTFSCTL, "-m", mnt.mountpoint, "unload", "default"],
                          capture_output=True).returncode == 1


def test_control_file_rules(mnt):
    st = os.stat(mnt.path(".artfs", "control"))
    assert oct(st.st_mode & 0o777) == "0o200"
    assert control(mnt, "nonsense\n") == errno.EINVAL
    assert control(mnt, "unload absent\n") == errno.ENOENT
    assert control(mnt, "load bad/name /x\n") == errno.EINVAL
    assert control(mnt, "load v relative/dir\n") == errno.EINVAL
    with pytest.raises(PermissionError):
        open(mnt.path(".artfs", "control"), "r")
    # A last line without its newline runs at close.
    fd = os.open(mnt.path(".artfs", "control"), os.O_WRONLY)
    os.write(fd, b"unload absent")
    with pytest.raises(FileNotFoundError):
        os.close(fd)
    # `echo ... > control` opens with O_TRUNC: that works, the command runs.
    with pytest.raises(FileNotFoundError):
        with open(mnt.path(".artfs", "control"), "w") as f:
            f.write("unload absent\n")
    r = subprocess.run(f"echo 'load v relative/dir' > {mnt.path('.artfs', 'control')}", shell=True)
    assert r.returncode != 0
