# SPDX-License-Identifier: Apache-2.0
"""Records what torch.compile (Inductor) and Triton do to their cache
directories (DESIGN.md §9), for tests/mount/cache_replay.py to replay.

  record_ops.py ROOT COLD.jsonl WARM.jsonl        both steps below (GPU host)
  record_ops.py record ROOT DIR                   the runs: raw logs in DIR
  record_ops.py finish DIR COLD.jsonl WARM.jsonl  the traces, from DIR
  record_ops.py command                           the command line that ran
                                                  the runs on the GPU host

record runs the workload (workload() below) twice, each time in a fresh
process, with TORCHINDUCTOR_CACHE_DIR=ROOT/inductor and
TRITON_CACHE_DIR=ROOT/triton: cold on an empty ROOT, warm on what cold left.
This file is put on PYTHONPATH as sitecustomize.py, so that every Python
process of a run (Inductor's compile workers too) installs an audit hook
that appends each audited file operation under ROOT to DIR/{cold,warm}.raw,
with a probe of its paths made just before the call (the hook runs before
the call and never sees its result); DIR/tree_{cold,warm} list ROOT after
each run. finish turns a raw log into one JSON line per op, in time order:
  op      open mkdir rename rmdir remove listdir scandir truncate chmod
          flock fcntl mmap dlopen shutil.*
  path    relative to ROOT; dst: rename's and shutil copies' second path
  flags   os-level open flags by name; mode: io.open's mode, where given
  size    open for writing: the bytes the file held when next renamed,
          removed or reopened for writing, else after the run; rename: src's
  sha     the first 16 hex digits of the SHA-256 of those bytes
  result  "ok" or the errno name the call met, as judged from the probe;
          existed / dst_existed / dst_same: what the probe found
  proc    0 for the process that ran first, 1, 2, ... for later ones
os.rename and os.replace raise one audit event: op "rename" is both; op
"dlopen" is ctypes.dlopen or the load of an extension module (audit event
"import" with a path). Only what Python code does is seen: not the files
other programs write (gcc, ptxas), nor what C code reads (a cubin that
Inductor's launcher loads by its path).

The GPU host was given this file's part above the line "end of the part
that runs on the GPU host", docstrings and comments stripped, compressed
into the command line of the run, with RECORD_SH: the device tool runs a
command in a copy of the session's checkout, which has not this file.
"record_ops.py command" prints that command line; run there, it leaves
cold.raw, warm.raw, tree_cold and tree_warm in $OUT, for finish."""
import hashlib
import os
import sys
import threading
import time

# Audited operations, recorded where their first argument (a path, or an fd
# of a file) or their second (a path) lies under the root
EVENTS = set("open os.mkdir os.rename os.rmdir os.remove os.listdir os.scandir os.truncate "
             "os.chmod ctypes.dlopen import mmap.__new__ fcntl.flock fcntl.fcntl".split())
busy = threading.local()


def probe(path):
    """path now: an errno, ["d", entries] or ["f", size, sha]."""
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            return ["d", len(os.listdir(path))]
        data = open(path, "rb").read()
        return ["f", len(data), hashlib.sha256(data).hexdigest()[:16]]
    except OSError as e:
        return e.errno


def install(root, log):
    """Records in this process from now on (an extension module's dlopen is
    the audit event "import" with its path as argument 1)."""
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)

    def emit(*record):
        os.write(fd, repr([time.monotonic_ns(), os.getpid(), *record]).encode() + b"\n")

    def under(i, a):
        """Argument i (a path, or as argument 0 an fd) relative to root, or None."""
        try:
            a = os.readlink(f"/proc/self/fd/{a}") if type(a) is int and i == 0 else os.fsdecode(a)
        except (OSError, TypeError):
            return None
        a = os.path.abspath(a)
        return a[len(root) + 1:] if a.startswith(root + "/") else None

    def hook(event, args):
        if (event in EVENTS or event[:7] == "shutil.") and not getattr(busy, "on", 0):
            busy.on = 1
            try:
                args, probes = list(args), {}
                for i, a in enumerate(args[:2]):  # io.open of an fd (os.fdopen) opens nothing
                    rel = under(i, a) if event != "open" or type(a) is not int else None
                    if rel:
                        args[i], probes[i] = rel, probe(root + "/" + rel)
                probes and emit(event, args, probes)
            except Exception as e:  # never break the tool under record
                emit("record-error", [event, repr(e)], {})
            busy.on = 0
    sys.addaudithook(hook)


