# SPDX-License-Identifier: Apache-2.0
"""Who may publish (DESIGN.md §2: what a client may not change is read-only
by mode bits). A batch publish (<wv>/.put, .keys/.put) needs exactly the
permission that a publish by path needs: write permission on <wv>, or on
.keys, which the batch file's mode bits repeat (0666 & ~umask=, the owner
and group of the directory) and the kernel checks. Reading (objects, .keys/<key>, .get, .materialize) stays open to
every user who may enter the mount.

Each unprivileged step runs in a process of its own under setpriv (as
nobody, or as a user with a group of publishers), with the mount as its
working directory: a test's temporary directory above the mount is 0700."""
import base64
import json
import os
import stat
import subprocess

import pytest

from conftest import publish, read_result, transact
from envelope import derive_key, encode, npy_bytes, routed_experts

WV = "default"
NOBODY = 65534
PUBLISHERS = 4242  # a group with no name: gid= takes numbers

# Runs in the unprivileged process: each operation of argv[1] (JSON), its
# outcome in the list printed: "0", bytes (base64) or the failing call and
# errno name ("open:EACCES").
CHILD = r'''
import base64, errno, json, os, sys

def name(e):
    return errno.errorcode.get(e.errno, str(e.errno))

def run(op, path, data):
    data = base64.b64decode(data)
    try:
        if op == "create":
            fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644)
        elif op == "mkdir":
            os.mkdir(path)
            return "0"
        elif op == "read":
            with open(path, "rb") as f:
                return base64.b64encode(f.read()).decode()
        else:  # a transaction: put, get, materialize
            fd = os.open(path, os.O_RDWR)
    except OSError as e:
        return "open:" + name(e)
    try:
        os.write(fd, data)
        if op == "create":
            os.close(fd)
            return "0"
        out = os.pread(fd, 1 << 20, 0)
        os.close(fd)
        return base64.b64encode(out).decode()
    except OSError as e:
        try:
            os.close(fd)
        except OSError:
            pass
        return "io:" + name(e)

print(json.dumps([run(*step) for step in json.loads(sys.argv[1])]))
'''


