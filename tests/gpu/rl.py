# SPDX-License-Identifier: Apache-2.0
"""The RL side of the GPU check (DESIGN.md §4.3), run as separate processes.

    rl.py save DIR SEED                  the tiny transformer, saved as safetensors (+ config.json)
    rl.py reference DIR                  its outputs, the module loaded normally (torch.save to DIR/ref.pt)
    rl.py serve MOUNT WV DIR             bind to WV, forward in a loop; stdin "flip WV2" rebinds,
                                         "check DIR2" compares with DIR2's reference, "quit"
    rl.py trainer MOUNT WV DEVICE TARGET SEED FILE
                                         tensors on DEVICE (tied included) saved to FILE, published
                                         to TARGET (-1: same GPU), then overwritten; prints PUBLISHED
    rl.py compare MOUNT WV FILE          attach WV (published), byte-compare with FILE, check ties
    rl.py watch MOUNT WV DIR             bind to WV, forward in a loop comparing every output with
                                         DIR's reference; prints READY, then on "quit" BYE passes wrong
    rl.py attach MOUNT WV DIR            attach WV, byte-compare with DIR's checkpoint, bind, forward,
                                         compare with its reference; prints ATTACHED seconds
"""
import json
import os
import sys
import time

import torch
from torch import nn

import artfs
import artfs.torch


class Tiny(nn.Module):
    def __init__(self, vocab=512, d=256, layers=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight  # tied
        self.register_buffer("scale", torch.ones(d))

    def forward(self, ids):
        return self.head(self.enc(self.emb(ids) * self.scale))


def tiny(seed, device="cuda:0", dtype=torch.bfloat16):
    torch.manual_seed(seed)
    m = Tiny().to(device=device, dtype=dtype).eval()
    with torch.no_grad():
        m.scale.uniform_(0.5, 1.5)
    return m


def ids(device="cuda:0"):
    g = torch.Generator(device="cpu").manual_seed(7)
    return torch.randint(0, 512, (2, 16), generator=g).to(device)


def main():
    cmd = sys.argv[1]
    if cmd == "save":
        from safetensors.torch import save_model
        d, seed = sys.argv[2], int(sys.argv[3])
        os.makedirs(d, exist_ok=True)
        save_model(tiny(seed), os.path.join(d, "model.safetensors"))
        json.dump({"architectures": ["Tiny"]}, open(os.path.join(d, "config.json"), "w"))
    elif cmd == "reference":
        from safetensors.torch import load_model
        d = sys.argv[2]
        m = tiny(999)
        load_model(m, os.path.join(d, "model.safetensors"), device="cuda:0")
        with torch.no_grad():
            torch.save(m(ids()).cpu(), os.path.join(d, "ref.pt"))
    elif cmd == "serve":
        mount, wv, d = sys.argv[2], sys.argv[3], sys.argv[4]
        m = tiny(123)
        w = artfs.attach_weights(wv, 0, checkpoint_dir=d, mount=mount)
        artfs.torch.bind(m, w)
        del w
        x = ids()
        ref = torch.load(os.path.join(d, "ref.pt"))
        with torch.no_grad():
            assert torch.equal(m(x).cpu(), ref), "bound outputs differ from the module loaded normally"
        print("READY", flush=True)
        import select
        passes = 0
        while True:
            with torch.no_grad():
                m(x)
            torch.cuda.synchronize()
            passes += 1
            if select.select([sys.stdin], [], [], 0)[0]:
                line = sys.stdin.readline().split()
                if not line or line[0] == "quit":
                    print(f"BYE {passes}", flush=True)
                    return 0
                if line[0] == "flip":
                    t0 = time.perf_counter()
                    w = artfs.attach_weights(line[1], 0, checkpoint_dir=line[2], mount=mount)
                    artfs.torch.bind(m, w)
                    del w
                    with torch.no_grad():
                        out = m(x)
                    torch.cuda.synchronize()
                    ok = torch.equal(out.cpu(), torch.load(os.path.join(line[2], "ref.pt")))
                    print(f"FLIPPED {ok} {time.perf_counter() - t0:.4f} {passes}", flush=True)
    elif cmd == "watch":
        import select
        mount, wv, d = sys.argv[2], sys.argv[3], sys.argv[4]
        m = tiny(123)
        w = artfs.attach_weights(wv, 0, checkpoint_dir=d, mount=mount)
        artfs.torch.bind(m, w)
        del w
        x = ids()
        ref = torch.load(os.path.join(d, "ref.pt")).to("cuda:0")
        passes = wrong = 0
        print("READY", flush=True)
        while True:
            with torch.no_grad():
                same = torch.equal(m(x), ref)
            torch.cuda.synchronize()  # a CUDA error raises here: the engine fails
            passes += 1
            wrong += not same
            if select.select([sys.stdin], [], [], 0)[0]:
                print(f"BYE {passes} {wrong}", flush=True)
                return 0 if wrong == 0 else 1
    elif cmd == "attach":
        from safetensors.torch import load_file
        mount, wv, d = sys.argv[2], sys.argv[3], sys.argv[4]
        torch.cuda.init()
        torch.ones(1, device="cuda:0")  # the context first: what an engine has before it attaches
        t0 = time.perf_counter()
        w = artfs.attach_weights(wv, 0, checkpoint_dir=d, mount=mount)
        took = time.perf_counter() - t0
        ref = load_file(os.path.join(d, "model.safetensors"), device="cuda:0")
        assert set(ref) <= set(w), set(ref) - set(w)
        for k, v in ref.items():
            assert torch.equal(w[k].view(torch.uint8), v.view(torch.uint8)), k
        m = tiny(5)
        artfs.torch.bind(m, w)
        with torch.no_grad():
            assert torch.equal(m(ids()).cpu(), torch.load(os.path.join(d, "ref.pt")))
        print(f"ATTACHED {took:.4f}", flush=True)
    elif cmd == "trainer":
        from safetensors.torch import save_file
        mount, wv, dev, target, seed, path = sys.argv[2:8]
        m = tiny(int(seed), device=f"cuda:{dev}")
        sd = m.state_dict()  # emb.weight and head.weight: one storage
        save_file({k: v.clone() for k, v in sd.items()}, path)
        t0 = time.perf_counter()
        artfs.torch.publish_weights(wv, sd, 0, mount, target_device=None if target == "-1" else int(target),
                                    architecture="Tiny")
        dt = time.perf_counter() - t0
        with torch.no_grad():
            for v in sd.values():
                v.zero_()  # the copy is done: overwriting must not matter
        torch.cuda.synchronize()
        print(f"PUBLISHED {dt:.4f}", flush=True)
    elif cmd == "compare":
        from safetensors.torch import load_file
        mount, wv, path = sys.argv[2:5]
        man = json.load(open(os.path.join(mount, wv, "weights", "manifest.json")))
        dev = man["ranks"][0]["device"]
        w = artfs.attach_weights(wv, 0, mount=mount, device=dev)
        ref = load_file(path, device=f"cuda:{dev}")
        assert set(ref) == set(w), (set(ref) ^ set(w))
        for k, v in ref.items():
            assert w[k].dtype == v.dtype and w[k].shape == v.shape, k
            assert torch.equal(w[k].view(torch.uint8), v.view(torch.uint8)), k
        t = man["ranks"][0]["tensors"]
        assert t["emb.weight"]["offset"] == t["head.weight"]["offset"], "tied tensors stored twice"
        m = tiny(5, device=f"cuda:{dev}")
        artfs.torch.bind(m, w)
        print(f"OK {len(w)} {man['layout']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
