# SPDX-License-Identifier: Apache-2.0
"""The whole restart of a small engine (issue #36), process start to first
forward, on the GPU host: weights attached from artfs and torch.compile's
caches in artfs's .cache/, against the same engine loading its weights from
disk and compiling cold.

The engine is an HF Llama of 1.1 B parameters (TinyLlama's shape: hidden
2048, 22 layers, 32 heads, 4 KV heads, SwiGLU 5632, vocab 32000) in bf16
with random weights (seeded), saved once as one safetensors file and a
config.json under --ckpt (on disk, not tmpfs). Every case is a fresh
process (this file with --child) that times its parts:

  import   torch and transformers
  context  the CUDA context
  weights  the module built on the meta device, then its weights: attached
           from the mount (artfs.attach_weights + artfs.torch.bind) or read
           from disk (safetensors.torch.load_file onto the GPU + bind)
  compile  torch.compile's first forward (input (1, 256)), caches under
           TORCHINDUCTOR_CACHE_DIR=<root>/inductor, TRITON_CACHE_DIR=<root>/triton
  forward  the second compiled forward
  total    from the parent's spawn to the end of the first forward

Cases, in order (each one sample; --repeat N runs the measured ones N times):
  disk-cold    the page cache dropped (when this host lets us), weights from
               disk, an empty local cache root on /dev/shm: a restart today
  mount-cold   weights from artfs, an empty root in <mount>/.cache/: fills it
  mount-warm   weights from artfs, that root again: a restart with artfs
  local-warm   weights from disk (page cache), disk-cold's root again: warm
               caches without artfs, for comparison
  aot-save     (--aot) torch 2.11's ahead-of-time compile of the forward
               (torch.compile(fn, fullgraph=True).aot_compile), its artifact
               saved into the mount; aot-load: a fresh process loads it from
               there with empty caches. Where this torch cannot, the error is
               reported, not counted (on the H100 host, 2026-12-06: HF's
               LlamaForCausalLM.forward fails with "Missing required external
               references: ['type']" once ID_MATCH guards are dropped)

The daemon's load of the checkpoint (once per node, before any engine) is
timed on its own. Correctness (exit 1): every case succeeds, every compiled
output has the same SHA-256 (TORCHINDUCTOR_DETERMINISTIC=1) and is within
bf16 tolerance of eager. Times are printed, never asserted. A table comes
last; $OUT/engine-restart.json holds everything.

  bench_engine_restart.py --start    mounts its own daemon from $ARTFS_BUILD
"""
import argparse
import hashlib
import json
import os
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
WV = "engine-restart"
SHAPE = (1, 256)
TOL_MAX = 0.1  # |compiled - eager| relative to eager's largest value (bf16)
CONFIG = dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
              num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=2048,
              tie_word_embeddings=False, rms_norm_eps=1e-5)


# ---------------------------------------------------------------- the engine

def digest(torch, t):
    return hashlib.sha256(t.detach().contiguous().view(torch.int16).cpu().numpy().tobytes()).hexdigest()