def as_user(mnt, steps, uid=NOBODY, gid=NOBODY, groups=()):
    """The outcomes of steps [(op, path in the mount, bytes)] in a process
    of uid, gid and the supplementary groups given (none by default)."""
    cmd = ["setpriv", f"--reuid={uid}", f"--regid={gid}"]
    cmd += [f"--groups={','.join(map(str, groups))}"] if groups else ["--clear-groups"]
    arg = json.dumps([(op, path, base64.b64encode(data).decode()) for op, path, data in steps])
    r = subprocess.run(cmd + ["/usr/bin/python3", "-c", CHILD, arg], cwd=mnt.mountpoint,
                       capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr.decode()
    out = json.loads(r.stdout)
    return [o if o == "0" or ":" in o else base64.b64decode(o) for o in out]


def key_hex(wv, h):
    return derive_key(wv, h).split("/", 1)[1]


def env(h, seed=0, wv=WV):
    return encode(wv, h, routed_experts(4, seed=seed))


def store_objects(mnt):
    """Every object file in the store."""
    found = []
    for root, _, files in os.walk(os.path.join(mnt.store, "v")):
        found += [os.path.join(root, f) for f in files]
    return sorted(found)


@pytest.fixture
def shared(make_mount):
    """A mount every local user may enter and read (allow_other), with
    the default umask (022): only its owner, root, may publish."""
    return make_mount(allow_other=None)


def test_nobody_cannot_publish_through_any_path(shared):
    m = shared
    os.mkdir(m.path(WV))
    assert publish(m.path(WV, "00aa"), env("00aa")) == 0
    before = store_objects(m)
    published = m.metrics()["artfs_publishes_total"]
    keyed = key_hex(WV, "00bb")
    got = as_user(m, [
        ("create", f"{WV}/00bb", env("00bb")),
        ("create", f".keys/{keyed}", env("00bb")),
        ("mkdir", "other", b""),
        ("put", f"{WV}/.put", b"00bb\n" + env("00bb")),
        ("put", ".keys/.put", encode("x", "00bb", routed_experts(4))),
        # not even an identical re-publish, which changes nothing
        ("put", f"{WV}/.put", b"00aa\n" + env("00aa")),
        ("put", ".keys/.put", env("00aa")),
    ])
    assert got == ["open:EACCES"] * 7
    assert store_objects(m) == before
    assert m.metrics()["artfs_publishes_total"] == published
    assert not os.path.exists(m.path(WV, "00bb"))
    assert not os.path.exists(m.path("other"))
    # The mode bits say so (the kernel checks them: default_permissions):
    # a batch file is writable by whoever may create in its directory.
    for p in (m.path(WV, ".put"), m.path(".keys", ".put")):
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o644
    for p in (m.path(WV, ".materialize"), m.path(".keys", ".get")):
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o666


def test_nobody_reads_through_every_path(shared):
    m = shared
    os.mkdir(m.path(WV))
    arrays = [routed_experts(16, seed=1), routed_experts(8, seed=2)]
    envs = [encode(WV, "0a", arrays[0], kind="block"),
            encode(WV, "0b", arrays[1], kind="tail", source_token_start=16)]
    for h, e in zip(("0a", "0b"), envs):
        assert publish(m.path(WV, h), e) == 0
    keys = [key_hex(WV, "0a"), key_hex(WV, "0b")]
    got = as_user(m, [
        ("read", f"{WV}/0a", b""),
        ("read", f".keys/{keys[1]}", b""),
        ("get", ".keys/.get", "".join(k + "\n" for k in keys).encode()),
        ("materialize", f"{WV}/.materialize", b"token_end 24\n0a\n0b\n"),
    ])
    import numpy as np
    assert got == [npy_bytes(arrays[0]), envs[1], envs[0] + envs[1],
                   npy_bytes(np.concatenate(arrays))]


def test_umask_000_lets_everyone_publish_through_both_paths(make_mount):
    m = make_mount(allow_other=None, umask="000")
    got = as_user(m, [
        ("mkdir", WV, b""),
        ("create", f"{WV}/00aa", env("00aa")),
        ("put", f"{WV}/.put", b"00bb\n" + env("00bb")),
        ("put", ".keys/.put", env("00cc")),
    ])
    assert got[:2] == ["0", "0"]
    assert got[2] == f"{key_hex(WV, '00bb')} 0\n".encode()
    assert got[3] == f"{key_hex(WV, '00cc')} 0\n".encode()
    for h in ("00aa", "00bb"):
        assert read_result(m.path(WV, h)) == npy_bytes(routed_experts(4))
    assert read_result(m.path(".keys", key_hex(WV, "00cc"))) == env("00cc")


def test_a_group_of_publishers(make_mount):
    """gid= and umask=002: members of the group publish by path and by
    .put; other users read only."""
    m = make_mount(allow_other=None, gid=str(PUBLISHERS), umask="002")
    os.mkdir(m.path(WV))
    assert stat.S_IMODE(os.stat(m.path(WV, ".put")).st_mode) == 0o664
    member = dict(uid=NOBODY, gid=NOBODY, groups=(PUBLISHERS,))
    got = as_user(m, [
        ("create", f"{WV}/00aa", env("00aa")),
        ("put", f"{WV}/.put", b"00bb\n" + env("00bb")),
        ("put", ".keys/.put", env("00cc")),
    ], **member)
    assert got == ["0", f"{key_hex(WV, '00bb')} 0\n".encode(),
                   f"{key_hex(WV, '00cc')} 0\n".encode()]
    # The group as the primary group is a member too.
    got = as_user(m, [("put", f"{WV}/.put", b"00dd\n" + env("00dd"))], gid=PUBLISHERS)
    assert got == [f"{key_hex(WV, '00dd')} 0\n".encode()]
    outsider = as_user(m, [
        ("create", f"{WV}/00ee", env("00ee")),
        ("put", f"{WV}/.put", b"00ee\n" + env("00ee")),
        ("put", ".keys/.put", env("00ee")),
        ("read", f"{WV}/00aa", b""),
    ])
    assert outsider == ["open:EACCES"] * 3 + [npy_bytes(routed_experts(4))]
    assert not os.path.exists(m.path(WV, "00ee"))
    for h in ("00aa", "00bb", "00dd"):
        assert read_result(m.path(WV, h)) == npy_bytes(routed_experts(4))


def test_root_publishes_through_put_on_a_default_mount(shared):
    """The owner (root) is not affected."""
    m = shared
    os.mkdir(m.path(WV))
    lines = transact(m.path(WV, ".put"), b"00aa\n" + env("00aa"))
    assert lines == f"{key_hex(WV, '00aa')} 0\n".encode()