def workload():
    """A 2-block model (LayerNorm, an attention-like matmul, a GELU MLP) in
    bf16, compiled by torch.compile's default mode, one forward of one
    shape; then a kernel of Triton's own, compiled and launched."""
    global tl  # a global, for Triton's compiler to find
    import torch
    import triton
    import triton.language as tl
    F = torch.nn.functional

    def model(x, weights):
        for q, k, up, down in weights:
            h = F.layer_norm(x, x.shape[-1:])
            a = torch.softmax(h @ q @ (h @ k).mT / 16, -1) @ h
            x = x + F.gelu(a @ up) @ down
        return x

    torch.manual_seed(0)
    r = lambda *shape: torch.randn(*shape, device="cuda", dtype=torch.bfloat16) / 16
    x, weights = r(4, 128, 256), [(r(256, 256), r(256, 256), r(256, 1024), r(1024, 256))] * 2
    torch.compile(model)(x, weights)  # no tensor needs a gradient: inference

    @triton.jit
    def double(a):
        i = tl.arange(0, 1024)
        tl.store(a + i, 2 * tl.load(a + i))

    a = torch.ones(1024, device="cuda")
    double[(1,)](a)
    assert a.sum() == 2048


if __name__ == "sitecustomize" and "RECORD_OPS_LOG" in os.environ:
    install(os.environ["RECORD_OPS_ROOT"], os.environ["RECORD_OPS_LOG"])
if __name__ == "__main__" and len(sys.argv) == 1:
    workload()
# ---- end of the part that runs on the GPU host --------------------------------
import ast  # noqa: E402  (what follows runs where the traces are made)
import base64  # noqa: E402
import errno  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import zlib  # noqa: E402

# The runs, as given to the GPU host: $1 ROOT, $2 DIR, $3 the directory of
# sitecustomize.py (this file)
RECORD_SH = (r"export RECORD_OPS_ROOT=$1 TORCHINDUCTOR_CACHE_DIR=$1/inductor "
             r"TRITON_CACHE_DIR=$1/triton PYTHONPATH=$3:$PYTHONPATH;"
             r"for n in cold warm;do time RECORD_OPS_LOG=$2/$n.raw python3 -m sitecustomize;"
             r"echo $n exit $?;find $1 -printf '%y %s %P\n'>$2/tree_$n;done")

OPS = {"os.mkdir": "mkdir", "os.rename": "rename", "os.rmdir": "rmdir", "os.remove": "remove",
       "os.listdir": "listdir", "os.scandir": "scandir", "os.truncate": "truncate",
       "os.chmod": "chmod", "ctypes.dlopen": "dlopen", "import": "dlopen",
       "mmap.__new__": "mmap", "fcntl.flock": "flock", "fcntl.fcntl": "fcntl"}
OPEN_FLAGS = ["O_WRONLY", "O_RDWR", "O_CREAT", "O_EXCL", "O_TRUNC", "O_APPEND", "O_CLOEXEC",
              "O_NOFOLLOW", "O_DIRECTORY", "O_NONBLOCK", "O_SYNC", "O_DSYNC", "O_NOCTTY",
              "O_DIRECT", "O_NOATIME", "O_PATH"]
LOCK_FLAGS = ["LOCK_SH", "LOCK_EX", "LOCK_NB", "LOCK_UN"]
WRITING = os.O_WRONLY | os.O_RDWR


