# SPDX-License-Identifier: Apache-2.0
"""torch.compile's caches in artfs's write-once tree (DESIGN.md section 9)
against a local tmpfs directory, on the GPU host, in one bounded run.

Every measurement is a fresh process (this file with --child) with
TORCHINDUCTOR_CACHE_DIR=<root>/inductor and TRITON_CACHE_DIR=<root>/triton.
The child builds the same model every time (seeded on the GPU: 4 blocks of
RMSNorm, attention through F.scaled_dot_product_attention and a SwiGLU MLP,
hidden 1024, bf16, one input shape), runs it eagerly, then through
torch.compile (default mode): import, CUDA context, build, eager, first
compiled forward (the compile) and second forward are timed. It prints one
JSON line: the SHA-256 of the compiled output's bytes (bf16 as int16, on the
CPU), the same of the eager output, and the differences between the two.

Cases, in this order:
  prime        a tiny compile into a throw-away local directory (brings
               torch, Inductor, Triton, ptxas and gcc into the page cache so
               that the first measured case does not pay for it) and probes
               torch's cache and AOT compile APIs
  cold-local   an empty root on /dev/shm
  cold-mount   an empty root <mount>/.cache/bench-<n>
  warm-local   cold-local's root again
  warm-mount   cold-mount's root again
  par8         8 children at once into one empty root in the mount
  par8-warm    a 9th child into that root
  kill         a child into an empty root in the mount; ~1 s after it
               starts compiling the serving daemon (the holder's child) is
               SIGKILLed (--kill-after 1,3,5 kills at each offset);
               whether the compile finishes, and its hash
  kill-warm    a child into the kill case's root (only when time is left)

Correctness (exit status 1 on a failure): every output hash equal (and
every eager hash), every compiled output within bf16 tolerance of eager,
every child succeeded (the kill case may fail: reported, not counted).
Speed is reported as PASS/MISS against the targets, never asserted:
cold-mount/cold-local compile time <= 1.11, warm-mount/warm-local <= 1.15,
warm-mount/cold-mount <= 0.4. The tree's metrics (artfs_cache_*) at the
start, before the kill case and at the end (a new daemon's counters start
at zero) and the file count of every tree are printed; the table comes last;
$OUT/cache-bench.json holds everything, $OUT/cache-bench-logs the children's
output.

  bench_cache.py --start                 mounts its own daemon from
                                         $ARTFS_BUILD (store on /dev/shm),
                                         stops it at the end
  bench_cache.py --mount M [--holder P]  an artfs already mounted on M;
                                         P: its holder (found when omitted)

TORCHINDUCTOR_DETERMINISTIC=1 is set in every child (--no-deterministic
leaves it out): Inductor then picks reduction configs without timing them,
so that independent cold compiles produce the same bits. Every other
TORCHINDUCTOR_* and TRITON_* variable is removed from the children's
environment. ARTFS_CACHE_BENCH_FAKE=1 replaces the children's torch work by
a simulated compile that writes and reads files in the roots the same way
(temporary file, rename): a check of this harness on a host without torch.
"""
import argparse
import hashlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
SELF = os.path.abspath(__file__)
TOP = os.path.abspath(os.path.join(HERE, "..", ".."))
OUT = os.environ.get("OUT", "/tmp")
FAKE = os.environ.get("ARTFS_CACHE_BENCH_FAKE") == "1"

# The model: 4 blocks, hidden 1024, 16 heads, SwiGLU 2816; input (4, 512)
LAYERS, HIDDEN, HEADS, INTER, BATCH, SEQ = 4, 1024, 16, 2816, 4, 512
SEED = 20261204
# Compiled against eager, bf16: relative to the eager output's magnitude
TOL_MAX, TOL_MEAN = 0.1, 0.03
TARGETS = (("cold-mount / cold-local", "cold-mount", "cold-local", 1.11),
           ("warm-mount / warm-local", "warm-mount", "warm-local", 1.15),
           ("warm-mount / cold-mount", "warm-mount", "cold-mount", 0.4))


# ---------------------------------------------------------------- the child

def digest(torch, t):
    a = t.detach().contiguous().cpu().view(torch.int16).numpy()
    return hashlib.sha256(a.tobytes()).hexdigest()