def engine(a, res):
    t = time.time()
    res["t_python"] = t - a.t_spawn  # interpreter start
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    import artfs
    import artfs.torch
    res["t_import"] = time.time() - t
    t = time.time()
    torch.cuda.set_device(0)
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    res["t_context"] = time.time() - t

    t = time.time()
    cfg = LlamaConfig.from_json_file(os.path.join(a.ckpt, "config.json"))
    with torch.device("meta"):
        m = LlamaForCausalLM(cfg).to(torch.bfloat16)
    if a.weights == "artfs":
        w = artfs.attach_weights(WV, 0, checkpoint_dir=a.ckpt, mount=a.mount)
    else:
        from safetensors.torch import load_file
        w = load_file(os.path.join(a.ckpt, "model.safetensors"), device="cuda:0")
    artfs.torch.bind(m, w)
    # Non-persistent buffers (the rotary table) are not in a checkpoint:
    # made again on the GPU, as from_pretrained does.
    for name, mod in list(m.named_modules()):
        if type(mod).__name__.endswith("RotaryEmbedding"):
            parent = m.get_submodule(name.rsplit(".", 1)[0]) if "." in name else m
            setattr(parent, name.rsplit(".", 1)[-1], type(mod)(config=cfg, device="cuda:0"))
    m.eval()
    torch.cuda.synchronize()
    res["t_weights"] = time.time() - t
    left = [n for n, p in list(m.named_parameters()) + list(m.named_buffers()) if p.device.type != "cuda"]
    if left:
        raise RuntimeError(f"not on the GPU after binding: {left[:5]}")

    g = torch.Generator(device="cpu").manual_seed(11)
    x = torch.randint(0, cfg.vocab_size, SHAPE, generator=g).to("cuda:0")
    with torch.no_grad():
        t = time.time()
        if a.aot_mode:
            compiled = aot_forward(torch, m, x, a, res)
        else:
            compiled = torch.compile(m)
        out = compiled(input_ids=x, use_cache=False).logits
        torch.cuda.synchronize()
        t_end = time.time()
        res["t_compile"] = t_end - t
        res["t_total"] = t_end - a.t_spawn
        if a.aot_mode == "save":
            t = time.time()
            compiled.save(a.aot_file)
            res["t_save"] = time.time() - t
            res["aot_bytes"] = os.path.getsize(a.aot_file)
        t = time.time()
        out2 = compiled(input_ids=x, use_cache=False).logits
        torch.cuda.synchronize()
        res["t_forward"] = time.time() - t
        ref = m(input_ids=x, use_cache=False).logits
    res["second_same"] = bool(torch.equal(out, out2))
    res["hash"] = digest(torch, out)
    d = (out.float() - ref.float()).abs()
    res["max_abs_diff"], res["max_abs_eager"] = d.max().item(), ref.float().abs().max().item()
    res["finite"] = bool(torch.isfinite(out.float()).all())
    res["versions"] = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)}
    try:
        from torch._dynamo.utils import counters
        res["counters"] = {k: {n: c for n, c in v.items() if "cache" in n or "hit" in n or "miss" in n}
                           for k, v in counters.items() if k in ("inductor", "aot_autograd")}
    except Exception as e:
        res["counters"] = repr(e)[:200]


class AotForward:
    """m's forward compiled ahead of time (torch 2.11: torch.compile(fn,
    fullgraph=True).aot_compile, the module passed at each call, so the
    artifact holds no weights), or loaded from a file that one saved."""

    def __init__(self, torch, m, fn):
        self.torch, self.m, self.fn = torch, m, fn

    def __call__(self, **kw):
        return self.fn(self.m, **kw)

    def save(self, path):
        """As the tools write their caches: a temporary name, then rename."""
        tmp = f"{path}.tmp.{os.getpid()}"
        self.fn.save_compiled_function(tmp)
        os.replace(tmp, path)


def aot_forward(torch, m, x, a, res):
    import torch._dynamo.config
    torch._dynamo.config.enable_aot_compile = True
    if a.aot_mode == "load":
        with open(a.aot_file, "rb") as f:
            return AotForward(torch, m, torch.compiler.load_compiled_function(f))
    os.makedirs(os.path.dirname(a.aot_file), exist_ok=True)
    # Guards on object identity (ID_MATCH) cannot be serialized: dropped, as
    # vLLM's compile of its models drops them (the caller owns the shapes).
    fn = torch.compile(type(m).forward, fullgraph=True,
                       options={"guard_filter_fn": lambda guards: [False for _ in guards]}).aot_compile(
        ((m,), {"input_ids": x, "use_cache": False}))
    return AotForward(torch, m, fn)


def child_main(a):
    res = {"engine_restart": 1, "case": a.case, "weights": a.weights, "ok": False}
    try:
        engine(a, res)
        res["ok"] = True
    except BaseException:
        res["error"] = traceback.format_exc()[-3000:]
    sys.stdout.write("\n" + json.dumps(res) + "\n")
    sys.stdout.flush()
    return 0 if res["ok"] else 1


