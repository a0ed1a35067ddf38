# SPDX-License-Identifier: Apache-2.0
"""GPU weights where there is no GPU (DESIGN.md §4.2, issue: "without a
GPU ... no weights/ appears and the control file answers ENODEV")."""
import errno
import os
import shutil
import subprocess
import sys

import pytest

from conftest import DAEMON

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "contrib", "python"))

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


# ---- GPU-direct publish: <wv>/weights/.publish (include/artfs/artfs.h) -------------

def publish_errno(mnt, wv, blob):
    """The errno (0 for success) and reply line of one publish."""
    import artfs
    try:
        return 0, artfs.publish_blob(wv, blob, mount=mnt.mountpoint)
    except OSError as e:
        return e.errno, str(e)


def a_blob(**kw):
    import artfs
    handles = kw.pop("handles", [bytes(range(64))])
    tensors = kw.pop("tensors", None) or [
        artfs.PublishTensor("w", "BF16", (4, 8), 0, 0, 64),
        artfs.PublishTensor("tied", "BF16", (4, 8), 0, 0, 64),
        artfs.PublishTensor("b", "F32", (3,), 0, 256, 12)]
    return artfs.pack_publish(handles, tensors, bytes(16), **kw)


def test_publish_mkdir_and_status(mnt):
    os.mkdir(mnt.path("pub"))
    assert not os.path.exists(mnt.path("pub", "weights"))
    os.mkdir(mnt.path("pub", "weights"))
    with pytest.raises(FileExistsError):
        os.mkdir(mnt.path("pub", "weights"))
    names = sorted(os.listdir(mnt.path("pub", "weights")))
    assert names == [".publish", "status"], names
    st = open(mnt.path("pub", "weights", "status")).read()
    assert "state = empty" in st and "gpu-direct" in st, st
    assert not os.path.exists(mnt.path("pub", "weights", "manifest.json"))
    with pytest.raises(PermissionError):
        open(mnt.path("pub", "weights", ".publish"), "rb")
    # Loaded weights are immutable: a load onto it is EEXIST, unload removes it.
    r = subprocess.run([ARTFSCTL, "-m", mnt.mountpoint, "unload", "pub"], capture_output=True)
    assert r.returncode == 0, r.stderr
    assert not os.path.exists(mnt.path("pub", "weights"))
    os.rmdir(mnt.path("pub"))


def test_publish_refuses_malformed_blobs(mnt):
    import struct
    good = a_blob()
    cases = {
        "empty-ish": (good[:100], errno.EBADMSG),
        "truncated": (good[:-1], errno.EBADMSG),
        "overlong": (good + b"\0", errno.EBADMSG),
        "magic": (b"XXXX" + good[4:], errno.EBADMSG),
        "abi": (good[:4] + struct.pack("<I", 99) + good[8:], errno.EINVAL),
        "rank": (a_blob(rank=2, tp_size=2), errno.EINVAL),
        "dtype": (a_blob(tensors=[__import__("artfs").PublishTensor("w", "BF17", (4,), 0, 0, 8)]),
                  errno.EBADMSG),
        "size": (a_blob(tensors=[__import__("artfs").PublishTensor("w", "BF16", (4,), 0, 0, 9)]),
                 errno.EBADMSG),
        "handle index": (a_blob(tensors=[__import__("artfs").PublishTensor("w", "F32", (1,), 1, 0, 4)]),
                         errno.EBADMSG),
        "name twice": (a_blob(tensors=[__import__("artfs").PublishTensor("w", "F32", (1,), 0, 0, 4),
                                       __import__("artfs").PublishTensor("w", "F32", (1,), 0, 4, 4)]),
                       errno.EBADMSG),
        "handle twice": (a_blob(handles=[bytes(64), bytes(64)]), errno.EBADMSG),
        "overflow": (a_blob(tensors=[__import__("artfs").PublishTensor("w", "U8", (8,), 0, 2**64 - 4, 8)]),
                     errno.EBADMSG),
    }
    for what, (blob, want) in cases.items():
        got, msg = publish_errno(mnt, "pubbad", blob)
        assert got == want, (what, errno.errorcode.get(got), msg)
    # A blob longer than any allowed: EFBIG at the write.
    os.makedirs(mnt.path("pubbad", "weights"), exist_ok=True)
    fd = os.open(mnt.path("pubbad", "weights", ".publish"), os.O_WRONLY)
    try:
        chunk = b"\0" * (1 << 20)
        with pytest.raises(OSError) as e:
            for _ in range(65):
                os.write(fd, chunk)
        assert e.value.errno == errno.EFBIG
    finally:
        with pytest.raises(OSError):
            os.close(fd)
    # Nothing was published: still empty, and a well-formed blob meets no GPU.
    assert "state = empty" in open(mnt.path("pubbad", "weights", "status")).read()
    got, msg = publish_errno(mnt, "pubbad", a_blob())
    assert got == errno.ENODEV, msg
    assert mnt.wait_log("publish pubbad: ")