def build(torch):
    """The model and its input, the same in every process: weights drawn
    on the GPU from one seeded generator, in a fixed order."""
    nn, F = torch.nn, torch.nn.functional
    dev = "cuda"
    g = torch.Generator(device=dev)
    g.manual_seed(SEED)

    def draw(*shape, std=1.0, mean=0.0):
        w = torch.randn(*shape, generator=g, device=dev, dtype=torch.float32) * std + mean
        return nn.Parameter(w.to(torch.bfloat16), requires_grad=False)

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = draw(HIDDEN, std=0.1, mean=1.0)

        def forward(self, x):
            xf = x.float()
            xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)
            return xf.to(x.dtype) * self.weight

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1 = RMSNorm()
            self.wqkv = draw(3 * HIDDEN, HIDDEN, std=HIDDEN ** -0.5)
            self.wo = draw(HIDDEN, HIDDEN, std=HIDDEN ** -0.5)
            self.n2 = RMSNorm()
            self.wgu = draw(2 * INTER, HIDDEN, std=HIDDEN ** -0.5)
            self.wd = draw(HIDDEN, INTER, std=INTER ** -0.5)

        def forward(self, x):
            b, t, h = x.shape
            qkv = F.linear(self.n1(x), self.wqkv).view(b, t, 3, HEADS, h // HEADS)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + F.linear(a.transpose(1, 2).reshape(b, t, h), self.wo)
            gate, up = F.linear(self.n2(x), self.wgu).chunk(2, dim=-1)
            return x + F.linear(F.silu(gate) * up, self.wd)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
            self.norm = RMSNorm()

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return self.norm(x)

    model = Model().eval()
    x = torch.randn(BATCH, SEQ, HIDDEN, generator=g, device=dev, dtype=torch.float32)
    return model, x.to(torch.bfloat16)


def probe_apis(torch, res, scratch):
    """What this torch offers for saving compiled work (reported, not used
    by the measured cases)."""
    import torch._dynamo
    import torch._functorch.config
    import torch._inductor.config as ic
    dc = torch._dynamo.config
    api = {}
    for name in ("save_cache_artifacts", "load_cache_artifacts", "load_compiled_function"):
        api["torch.compiler." + name] = hasattr(torch.compiler, name)
    for mod, prefix, names in (
            (ic, "torch._inductor.config.", ("deterministic", "fx_graph_cache", "autotune_local_cache",
                                             "compile_threads", "worker_start_method",
                                             "bundle_triton_into_fx_graph_cache")),
            (dc, "torch._dynamo.config.", ("enable_aot_compile", "caching_precompile")),
            (torch._functorch.config, "torch._functorch.config.", ("enable_autograd_cache",))):
        for n in names:
            v = getattr(mod, n, "absent")
            api[prefix + n] = v if isinstance(v, (bool, int, str, type(None))) else repr(v)
    api["torch._inductor.aoti_compile_and_package"] = hasattr(torch._inductor, "aoti_compile_and_package")
    try:
        art = torch.compiler.save_cache_artifacts()
        api["save_cache_artifacts() after the prime compile"] = (
            "None" if art is None else f"{len(art[0])} bytes")
    except Exception as e:
        api["save_cache_artifacts() after the prime compile"] = "error: " + repr(e)[:300]
    # torch.compile(f, fullgraph=True).aot_compile(((args), {kwargs})) ->
    # save_compiled_function(path) -> torch.compiler.load_compiled_function(file)
    try:
        if hasattr(dc, "enable_aot_compile"):
            dc.enable_aot_compile = True

        def g(a):
            return torch.relu(a) * 3 + 1

        a = torch.randn(128, 128, device="cuda")
        cg = torch.compile(g, fullgraph=True)
        if not hasattr(cg, "aot_compile"):
            api["aot_compile"] = "no .aot_compile on torch.compile(fn, fullgraph=True)"
        else:
            t = time.perf_counter()
            fn = cg.aot_compile(((a,), {}))
            path = os.path.join(scratch, "aot_compiled.bin")
            fn.save_compiled_function(path)
            with open(path, "rb") as f:
                loaded = torch.compiler.load_compiled_function(f)
            same = bool(torch.equal(loaded(a), g(a)))
            api["aot_compile"] = (f"ok: saved {os.path.getsize(path)} bytes, loaded back, same "
                                  f"output: {same}, {time.perf_counter() - t:.2f} s")
    except Exception as e:
        api["aot_compile"] = "error: " + repr(e)[:300]
    res["apis"] = api


def real_child(a, res):
    t = time.perf_counter()
    import torch
    res["t_import"] = time.perf_counter() - t
    res["versions"] = {"torch": torch.__version__, "cuda": torch.version.cuda,
                       "python": sys.version.split()[0]}
    try:
        import triton
        res["versions"]["triton"] = triton.__version__
    except Exception as e:
        res["versions"]["triton"] = repr(e)[:100]
    t = time.perf_counter()
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    res["t_cuda"] = time.perf_counter() - t
    res["gpu"] = torch.cuda.get_device_name(0)
    scratch = os.path.dirname(a.marker)

    if a.prime:  # a pointwise and a reduction kernel, compiled
        def f(v):
            return torch.nn.functional.silu(v) * 2 + v.float().pow(2).mean(-1, keepdim=True)
        v = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)
        t = time.perf_counter()
        torch.compile(f)(v)
        torch.cuda.synchronize()
        res["t_compile"] = time.perf_counter() - t
        probe_apis(torch, res, scratch)
        return

    t = time.perf_counter()
    model, x = build(torch)
    torch.cuda.synchronize()
    res["t_build"] = time.perf_counter() - t
    with torch.no_grad():
        t = time.perf_counter()
        ref = model(x)
        torch.cuda.synchronize()
        res["t_eager"] = time.perf_counter() - t
        import torch._inductor.config
        # read before the compile: Dynamo's restore of the global state after
        # a frame can reset it (torch.use_deterministic_algorithms)
        res["deterministic"] = getattr(torch._inductor.config, "deterministic", None)
        compiled = torch.compile(model)
        with open(a.marker, "w"):
            pass
        t = time.perf_counter()
        out = compiled(x)
        torch.cuda.synchronize()
        res["t_compile"] = time.perf_counter() - t
        t = time.perf_counter()
        out2 = compiled(x)
        torch.cuda.synchronize()
        res["t_second"] = time.perf_counter() - t
    res["second_same"] = bool(torch.equal(out, out2))
    res["hash"] = digest(torch, out)
    res["eager_hash"] = digest(torch, ref)
    d = (out.float() - ref.float()).abs()
    e = ref.float().abs()
    res["finite"] = bool(torch.isfinite(out.float()).all())
    res["max_abs_diff"], res["mean_abs_diff"] = d.max().item(), d.mean().item()
    res["max_abs_eager"], res["mean_abs_eager"] = e.max().item(), e.mean().item()
    try:
        from torch._dynamo.utils import counters
        res["counters"] = {k: {n: c for n, c in v.items() if "cache" in n or "hit" in n or "miss" in n}
                           for k, v in counters.items() if k in ("inductor", "aot_autograd")}
    except Exception as e:
        res["counters"] = repr(e)[:200]