def open_flag_names(flags):
    if flags & os.O_TMPFILE == os.O_TMPFILE:
        return ["O_TMPFILE"] + open_flag_names(flags & ~os.O_TMPFILE)
    names = [] if flags & WRITING else ["O_RDONLY"]
    return names + [n for n in OPEN_FLAGS if getattr(os, n, 0) and flags & getattr(os, n)]


def errname(p):
    """The errno name of a probe that found nothing, else None."""
    return errno.errorcode.get(p, str(p)) if isinstance(p, int) else None


def judge_open(op, flags, p):
    """The result of an open, from the probe of its path made just before.
    (The parent directory is taken to exist: the tools make it first.)"""
    op["existed"] = isinstance(p, list)
    if flags & WRITING and isinstance(p, list) and p[0] == "f":
        op["prev_size"], op["prev_sha"] = p[1], p[2]
    if not isinstance(p, list):
        return "ok" if p == errno.ENOENT and flags & os.O_CREAT else errname(p)
    if flags & os.O_CREAT and flags & os.O_EXCL:
        return "EEXIST"
    return "EISDIR" if p[0] == "d" and flags & WRITING else "ok"


def judge_rename(op, p, q):
    """The result of rename(path, dst), from the probes of both."""
    if not isinstance(p, list):
        return errname(p)
    if p[0] == "f":
        op["size"], op["sha"] = p[1], p[2]
    else:
        op["isdir"] = True
    op["dst_existed"] = isinstance(q, list)
    if isinstance(q, list) and p[0] == "f":
        op["dst_same"] = q == p
    if isinstance(q, list) and q[0] != p[0]:
        return "EISDIR" if q[0] == "d" else "ENOTDIR"
    return "ENOTEMPTY" if isinstance(q, list) and q[0] == "d" and q[1] else "ok"


def judge(event, args, probes):
    """One raw record as a trace op."""
    p, q = probes.get(0), probes.get(1)
    if event == "import":  # an extension module: its path is argument 1
        return {"op": "dlopen", "path": args[1], "via": "import", "result": errname(q) or "ok"}
    op = {"op": OPS.get(event, event), "path": args[0]}
    if 1 in probes:
        op["dst"] = args[1]
    if event == "open":
        flags = args[2] or 0
        op["flags"] = open_flag_names(flags)
        if args[1] is not None:
            op["mode"] = args[1]
        op["result"] = judge_open(op, flags, p)
    elif event == "os.rename":
        op["result"] = judge_rename(op, p, q)
    elif event == "os.mkdir":
        op["result"] = "EEXIST" if isinstance(p, list) else "ok"
    elif event == "os.rmdir":
        op["result"] = errname(p) or ("ENOTDIR" if p[0] == "f" else
                                      "ENOTEMPTY" if p[1] else "ok")
    elif event == "os.remove":
        op["result"] = errname(p) or ("EISDIR" if p[0] == "d" else "ok")
        if isinstance(p, list) and p[0] == "f":
            op["size"], op["sha"] = p[1], p[2]
    elif event in ("os.listdir", "os.scandir"):
        op["result"] = errname(p) or ("ok" if p[0] == "d" else "ENOTDIR")
    else:
        op["result"] = errname(p) or "ok"
        extra = {"fcntl.flock": ["operation"], "fcntl.fcntl": ["cmd"], "os.truncate": ["length"],
                 "os.chmod": ["mode"], "mmap.__new__": ["length", "access", "offset"]}
        for i, name in enumerate(extra.get(event, []), 1):
            op[name] = args[i]
        if event == "fcntl.flock":
            op["operation"] = [n for n in LOCK_FLAGS if args[1] & getattr(__import__("fcntl"), n)]
    return op


def parse(line):
    """A raw record: a Python literal, but for the repr of a path object
    that lay outside the root."""
    try:
        return ast.literal_eval(line)
    except (ValueError, SyntaxError):
        return ast.literal_eval(re.sub(r"\w*Path\(('[^']*')\)", r"\1", line))


