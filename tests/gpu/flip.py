# SPDX-License-Identifier: Apache-2.0
"""Flip in place on a GPU (issue #38), run as separate processes by test_flip.py.

    flip.py trainer MOUNT WV:SEED:LAYERS[:SAVE_DIR] ...
        per argument an HF Llama (LAYERS layers, seed SEED) published
        GPU-direct as WV; its eager logits saved to /tmp/artfs-flip-ref-WV-rank0.pt;
        with SAVE_DIR also saved there as a safetensors checkpoint
    flip.py trainer-tp MOUNT TP WV:SEED:LAYERS ...
        the same as TP ranks of WV, each its own Llama, all from GPU 0
    flip.py rank MOUNT WV RANK
        one rank of a tensor-parallel engine bound in place to WV, driven by
        commands on stdin (rank_engine)
    flip.py tied MOUNT V1 FILE1 V2 FILE2
        rl.py's tiny module (tied head) bound in place to V1, flipped to V2
    flip.py engine MOUNT HOLDER_PID ARTFSCTL A B A2 OTHER
        the engine: bound in place to A, a CUDA graph of its forward captured,
        flips to B (A unloaded first: freed by the flip), back and forth
        B <-> A2 under a replay loop in another thread, a daemon kill -9
        between two flips, a flip to OTHER (another layout) refused. Prints
        one line "RESULT <json>" per step, "BYE" at the end.
    flip.py many MOUNT V1,V2,... LATE ROUNDS
        one of several engines at once: bound in place to V1, a CUDA graph
        captured, ROUNDS times through every version (each replay against
        that version's trainer logits, no data_ptr() changing); then LATE,
        which a trainer publishes meanwhile, once it is ready
    flip.py attacher MOUNT V1,V2,... LATE ROUNDS
        beside them: a plain attach and bind of each version ROUNDS times,
        then LATE, each forward against the trainer's logits
"""
import errno
import json
import os
import subprocess
import sys
import threading
import time

import torch

import artfs
import artfs.torch

MIB = 1 << 20


def config(layers):
    from transformers import LlamaConfig
    return LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816,
                       num_hidden_layers=layers, num_attention_heads=16, num_key_value_heads=4,
                       max_position_embeddings=256, tie_word_embeddings=False)


def llama(layers, seed=0, attn="sdpa"):
    from transformers import LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = config(layers)
    cfg._attn_implementation = attn
    with torch.device("cuda:0"):
        m = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    return m


def ids():
    g = torch.Generator(device="cpu").manual_seed(7)
    return torch.randint(0, 32000, (2, 32), generator=g).to("cuda:0")


def logits(m, x):
    with torch.no_grad():
        return m(input_ids=x, use_cache=False).logits


def result(**kw):
    print("RESULT " + json.dumps(kw), flush=True)


def ref_path(wv, rank=0):
    return f"/tmp/artfs-flip-ref-{wv}-rank{rank}.pt"


def ref(wv, rank=0):
    """The trainer's eager logits of wv's rank on GPU 0."""
    return torch.load(ref_path(wv, rank)).to("cuda:0")


def trainer(mount, wv, seed, layers, save=None, rank=0, tp=1):
    """Rank `rank` of wv (tp ranks): an HF Llama of seed (rank r of several:
    seed * 10 + r, its own values in the same names and shapes, as the
    shards of one model have), published GPU-direct from GPU 0."""
    m = llama(layers, seed if tp == 1 else seed * 10 + rank)
    with torch.no_grad():  # changed values: what a training step does
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    sd = m.state_dict()
    # Its logits first, whole: an engine takes the version once it is ready.
    torch.save(logits(m, ids()).cpu(), ref_path(wv, rank) + ".tmp")
    os.replace(ref_path(wv, rank) + ".tmp", ref_path(wv, rank))
    t0 = time.perf_counter()
    artfs.torch.publish_weights(wv, sd, rank, mount, tp_size=tp, architecture="LlamaForCausalLM")
    dt = time.perf_counter() - t0
    if save:
        from safetensors.torch import save_file
        os.makedirs(save, exist_ok=True)
        save_file({k: v.contiguous() for k, v in sd.items()}, os.path.join(save, "model.safetensors"))
        config(layers).to_json_file(os.path.join(save, "config.json"))
    print(f"PUBLISHED {dt:.4f}", flush=True)