def fake_child(a, res):
    """A compile simulated with files: 40 files of 64 KiB under both roots,
    each written to a temporary name and renamed, or read back and checked
    where it exists (warm)."""
    time.sleep(0.2)
    res.update(t_import=0.2, t_cuda=0.0, t_build=0.0, t_eager=0.0, gpu="fake",
               versions={"torch": "fake"})
    if a.prime:
        res["t_compile"] = 0.1
        res["apis"] = {"fake": True}
        return
    with open(a.marker, "w"):
        pass
    t = time.perf_counter()
    roots = (os.environ["TORCHINDUCTOR_CACHE_DIR"], os.environ["TRITON_CACHE_DIR"])
    hits = 0
    for i in range(40):
        d = os.path.join(roots[i % 2], "k%02d" % (i % 7))
        os.makedirs(d, exist_ok=True)
        final = os.path.join(d, "f%02d.bin" % i)
        data = hashlib.sha256(b"%d" % i).digest() * 2048
        try:
            with open(final, "rb") as f:
                if f.read() != data:
                    raise AssertionError(f"{final}: other bytes")
            hits += 1
            continue
        except FileNotFoundError:
            pass
        tmp = "%s.tmp.%d" % (final, os.getpid())
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, final)
        time.sleep(0.05)
    res["t_compile"] = time.perf_counter() - t
    res["t_second"] = 0.0
    res["counters"] = {"fake": {"hits": hits}}
    res["hash"] = res["eager_hash"] = hashlib.sha256(b"fake output").hexdigest()
    res.update(second_same=True, finite=True, max_abs_diff=0.0, mean_abs_diff=0.0,
               max_abs_eager=1.0, mean_abs_eager=1.0)


def child_main(a):
    res = {"bench_cache": 1, "case": a.case, "pid": os.getpid(), "ok": False,
           "roots": [os.environ.get("TORCHINDUCTOR_CACHE_DIR"), os.environ.get("TRITON_CACHE_DIR")]}
    t0 = time.perf_counter()
    try:
        (fake_child if FAKE else real_child)(a, res)
        res["ok"] = True
    except BaseException:
        res["error"] = traceback.format_exc()[-3000:]
    res["t_total"] = time.perf_counter() - t0
    sys.stdout.write("\n" + json.dumps(res) + "\n")
    sys.stdout.flush()
    return 0 if res["ok"] else 1


# --------------------------------------------------------------- the parent

def now():
    return time.monotonic()


def is_mounted(path):
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == path for line in f)


def read_metrics(mount):
    """artfs_cache_* and artfs_daemon_* of <mount>/.artfs/metrics as
    {name: value}, or an error string."""
    try:
        with open(os.path.join(mount, ".artfs", "metrics")) as f:
            lines = f.read().splitlines()
    except OSError as e:
        return f"unreadable: {e}"
    m = {}
    for line in lines:
        if line.startswith("artfs_cache") or line.startswith("artfs_daemon"):
            name, _, value = line.rpartition(" ")
            try:
                m[name] = float(value) if "." in value or "e" in value else int(value)
            except ValueError:
                m[name] = value
    return m