# ---------------------------------------------------------------- the parent

def make_checkpoint(path):
    """The random 1.1 B Llama, once (a .done marker)."""
    if os.path.exists(os.path.join(path, ".done")):
        return False
    os.makedirs(path, exist_ok=True)
    code = f"""
import json, os, torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM
cfg = LlamaConfig(**{CONFIG!r})
cfg.architectures = ["LlamaForCausalLM"]
torch.manual_seed(20261206)
with torch.device("cuda:0"):
    m = LlamaForCausalLM(cfg).to(torch.bfloat16)
save_file({{k: v.contiguous() for k, v in m.state_dict().items()}}, os.path.join({path!r}, "model.safetensors"))
cfg.to_json_file(os.path.join({path!r}, "config.json"))
"""
    subprocess.run([sys.executable, "-c", code], check=True, timeout=600)
    open(os.path.join(path, ".done"), "w").close()
    return True


def drop_page_cache(path):
    """Drops the checkpoint's pages: the whole page cache where we may
    (root), else the file's pages (posix_fadvise); says which."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "drop_caches"
    except OSError:
        pass
    try:
        fd = os.open(os.path.join(path, "model.safetensors"), os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        return "fadvise"
    except OSError as e:
        return f"not dropped ({e})"


def fs_of(path):
    best = ("?", "")
    with open("/proc/self/mounts") as f:
        for line in f:
            dev, mnt, kind = line.split()[:3]
            if (path + "/").startswith(mnt.rstrip("/") + "/") and len(mnt) >= len(best[1]):
                best = (kind, mnt)
    return best[0]


def run_case(a, case, weights, root, timeout, extra=()):
    os.makedirs(root, exist_ok=True)
    env = {k: v for k, v in os.environ.items()
           if not (k.startswith("TORCHINDUCTOR_") or k.startswith("TRITON_"))}
    env.update(TORCHINDUCTOR_CACHE_DIR=os.path.join(root, "inductor"),
               TRITON_CACHE_DIR=os.path.join(root, "triton"), TORCHINDUCTOR_DETERMINISTIC="1",
               PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(TOP, "contrib", "python"), HERE])
    log = os.path.join(a.logs, case + ".log")
    argv = [sys.executable, SELF, "--child", "--case", case, "--weights", weights,
            "--ckpt", a.ckpt, "--mount", a.mount, *extra]
    with open(log, "wb") as f:
        t_spawn = time.time()
        p = subprocess.Popen(argv + ["--t-spawn", repr(t_spawn)], stdout=f, stderr=subprocess.STDOUT,
                             env=env, cwd=a.scratch, start_new_session=True)
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(p.pid, signal.SIGKILL)  # a timed-out child, or compile workers it left
    except (ProcessLookupError, PermissionError):
        pass
    p.wait(timeout=10)
    text = open(log, errors="replace").read()
    res = None
    for line in reversed(text.splitlines()):
        if line.startswith('{"engine_restart"'):
            res = json.loads(line)
            break
    if res is None:
        res = {"case": case, "ok": False, "error": f"no result line (rc {p.returncode})",
               "log_tail": "\n".join(text.splitlines()[-30:])}
    res["root"] = root
    print(f"  {case:<11} {'ok' if res['ok'] else 'FAILED'}  total {res.get('t_total', 0):6.2f} s  "
          f"weights {res.get('t_weights', 0):5.2f}  compile {res.get('t_compile', 0):6.2f}  "
          f"hash {str(res.get('hash'))[:16]}", flush=True)
    if not res["ok"]:
        print("    " + (res.get("error") or "") + "\n" + res.get("log_tail", ""), flush=True)
    return res


PARTS = ("t_python", "t_import", "t_context", "t_weights", "t_compile", "t_total")


def table(results, load_s, dropped):
    by = {}
    for r in results:
        if r.get("ok"):
            by.setdefault(r["case"], []).append(r)
    print("\nengine restart, process start -> first forward (s; median of the samples):")
    print(f"  {'case':<11} {'n':>2} " + " ".join(f"{p[2:]:>8}" for p in PARTS))
    med = {}
    for case in ("disk-cold", "mount-cold", "mount-warm", "local-warm", "aot-save", "aot-load"):
        rs = by.get(case)
        if not rs:
            continue
        med[case] = {p: statistics.median(r[p] for r in rs) for p in PARTS}
        print(f"  {case:<11} {len(rs):>2} " + " ".join(f"{med[case][p]:8.2f}" for p in PARTS))
    print(f"  the daemon's load of the checkpoint into GPU memory (once per node): {load_s:.2f} s")
    print(f"  disk-cold's page cache: {dropped}")
    if "disk-cold" in med and "mount-warm" in med:
        print(f"  mount-warm / disk-cold total: {med['mount-warm']['t_total'] / med['disk-cold']['t_total']:.2f}x"
              f"  (weights {med['mount-warm']['t_weights']:.2f} vs {med['disk-cold']['t_weights']:.2f} s,"
              f" compile {med['mount-warm']['t_compile']:.2f} vs {med['disk-cold']['t_compile']:.2f} s)")
    if "local-warm" in med and "mount-warm" in med:
        print(f"  mount-warm / local-warm compile: "
              f"{med['mount-warm']['t_compile'] / med['local-warm']['t_compile']:.2f}x")
    for r in results:
        if r.get("ok") and r["case"] == "aot-save":
            print(f"  aot-save: the artifact {r['aot_bytes']} bytes, saved into the mount in {r['t_save']:.2f} s")
    if "aot-load" in med and "mount-warm" in med:
        print(f"  aot-load / mount-warm compile: {med['aot-load']['t_compile']:.2f} vs "
              f"{med['mount-warm']['t_compile']:.2f} s")
    return med


def parent_main(a):
    sys.path.insert(0, HERE)
    from bench_cache import Daemon, read_metrics
    a.scratch = os.path.join(a.shm, f"artfs-engine-restart-{os.getpid()}")
    a.logs = os.path.join(OUT, "engine-restart-logs")
    os.makedirs(a.scratch)
    os.makedirs(a.logs, exist_ok=True)
    made = make_checkpoint(a.ckpt)
    print(f"engine restart bench: checkpoint {a.ckpt} ({fs_of(a.ckpt)}, "
          f"{os.path.getsize(os.path.join(a.ckpt, 'model.safetensors')) / 1e9:.2f} GB, "
          f"{'made now' if made else 'made before'}), mount {a.mount}", flush=True)
    daemon = None
    if a.start:
        daemon = Daemon(a.build, a.mount, os.path.join(a.scratch, "store"),
                        os.path.join(OUT, "engine-restart-daemon.log")).start()
    results, failures = [], []
    try:
        ctl = os.path.join(a.build, "artfsctl")
        t = time.time()
        r = subprocess.run([ctl, "-m", a.mount, "load", WV, a.ckpt, "--gpus", "0"],
                           capture_output=True, text=True, timeout=300)
        load_s = time.time() - t
        if r.returncode != 0:
            raise RuntimeError(f"artfsctl load: {r.returncode} {r.stdout} {r.stderr}")
        mount_root = os.path.join(a.mount, ".cache", f"engine-restart-{os.getpid()}")
        dropped = None
        for i in range(0 if a.only_aot else a.repeat):
            dropped = drop_page_cache(a.ckpt)
            results.append(run_case(a, "disk-cold", "disk", os.path.join(a.scratch, f"cold-{i}"),
                                    a.timeout))
        for i in range(0 if a.only_aot else 1):
            results.append(run_case(a, "mount-cold", "artfs", mount_root, a.timeout))
        for i in range(0 if a.only_aot else a.repeat):
            results.append(run_case(a, "mount-warm", "artfs", mount_root, a.timeout))
        for i in range(0 if a.only_aot else a.repeat):
            results.append(run_case(a, "local-warm", "disk", os.path.join(a.scratch, "cold-0"),
                                    a.timeout))
        if a.aot or a.only_aot:
            aot_file = os.path.join(mount_root, "aot", "llama-forward.bin")
            results.append(run_case(a, "aot-save", "artfs", os.path.join(a.scratch, "aot-save"),
                                    a.timeout, ["--aot-mode", "save", "--aot-file", aot_file]))
            for i in range(a.repeat):
                results.append(run_case(a, "aot-load", "artfs", os.path.join(a.scratch, f"aot-{i}"),
                                        a.timeout, ["--aot-mode", "load", "--aot-file", aot_file]))
        metrics = read_metrics(a.mount)
        if isinstance(metrics, dict):
            metrics = {k: v for k, v in metrics.items() if k.startswith("artfs_cache_")}
        subprocess.run([ctl, "-m", a.mount, "unload", WV], capture_output=True, timeout=60)
    finally:
        if daemon:
            daemon.stop()
        subprocess.run(["rm", "-rf", a.scratch])
    hashes = {r.get("hash") for r in results if r.get("ok") and not r["case"].startswith("aot")}
    aot_hashes = {r.get("hash") for r in results if r.get("ok") and r["case"].startswith("aot")}
    if aot_hashes:
        print(f"  aot outputs: {sorted(str(h)[:16] for h in aot_hashes)} "
              f"({'the same bits as' if aot_hashes == hashes else 'other bits than'} torch.compile's)")
    if len(aot_hashes) > 1:
        failures.append(f"aot-save and aot-load outputs differ: {sorted(str(h)[:16] for h in aot_hashes)}")
    for r in results:
        if not r.get("ok") and r["case"].startswith("aot"):
            last = (r.get("error") or "").strip().splitlines()[-1:] or ["?"]
            print(f"  {r['case']}: does not work here (reported, not counted): {last[0][:300]}")
        elif not r.get("ok"):
            failures.append(f"{r['case']}: failed")
        elif not r["finite"] or r["max_abs_diff"] > TOL_MAX * max(r["max_abs_eager"], 1.0):
            failures.append(f"{r['case']}: compiled differs from eager by {r['max_abs_diff']}")
    if len(hashes) > 1:
        failures.append(f"compiled outputs differ: {sorted(str(h)[:16] for h in hashes)}")
    print(f"  the tree's metrics at the end: {json.dumps(metrics)}")
    med = table(results, load_s, dropped)
    with open(os.path.join(OUT, "engine-restart.json"), "w") as f:
        json.dump({"results": results, "median": med, "load_s": load_s, "page_cache": dropped,
                   "metrics": metrics, "failures": failures}, f, indent=1)
    for line in failures:
        print("FAILED: " + line)
    print("engine restart bench: " + ("FAILED" if failures else "every output the same bits"))
    return 1 if failures else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--start", action="store_true", help="mount a daemon of our own from $ARTFS_BUILD")
    ap.add_argument("--mount", default="/tmp/artfs-engine-restart-mnt")
    ap.add_argument("--build", default=os.environ.get("ARTFS_BUILD", os.path.join(TOP, ".gpu-build")))
    ap.add_argument("--ckpt", default="/var/tmp/artfs-engine-restart-ckpt", help="on disk, not tmpfs")
    ap.add_argument("--shm", default="/dev/shm")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=120, help="seconds one case may take")
    ap.add_argument("--aot", action="store_true",
                    help="also aot-save / aot-load: torch.compile(...).aot_compile's artifact in the mount")
    ap.add_argument("--only-aot", action="store_true", help="the aot cases only")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--aot-mode", choices=("save", "load"), help=argparse.SUPPRESS)
    ap.add_argument("--aot-file", help=argparse.SUPPRESS)
    ap.add_argument("--case", help=argparse.SUPPRESS)
    ap.add_argument("--weights", choices=("artfs", "disk"), help=argparse.SUPPRESS)
    ap.add_argument("--t-spawn", type=float, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child_main(a)
    return parent_main(a)


if __name__ == "__main__":
    sys.exit(main())