def free_bytes():
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info(0)[0]


def smi_used_mib():
    r = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                        "-i", "0"], capture_output=True, text=True)
    return int(r.stdout.split()[0]) if r.returncode == 0 else -1


def daemon_pid(holder):
    for _ in range(3000):
        try:
            with open(f"/proc/{holder}/task/{holder}/children") as f:
                kids = f.read().split()
            if len(kids) == 1:
                return int(kids[0])
        except OSError:
            pass
        time.sleep(0.01)
    raise RuntimeError("no serving daemon")


def capture(m, x):
    """A CUDA graph of the forward pass; its static output."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        for _ in range(3):
            m(input_ids=x, use_cache=False)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g), torch.no_grad():
        out = m(input_ids=x, use_cache=False).logits
    return g, out


def pointers(m):
    return {n: t.data_ptr() for n, t in list(m.named_parameters()) + list(m.named_buffers())}


def layers_of(mount, wv):
    with open(os.path.join(mount, wv, "weights", "manifest.json")) as f:
        names = json.load(f)["ranks"][0]["tensors"]
    return 1 + max(int(n.split(".")[2]) for n in names if n.startswith("model.layers."))


def engine(mount, holder, ctl, a, b, a2, other):
    x = ids()
    refs = {wv: ref(wv) for wv in (a, b, a2)}
    nlayers = layers_of(mount, a)
    for attn in ("sdpa", "eager"):
        m = llama(nlayers, 123, attn)
        artfs.torch.bind_in_place(m, a, 0, mount)
        torch.cuda.empty_cache()  # the module's own first weights
        try:
            g, out = capture(m, x)
            break
        except Exception as e:  # a forward that does not capture with this attention
            result(step="capture", attn=attn, error=str(e)[:300])
            m = None
            torch.cuda.synchronize()
    else:
        raise RuntimeError("no attention implementation captured")
    ptrs = pointers(m)
    eager_a = logits(m, x)
    g.replay()
    torch.cuda.synchronize()
    result(step="bind", attn=attn, graph_is_eager=torch.equal(out, eager_a),
           eager_is_trainer=torch.equal(eager_a, refs[a]),
           max_diff=(eager_a.float() - refs[a].float()).abs().max().item())

    # Flip to B with A unloaded first: only this engine's mapping holds A.
    subprocess.run([ctl, "-m", mount, "unload", a], check=True)
    time.sleep(0.5)
    free0, smi0 = free_bytes(), smi_used_mib()
    alloc0 = torch.cuda.memory_allocated()
    low = [free0]
    sampling = [True]

    def sample():  # free memory while the flip runs
        while sampling[0]:
            low[0] = min(low[0], torch.cuda.mem_get_info(0)[0])

    th = threading.Thread(target=sample)
    th.start()
    t0 = time.perf_counter()
    took = artfs.torch.flip_in_place(m, b)
    g.replay()
    torch.cuda.synchronize()
    live = time.perf_counter() - t0
    alloc1 = torch.cuda.memory_allocated()
    sampling[0] = False
    th.join()
    time.sleep(0.5)
    free1, smi1 = free_bytes(), smi_used_mib()
    eager_b = logits(m, x)
    same_ptrs = ptrs == pointers(m)
    slab = json.load(open(os.path.join(mount, b, "weights", "manifest.json")))["ranks"][0]["slabs"][0]["size"]
    result(step="flip", flip_s=took, flip_and_replay_s=live, graph_is_eager=torch.equal(out, eager_b),
           eager_is_trainer=torch.equal(eager_b, refs[b]), differs_from_a=not torch.equal(out, eager_a),
           same_ptrs=same_ptrs,
           extra_during_mib=(free0 - low[0]) / MIB, freed_mib=(free1 - free0) / MIB, slab_mib=slab / MIB,
           smi_freed_mib=smi0 - smi1, allocated_delta=alloc1 - alloc0)

    # 100 flips B <-> A2 while another thread replays the graph.
    lock = threading.Lock()
    cur = [b]
    stop = [False]
    counts = {"replays": 0, "wrong": 0, "errors": []}
    eager = {b: eager_b.clone(), a2: None}
    artfs.torch.flip_in_place(m, a2)
    eager[a2] = logits(m, x).clone()
    artfs.torch.flip_in_place(m, b)

    def replay():
        torch.cuda.set_device(0)
        try:
            while not stop[0]:
                with lock:  # a step: never across a flip
                    g.replay()
                    ok = torch.equal(out, eager[cur[0]])
                counts["replays"] += 1
                counts["wrong"] += not ok
                # Between steps, as an engine's loop has them: a lock taken
                # again at once would starve the flipping thread (Python's
                # locks are not fair), one flip waiting for many replays.
                time.sleep(0.0005)
        except Exception as e:
            counts["errors"].append(str(e)[:300])

    th = threading.Thread(target=replay)
    th.start()
    times = []
    for i in range(100):
        to = a2 if cur[0] == b else b
        with lock:
            times.append(artfs.torch.flip_in_place(m, to))
            cur[0] = to
        time.sleep(0.002)
    stop[0] = True
    th.join()
    torch.cuda.synchronize()
    times.sort()
    result(step="flips", flips=100, replays=counts["replays"], wrong=counts["wrong"],
           errors=counts["errors"], median_s=times[50], max_s=times[-1],
           a2_is_a=torch.equal(eager[a2], eager_a))

    # A daemon kill -9 between two flips.
    old = daemon_pid(holder)
    os.kill(old, 9)
    while daemon_pid(holder) == old:
        time.sleep(0.01)
    to = a2 if cur[0] == b else b
    took = artfs.torch.flip_in_place(m, to)
    cur[0] = to
    g.replay()
    result(step="kill", flip_s=took, right=torch.equal(out, eager[to]))

    # Another layout: refused, the version in place stays.
    try:
        artfs.torch.flip_in_place(m, other)
        refused, message = False, ""
    except OSError as e:
        refused, message = e.errno == errno.EXDEV, str(e)
    g.replay()
    result(step="other", refused=refused, message=message, intact=torch.equal(out, eager[cur[0]]))
    print("BYE", flush=True)


def ready(mount, wv, timeout=300):
    """Waits for wv to be published whole (its status says ready)."""
    path = os.path.join(mount, wv, "weights", "status")
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with open(path) as f:  # "key = value" lines
                if "state = ready" in f.read().splitlines():
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{wv} not ready in {timeout} s")


def many(mount, versions, late, rounds):
    vs, x = versions.split(","), ids()
    refs = {wv: ref(wv) for wv in vs}
    m = llama(layers_of(mount, vs[0]), 123)
    artfs.torch.bind_in_place(m, vs[0], 0, mount)
    torch.cuda.empty_cache()
    g, out = capture(m, x)
    ptrs = pointers(m)
    flips, wrong, times = 0, [], []
    for r in range(int(rounds)):
        for wv in vs[1:] + vs[:1]:
            times.append(artfs.torch.flip_in_place(m, wv))
            g.replay()
            torch.cuda.synchronize()
            flips += 1
            if not torch.equal(out, refs[wv]):
                wrong.append(f"round {r}: {wv}")
    ready(mount, late)
    refs[late] = ref(late)
    artfs.torch.flip_in_place(m, late)
    g.replay()
    torch.cuda.synchronize()
    times.sort()
    result(step="many", pid=os.getpid(), flips=flips + 1, wrong=wrong, late_right=torch.equal(out, refs[late]),
           same_ptrs=ptrs == pointers(m), median_s=times[len(times) // 2], max_s=times[-1])
    print("BYE", flush=True)


def attacher(mount, versions, late, rounds):
    vs, x = versions.split(","), ids()
    m = llama(layers_of(mount, vs[0]), 321)
    wrong, binds = [], 0
    for r in range(int(rounds) + 1):
        for wv in vs if r < int(rounds) else [late]:
            if r == int(rounds):
                ready(mount, late)
            want = ref(wv)
            w = artfs.attach_weights(wv, 0, mount=mount)
            artfs.torch.bind(m, w)
            del w
            binds += 1
            if not torch.equal(logits(m, x), want):
                wrong.append(f"round {r}: {wv}")
    result(step="attacher", binds=binds, wrong=wrong)
    print("BYE", flush=True)


def rank_engine(mount, wv, rank):
    """One rank of a tensor-parallel engine, on GPU 0 as every rank here is:
    bound in place to wv's rank, a CUDA graph captured; then one command a
    line on stdin, one RESULT line each:
        flip WV          flip to WV, replay, check
        spin SECS        replay for SECS, each against the version in place
        storm V1,V2,.. N N flips through the versions, each replay checked
        try WV           a flip that must be refused: its errno, the version kept
        quit"""
    rank, x = int(rank), ids()
    refs = {}

    def right():  # the graph's replay is the trainer's logits of the version in place
        if cur not in refs:
            refs[cur] = ref(cur, rank)
        g.replay()
        torch.cuda.synchronize()
        return torch.equal(out, refs[cur])

    m = llama(layers_of(mount, wv), 100 + rank)
    artfs.torch.bind_in_place(m, wv, rank, mount, device=0)
    torch.cuda.empty_cache()  # the module's own first weights
    g, out = capture(m, x)
    ptrs, cur = pointers(m), wv
    result(step="bound", rank=rank, right=right())
    for line in sys.stdin:
        cmd, *args = line.split()
        if cmd == "flip":
            took = artfs.torch.flip_in_place(m, args[0])
            cur = args[0]
            result(step="flip", to=cur, s=took, right=right(), same_ptrs=ptrs == pointers(m))
        elif cmd == "spin":
            n, wrong, end = 0, 0, time.monotonic() + float(args[0])
            while time.monotonic() < end:
                n, wrong = n + 1, wrong + (not right())
            result(step="spin", on=cur, replays=n, wrong=wrong)
        elif cmd == "storm":
            vs, wrong, times = args[0].split(","), [], []
            for i in range(int(args[1])):
                times.append(artfs.torch.flip_in_place(m, vs[i % len(vs)]))
                cur = vs[i % len(vs)]
                if not right():
                    wrong.append(f"flip {i}: {cur}")
            times.sort()
            result(step="storm", on=cur, flips=len(times), wrong=wrong, same_ptrs=ptrs == pointers(m),
                   median_s=times[len(times) // 2])
        elif cmd == "try":
            try:
                artfs.torch.flip_in_place(m, args[0])
                err, message = 0, ""
            except OSError as e:
                err, message = e.errno, str(e)
            result(step="try", errno=err, message=message, on=cur, intact=right(),
                   same_ptrs=ptrs == pointers(m))
        elif cmd == "quit":
            break
    print("BYE", flush=True)


def tied(mount, v1, f1, v2, f2):
    """rl.py's tiny module (head tied to the embedding) bound in place to v1,
    flipped to v2: still one storage, v2's bytes."""
    from safetensors.torch import load_file
    from rl import tiny
    m = tiny(5)
    artfs.torch.bind_in_place(m, v1, 0, mount)
    before = m.emb.weight.data_ptr()
    ok1 = m.head.weight.data_ptr() == before and torch.equal(m.emb.weight, load_file(f1, "cuda:0")["emb.weight"])
    artfs.torch.flip_in_place(m, v2)
    ref = load_file(f2, device="cuda:0")
    ok2 = (m.head.weight.data_ptr() == m.emb.weight.data_ptr() == before and
           all(torch.equal(m.state_dict()[k].view(torch.uint8), v.view(torch.uint8)) for k, v in ref.items()))
    result(step="tied", v1=bool(ok1), v2=bool(ok2))


def main():
    cmd = sys.argv[1]
    if cmd == "tied":
        tied(*sys.argv[2:7])
    elif cmd == "trainer":
        for spec in sys.argv[3:]:
            wv, seed, layers, *save = spec.split(":", 3)
            trainer(sys.argv[2], wv, int(seed), int(layers), save[0] if save else None)
    elif cmd == "trainer-tp":
        tp = int(sys.argv[3])
        for spec in sys.argv[4:]:
            wv, seed, layers = spec.split(":")
            for rank in range(tp):
                trainer(sys.argv[2], wv, int(seed), int(layers), rank=rank, tp=tp)
    elif cmd == "rank":
        rank_engine(*sys.argv[2:5])
    elif cmd == "engine":
        engine(sys.argv[2], int(sys.argv[3]), *sys.argv[4:9])
    elif cmd == "many":
        many(*sys.argv[2:6])
    elif cmd == "attacher":
        attacher(*sys.argv[2:6])
    return 0


if __name__ == "__main__":
    sys.exit(main())