def tree_count(root):
    """Files, directories and bytes under root (lstat only: opens no file)."""
    files = dirs = nbytes = 0
    errors = []
    for dirpath, dirnames, filenames in os.walk(root, onerror=lambda e: errors.append(str(e))):
        dirs += len(dirnames)
        for name in filenames:
            files += 1
            try:
                nbytes += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError as e:
                errors.append(str(e))
    return {"files": files, "dirs": dirs, "bytes": nbytes, "errors": errors[:5]}


def children_of(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [x.decode(errors="replace") for x in f.read().split(b"\0") if x]
    except OSError:
        return []


def find_holder(mount):
    """The artfs process with the mount point among its arguments whose
    parent is not one (the daemon is the holder's fork)."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        argv = cmdline(int(d))
        if argv and os.path.basename(argv[0]) == "artfs" and any(
                os.path.abspath(x) == mount for x in argv[1:] if x.startswith("/")):
            found.append(int(d))
    for pid in found:
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid not in found:
            return pid
    return None


class Daemon:
    """artfs -f from $ARTFS_BUILD on its own mount point and store, as
    tests/gpu/conftest.py starts it."""

    def __init__(self, build, mount, store, log):
        self.build, self.mount, self.store, self.log = build, mount, store, log
        self.proc = None

    def start(self):
        os.makedirs(self.mount, exist_ok=True)
        if is_mounted(self.mount):
            subprocess.run(["umount", "-l", self.mount])
        options = ",".join(("store=" + self.store, "allow_other"))
        self.proc = subprocess.Popen([os.path.join(self.build, "artfs"), "-f", "-o", options, self.mount],
                                     stdout=open(self.log, "ab"), stderr=subprocess.STDOUT)
        for _ in range(500):
            if is_mounted(self.mount) and os.path.isdir(os.path.join(self.mount, ".cache")):
                return self
            if self.proc.poll() is not None:
                raise RuntimeError("artfs exited:\n" + open(self.log).read()[-3000:])
            time.sleep(0.02)
        raise RuntimeError("artfs did not mount in 10 s")

    def stop(self):
        if not self.proc or self.proc.poll() is not None:
            return
        for _ in range(5):
            if subprocess.run(["umount", self.mount]).returncode == 0:
                break
            time.sleep(0.5)
        else:
            subprocess.run(["umount", "-l", self.mount])
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


class Bench:
    def __init__(self, a):
        self.a = a
        self.t0 = now()
        self.deadline = self.t0 + a.budget
        self.results = {}   # case -> result dict (par8: list)
        self.notes = []     # lines for the report
        self.failures = []  # correctness failures
        self.skipped = []
        self.kill = {}
        self.metrics_pre_kill = None
        self.live = []
        self.env_noted = False
        self.logs = os.path.join(OUT, "cache-bench-logs")
        os.makedirs(self.logs, exist_ok=True)

    def left(self):
        return self.deadline - now()

    def env(self, root):
        env = {k: v for k, v in os.environ.items()
               if not (k.startswith("TORCHINDUCTOR_") or k.startswith("TRITON_"))}
        removed = sorted(set(os.environ) - set(env))
        if removed and not self.env_noted:
            self.env_noted = True
            self.notes.append("removed from the children's environment: " + " ".join(removed))
        env.update(TORCHINDUCTOR_CACHE_DIR=os.path.join(root, "inductor"),
                   TRITON_CACHE_DIR=os.path.join(root, "triton"), PYTHONUNBUFFERED="1")
        if self.a.deterministic:
            env["TORCHINDUCTOR_DETERMINISTIC"] = "1"
        return env

    def spawn(self, case, root, prime=False):
        os.makedirs(root, exist_ok=True)
        log = os.path.join(self.logs, case + ".log")
        marker = os.path.join(self.a.scratch, case + ".compiling")
        for p in (log, marker):
            if os.path.exists(p):
                os.unlink(p)
        argv = [sys.executable, SELF, "--child", "--case", case, "--marker", marker]
        if prime:
            argv.append("--prime")
        with open(log, "wb") as f:
            p = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=self.env(root),
                                 cwd=self.a.scratch, start_new_session=True)
        c = {"case": case, "proc": p, "log": log, "marker": marker, "t": now(), "root": root}
        self.live.append(c)
        return c

    def kill_live(self):
        """Ends the children a harness error left running."""
        for c in self.live:
            if c["proc"].poll() is None:
                self.killgroup(c)
                print(f"  {c['case']}: left running by the error, killed", flush=True)

    @staticmethod
    def killgroup(c):
        try:
            os.killpg(c["proc"].pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def finish(self, c, timeout):
        p, timed_out = c["proc"], False
        try:
            p.wait(timeout=max(timeout, 0.1))
        except subprocess.TimeoutExpired:
            timed_out = True
        wall = now() - c["t"]
        self.killgroup(c)  # a timed-out child, and anything a child left (compile workers)
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        res = None
        try:
            with open(c["log"], errors="replace") as f:
                text = f.read()
        except OSError as e:
            text = f"(log unreadable: {e})"
        for line in reversed(text.splitlines()):
            if line.startswith('{"bench_cache"'):
                try:
                    res = json.loads(line)
                except ValueError:
                    pass
                break
        if res is None:
            res = {"case": c["case"], "ok": False, "error": "no result line"}
        res.update(rc=p.returncode, wall=wall, timed_out=timed_out, root=c["root"])
        if timed_out:
            res["ok"] = False
            res["error"] = (res.get("error") or "") + f" timed out after {timeout:.0f} s"
            if p.returncode is None:
                res["error"] += " (still there after SIGKILL: stuck in the filesystem?)"
        if not res["ok"]:
            res["log_tail"] = "\n".join(text.splitlines()[-40:])
        print(f"  {c['case']:<12} {'ok' if res['ok'] else 'FAILED'}  wall {wall:6.1f} s  "
              f"compile {fmt(res.get('t_compile'))} s  hash {str(res.get('hash'))[:16]}", flush=True)
        if not res["ok"]:
            print("    " + (res.get("error") or "").strip().replace("\n", "\n    ")[-1500:], flush=True)
        return res

    def run(self, case, root, limit, need, prime=False):
        """One child; skipped when less than need seconds are left."""
        if self.left() < need:
            self.skipped.append(case)
            print(f"  {case:<12} skipped: {self.left():.0f} s of the budget left", flush=True)
            return None
        c = self.spawn(case, root, prime)
        res = self.finish(c, min(limit, self.left() - 3))
        self.results[case] = res
        return res

    def par(self, case, root, n, limit, need):
        if self.left() < need:
            self.skipped.append(case)
            print(f"  {case:<12} skipped: {self.left():.0f} s of the budget left", flush=True)
            return None
        t = now()
        cs = [self.spawn(f"{case}-{i}", root) for i in range(n)]
        end = t + min(limit, self.left() - 3)
        rs = [self.finish(c, end - now()) for c in cs]
        self.results[case] = rs
        self.notes.append(f"{case}: {n} children at once, all done in {now() - t:.1f} s")
        return rs

    def daemon_pid(self, holder):
        kids = children_of(holder)
        return kids[0] if len(kids) == 1 else None

    def kill_case(self, root, holder, limit, need):
        """A cold compile into the mount; the serving daemon SIGKILLed at
        each of --kill-after's offsets from the compile's start."""
        case = "kill"
        if self.left() < need:
            self.skipped.append(case)
            print(f"  {case:<12} skipped: {self.left():.0f} s of the budget left", flush=True)
            return None
        k = self.kill
        k["kills"] = []
        self.metrics_pre_kill = read_metrics(self.a.mount)
        c = self.spawn(case, root)
        end = now() + min(limit, self.left() - 3)
        while now() < end and c["proc"].poll() is None and not os.path.exists(c["marker"]):
            time.sleep(0.02)
        seen = now()
        if not os.path.exists(c["marker"]):
            k["why_not"] = "the child ended or timed out before it started compiling"
        elif holder is None:
            k["why_not"] = "no holder process known"
        for off in self.a.kill_after if "why_not" not in k else ():
            while now() < min(seen + off, end) and c["proc"].poll() is None:
                time.sleep(0.005)
            old = self.daemon_pid(holder)
            if c["proc"].poll() is not None or now() >= end:
                k["why_not"] = f"the child had ended before the kill at {off} s"
                break
            if old is None:
                k["why_not"] = f"no single daemon child under holder {holder}"
                break
            os.kill(old, signal.SIGKILL)
            tk = now()
            one = {"old_pid": old, "s_after_compile_start": tk - seen}
            k["kills"].append(one)
            new = None
            while now() - tk < 15:
                new = self.daemon_pid(holder)
                if new not in (None, old):
                    break
                time.sleep(0.005)
            one["new_pid"] = new if new != old else None
            one["new_daemon_s"] = now() - tk
            while now() - tk < 15:
                try:
                    os.stat(os.path.join(self.a.mount, ".artfs", "metrics"))
                    one["serving_again_s"] = now() - tk
                    break
                except OSError as e:
                    one["stat_error"] = str(e)
                    time.sleep(0.01)
        res = self.finish(c, end - now())
        self.results[case] = res
        k["killed"] = len(k["kills"])
        k["compile_finished"] = bool(res.get("ok"))
        return res

    # ---- the report

    def check(self):
        ok_results = []
        for case, r in self.results.items():
            for x in (r if isinstance(r, list) else [r]):
                if case == "prime" and not x.get("ok"):
                    self.failures.append(f"prime: the child failed (rc {x.get('rc')})")
                    continue
                if case == "prime":
                    continue
                if not x.get("ok"):
                    if case == "kill":
                        continue
                    self.failures.append(f"{x.get('case')}: the child failed (rc {x.get('rc')})"
                                         + (", timed out" if x.get("timed_out") else ""))
                    continue
                ok_results.append(x)
        hashes = {}
        eager = {}
        for x in ok_results:
            hashes.setdefault(x.get("hash"), []).append(x["case"])
            eager.setdefault(x.get("eager_hash"), []).append(x["case"])
            if not x.get("finite", False):
                self.failures.append(f"{x['case']}: non-finite output")
            if not x.get("second_same", False):
                self.failures.append(f"{x['case']}: the second compiled forward gave other bits")
            mx, mn = x.get("max_abs_diff"), x.get("mean_abs_diff")
            if mx is None or mn is None or mx > TOL_MAX * x.get("max_abs_eager", 0) or \
                    mn > TOL_MEAN * x.get("mean_abs_eager", 0):
                self.failures.append(f"{x['case']}: compiled vs eager max {fmt(mx, 4)} mean {fmt(mn, 5)}"
                                     f" beyond tolerance (max {TOL_MAX} x {fmt(x.get('max_abs_eager'), 3)},"
                                     f" mean {TOL_MEAN} x {fmt(x.get('mean_abs_eager'), 3)})")
        if len(eager) > 1:
            self.failures.append("eager outputs differ between processes (the model is not "
                                 "deterministic here, so compiled hashes cannot be compared): "
                                 + "; ".join(f"{h[:12]}: {' '.join(c)}" for h, c in eager.items()))
        if len(hashes) > 1:
            self.failures.append("compiled output hashes differ: "
                                 + "; ".join(f"{str(h)[:12]}: {' '.join(c)}" for h, c in hashes.items()))
            by = {x["case"]: x.get("hash") for x in ok_results}
            pairs = [(w, c) for w, c in (("warm-local", "cold-local"), ("warm-mount", "cold-mount"))
                     if w in by and c in by]
            pairs += [(w, "par8-*") for w in ("par8-warm",) if w in by]
            par = {by[c] for c in by if c.startswith("par8-") and c != "par8-warm"}
            bad = [f"{w} != {c}" for w, c in pairs
                   if (by[w] not in par if c == "par8-*" else by[w] != by[c])]
            self.failures.append(
                "  hint: " + ("a warm run differs from the cold run that filled its root (" + ", ".join(bad)
                              + "): what the cache served is not what was stored" if bad else
                              "every warm run matches the cold run that filled its root; independent "
                              "cold compiles differ (Inductor choosing other kernels or configs, not "
                              "the filesystem?)"))
        if not ok_results:
            self.failures.append("nothing measured: no case gave a compiled output")
        self.hashes = hashes
        self.ok_results = ok_results


def fmt(v, nd=2):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def compile_s(results, case):
    r = results.get(case)
    if isinstance(r, dict) and r.get("ok"):
        return r.get("t_compile")
    return None


def report(b, metrics_before, metrics_after, trees, daemon_log_lines):
    res = b.results
    print("\n== probes of this torch (prime child)")
    prime = res.get("prime") or {}
    print("  versions: " + json.dumps(prime.get("versions")) + f"  gpu: {prime.get('gpu')}")
    for k, v in (prime.get("apis") or {}).items():
        print(f"  {k}: {v}")
    print("\n== per child")
    for case, r in res.items():
        for x in (r if isinstance(r, list) else [r]):
            print(f"  {x.get('case', case):<12} ok={x.get('ok')} rc={x.get('rc')} "
                  f"import {fmt(x.get('t_import'))} cuda {fmt(x.get('t_cuda'))} build {fmt(x.get('t_build'))}"
                  f" eager {fmt(x.get('t_eager'))} compile {fmt(x.get('t_compile'))} second "
                  f"{fmt(x.get('t_second'), 3)} wall {fmt(x.get('wall'))}  max|diff| "
                  f"{fmt(x.get('max_abs_diff'), 4)} mean|diff| {fmt(x.get('mean_abs_diff'), 5)}"
                  f" (eager max {fmt(x.get('max_abs_eager'), 3)}) deterministic {x.get('deterministic')}"
                  f"  counters {json.dumps(x.get('counters'))}")
    for n in b.notes:
        print("  " + n)
    if b.kill:
        print("\n== daemon killed during a compile")
        print("  " + json.dumps(b.kill))
        kr = res.get("kill")
        if isinstance(kr, dict):
            print(f"  compile finished: {kr.get('ok')}  hash {kr.get('hash')}")
            if not kr.get("ok"):
                print("  " + (kr.get("error") or "").strip().replace("\n", "\n  ")[-2000:])
    if daemon_log_lines:
        print("\n== daemon log (lines of this run about the cache, daemons, errors)")
        for line in daemon_log_lines:
            print("  " + line)
    pre = b.metrics_pre_kill
    print("\n== artfs metrics: at the start, before the kill case, at the end (a daemon's counters "
          "start at 0: after a kill, the end column counts from the kill on)")
    cols = [("start", metrics_before), ("pre-kill", pre), ("end", metrics_after)]
    cols = [(n, m) for n, m in cols if isinstance(m, dict)]
    print("  %-34s" % "" + "".join("%15s" % n for n, _ in cols)
          + ("%15s" % "pre-kill-start" if len(cols) == 3 else ""))
    for name in sorted(set().union(*(m for _, m in cols)) if cols else ()):
        vals = [m.get(name) for _, m in cols]
        line = "  %-34s" % name + "".join("%15s" % fmt(v) for v in vals)
        if len(cols) == 3 and all(isinstance(v, (int, float)) for v in vals[:2]) \
                and not name.startswith("artfs_daemon"):
            line += "%15s" % fmt(vals[1] - vals[0])
        print(line)
    for n, m in (("start", metrics_before), ("pre-kill", pre), ("end", metrics_after)):
        if isinstance(m, str):
            print(f"  {n}: {m}")
    print("\n== trees (files, directories, bytes; what ls -R lists)")
    for name, t in trees.items():
        print(f"  {name:<12} {t['files']:6d} files {t['dirs']:5d} dirs {t['bytes'] / 1e6:9.2f} MB  {t['root']}"
              + (f"  errors: {t['errors']}" if t["errors"] else ""))

    print("\n== cache bench: compile = the first compiled forward, seconds")
    print(f"  {'case':<12} {'ok':<5} {'import':>7} {'compile':>8} {'second':>7} {'wall':>6}  hash")
    for case in ("cold-local", "cold-mount", "warm-local", "warm-mount", "par8", "par8-warm", "kill",
                 "kill-warm"):
        r = res.get(case)
        if r is None:
            print(f"  {case:<12} {'skip' if case in b.skipped else '-'}")
            continue
        if isinstance(r, list):
            comp = [x["t_compile"] for x in r if x.get("ok") and x.get("t_compile") is not None]
            ok = sum(1 for x in r if x.get("ok"))
            hs = {str(x.get("hash"))[:12] for x in r if x.get("ok")}
            cstr = (f"{min(comp):.2f}/{statistics.median(comp):.2f}/{max(comp):.2f}" if comp else "-")
            print(f"  {case:<12} {ok}/{len(r):<3} {'':>7} {cstr:>8} (min/median/max)  "
                  f"hashes {' '.join(sorted(hs))}")
            continue
        print(f"  {case:<12} {str(bool(r.get('ok'))):<5} {fmt(r.get('t_import')):>7} "
              f"{fmt(r.get('t_compile')):>8} {fmt(r.get('t_second'), 3):>7} {fmt(r.get('wall'), 1):>6}  "
              f"{str(r.get('hash'))[:12]}")
    for label, num, den, target in TARGETS:
        a, c = compile_s(res, num), compile_s(res, den)
        if a is None or not c:
            print(f"  {label:<26} -      (target <= {target})  n/a")
            continue
        ratio = a / c
        print(f"  {label:<26} {ratio:.2f}x  (target <= {target})  {'PASS' if ratio <= target else 'MISS'}")
    k = b.kill
    if "killed" in k:
        kr = res.get("kill") or {}
        kills = ", ".join(f"at {x['s_after_compile_start']:.1f} s (serving again after "
                          f"{fmt(x.get('serving_again_s'), 3)} s)" for x in k["kills"])
        print(f"  daemon kill -9 mid-compile: {k['killed']} kill(s) {kills}"
              + (f" [{k['why_not']}]" if k.get("why_not") else "")
              + f"; compile finished={bool(kr.get('ok'))} hash {str(kr.get('hash'))[:12]}")
    print(f"  hashes: {len(b.hashes)} distinct over {len(b.ok_results)} outputs"
          + (f" ({str(next(iter(b.hashes)))[:16]})" if len(b.hashes) == 1 else ""))
    if b.skipped:
        print("  skipped for the time budget: " + " ".join(b.skipped))
    print(f"  total {now() - b.t0:.0f} s")
    if b.failures:
        print("CORRECTNESS FAILURES:")
        for f in b.failures:
            print("  - " + f)
        print("RESULT: FAIL")
    else:
        print("RESULT: OK (correctness); speed targets above are reported, not asserted")


def parent_main(a):
    a.mount = os.path.abspath(a.mount)
    n = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"
    a.scratch = os.path.join(a.shm, f"artfs-cache-bench-{n}")
    os.makedirs(a.scratch)
    b = Bench(a)
    daemon = None
    log_start = 0
    metrics_before = metrics_after = "not read"
    trees = {}
    daemon_log_lines = []
    harness_error = None
    print(f"cache bench: mount {a.mount}, scratch {a.scratch}, budget {a.budget:.0f} s"
          + (" (FAKE children)" if FAKE else ""), flush=True)
    local = os.path.join(a.scratch, "local")
    mroot = os.path.join(a.mount, ".cache", f"bench-{n}")
    roots = {"prime": os.path.join(a.scratch, "prime"), "local": local, "mount": mroot,
             "par8": mroot + "-par8", "kill": mroot + "-kill"}
    try:
        # The prime child needs no mount: it runs while the daemon starts
        prime = b.spawn("prime", roots["prime"], prime=True)
        if a.start:
            if not os.access(os.path.join(a.build, "artfs"), os.X_OK):
                raise RuntimeError(f"no artfs in {a.build} (tests/gpu/build.sh, or --build/$ARTFS_BUILD)")
            log = os.path.join(OUT, "cache-bench-daemon.log")
            if os.path.exists(log):
                log_start = os.path.getsize(log)
            daemon = Daemon(a.build, a.mount, os.path.join(a.scratch, "store"), log).start()
            holder = daemon.proc.pid
        else:
            if not os.path.isdir(os.path.join(a.mount, ".cache")):
                raise RuntimeError(f"{a.mount}/.cache: no artfs cache tree there")
            holder = a.holder or find_holder(a.mount)
        print(f"  holder {holder}, daemon {b.daemon_pid(holder) if holder else None}", flush=True)
        metrics_before = read_metrics(a.mount)
        b.results["prime"] = b.finish(prime, min(60, b.left() - 3))
        b.run("cold-local", local, 90, 30)
        b.run("cold-mount", mroot, 90, 30)
        b.run("warm-local", local, 90, 20)
        b.run("warm-mount", mroot, 90, 20)
        b.par("par8", roots["par8"], 8, 120, 50)
        b.run("par8-warm", roots["par8"], 90, 20)
        b.kill_case(roots["kill"], holder, 90, 30)
        b.run("kill-warm", roots["kill"], 90, 20)
    except Exception:
        harness_error = traceback.format_exc()
        print("HARNESS ERROR:\n" + harness_error, flush=True)
        b.kill_live()
    finally:
        try:
            metrics_after = read_metrics(a.mount)
            for name in ("local", "mount", "par8", "kill"):
                if os.path.isdir(roots[name]):
                    trees[name] = dict(tree_count(roots[name]), root=roots[name])
        except Exception as e:
            print(f"reading the trees: {e!r}")
        if daemon:
            daemon.stop()
            try:
                with open(daemon.log, errors="replace") as f:
                    f.seek(log_start)
                    lines = f.read().splitlines()
                keep = [x for x in lines if any(w in x for w in ("cache", "daemon", "err", "warn", "killed",
                                                                 "signal", "EIO"))]
                daemon_log_lines = keep[:25] + (["..."] + keep[-15:] if len(keep) > 40 else keep[25:])
            except OSError:
                pass
        if not a.keep:
            shutil.rmtree(a.scratch, ignore_errors=True)
    b.check()
    if harness_error:
        b.failures.append("harness: " + harness_error.strip().splitlines()[-1])
    report(b, metrics_before, metrics_after, trees, daemon_log_lines)
    with open(os.path.join(OUT, "cache-bench.json"), "w") as f:
        json.dump({"results": b.results, "kill": b.kill, "notes": b.notes, "failures": b.failures,
                   "skipped": b.skipped, "metrics_before": metrics_before, "metrics_after": metrics_after,
                   "metrics_pre_kill": b.metrics_pre_kill, "trees": trees,
                   "deterministic": a.deterministic, "fake": FAKE}, f, indent=1, default=str)
    return 1 if b.failures else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--start", action="store_true", help="mount a daemon of our own from $ARTFS_BUILD")
    ap.add_argument("--mount", default="/tmp/artfs-cache-bench-mnt")
    ap.add_argument("--holder", type=int, help="pid of the artfs holder of --mount (default: found)")
    ap.add_argument("--build", default=os.environ.get("ARTFS_BUILD", os.path.join(TOP, ".gpu-build")))
    ap.add_argument("--shm", default="/dev/shm", help="where the local roots and the store go")
    ap.add_argument("--budget", type=float, default=float(os.environ.get("ARTFS_CACHE_BENCH_BUDGET", 170)),
                    help="seconds; a case that would not fit is skipped")
    ap.add_argument("--kill-after", type=lambda v: sorted(float(x) for x in v.split(",")), default=[1.0],
                    help="seconds from the kill case's compile start to the daemon's SIGKILL; "
                    "a comma-separated list kills once at each (default 1)")
    ap.add_argument("--no-deterministic", dest="deterministic", action="store_false")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory (local roots, store)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--prime", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--case", help=argparse.SUPPRESS)
    ap.add_argument("--marker", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child_main(a)
    return parent_main(a)


if __name__ == "__main__":
    sys.exit(main())