def written(ops, i, tree):
    """The size (and sha) of what ops[i], an open for writing, left in its
    file: as the next op that moves, removes or rewrites the file found it,
    or as the file was after the run (no sha)."""
    path = ops[i]["path"]
    for op in ops[i + 1:]:
        if op["op"] in ("rename", "remove") and op["path"] == path:
            return op.get("size"), op.get("sha")
        if op["op"] == "open" and op["path"] == path and op.get("existed"):
            return op.get("prev_size"), op.get("prev_sha")
    return tree.get(path), None


def read_tree(path):
    """{path: size} of the files that find -printf '%y %s %P' listed."""
    with open(path) as f:
        lines = [line.rstrip("\n").split(" ", 2) for line in f]
    return {name: int(size) for kind, size, name in lines if kind == "f"}


def finish(raw, tree, out):
    """The trace of one run, from its raw log and its tree afterwards."""
    with open(raw) as f:
        records = sorted(parse(line) for line in f)
    tree = read_tree(tree)
    procs, ops = {}, []
    for t, pid, event, args, probes in records:
        if event == "record-error":
            op = {"op": event, "path": None, "error": args}
        else:
            op = judge(event, args, probes)
        op["proc"] = procs.setdefault(pid, len(procs))
        ops.append(op)
    for i, op in enumerate(ops):
        if op["op"] == "open" and {"O_WRONLY", "O_RDWR"} & set(op["flags"]):
            op["size"], op["sha"] = written(ops, i, tree)
    with open(out, "w") as f:
        for op in ops:
            f.write(json.dumps(op) + "\n")
    return ops


def summary(ops):
    """Counts of ops by op, open flags and result."""
    count = {}
    for op in ops:
        key = op["op"] + (" " + "|".join(op["flags"]) if op["op"] == "open" else "")
        key += "" if op.get("result", "ok") == "ok" else " -> " + op["result"]
        count[key] = count.get(key, 0) + 1
    return "\n".join(f"{n:6d}  {key}" for key, n in sorted(count.items()))


def record(root, out):
    """The two runs (RECORD_SH), with this file as their sitecustomize."""
    site = tempfile.mkdtemp(prefix="record-ops-site.")
    shutil.copy(__file__, os.path.join(site, "sitecustomize.py"))
    os.makedirs(out, exist_ok=True)
    subprocess.run(["bash", "-c", RECORD_SH, "record", os.path.realpath(root),
                    os.path.abspath(out), site], check=True)


def device_part():
    """The part of this file that runs on the GPU host, docstrings and
    comments stripped (ast.unparse)."""
    with open(__file__) as f:
        text = f.read()
    tree = ast.parse(text[:text.index("# ---- end of the part that runs on the GPU host")])
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return ast.unparse(tree) + "\n"


def device_command():
    """The command line of the run on the GPU host (at most 2,000 bytes):
    the device part as /tmp/sitecustomize.py, then RECORD_SH on /tmp/c."""
    packed = base64.b85encode(zlib.compress(device_part().encode(), 9)).decode()
    return ("cd /tmp;python3 -c 'import zlib,base64 as b;open(\"sitecustomize.py\",\"wb\")"
            f".write(zlib.decompress(b.b85decode(\"{packed}\")))';set -- /tmp/c $OUT /tmp;"
            + RECORD_SH)


def main():
    if sys.argv[1] == "command":
        print(device_command())
        return 0
    if sys.argv[1] == "record":
        record(*sys.argv[2:4])
        return 0
    if sys.argv[1] == "finish":
        raw_dir, outs = sys.argv[2], sys.argv[3:5]
    else:
        raw_dir, outs = tempfile.mkdtemp(prefix="record-ops."), sys.argv[2:4]
        record(sys.argv[1], raw_dir)
    for name, out in zip(("cold", "warm"), outs):
        ops = finish(os.path.join(raw_dir, name + ".raw"), os.path.join(raw_dir, "tree_" + name),
                     out)
        print(f"== {out}: {len(ops)} ops in {len({op['proc'] for op in ops})} processes")
        print(summary(ops))
    return 0


if __name__ == "__main__" and len(sys.argv) > 1:
    sys.exit(main())
