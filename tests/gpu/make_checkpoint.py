# SPDX-License-Identifier: Apache-2.0
"""Writes a test checkpoint: bf16, fp16, fp32 and fp8 tensors, odd small
ones (alignment) and large ones, random bytes made on the GPU.

    make_checkpoint.py DIR GIB [--layout hf|sharded] [--ranks R] [--files F]
                       [--quant METHOD] [--block-fp8] [--seed S]
"""
import argparse
import json
import os

import torch
from safetensors.torch import save_file

DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn]
BIG = 64 << 20


def random_tensor(nbytes, dtype, shape, gen):
    raw = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device="cuda", generator=gen)
    return raw.view(dtype).reshape(shape)


def file_tensors(nbytes, gen, prefix, first):
    out, i, used = {}, first, 0
    for elems in (1, 3, 17, 255, 257, 4097):  # small tensors at odd offsets
        dt = DTYPES[i % len(DTYPES)]
        out[f"{prefix}.small{i}"] = random_tensor(elems * dt.itemsize, dt, (elems,), gen)
        used += elems * dt.itemsize
        i += 1
    while used < nbytes:
        dt = DTYPES[i % len(DTYPES)]
        rows = max(1, min(BIG, nbytes - used) // (1024 * dt.itemsize))
        out[f"{prefix}.layer{i}.weight"] = random_tensor(rows * 1024 * dt.itemsize, dt, (rows, 1024), gen)
        used += rows * 1024 * dt.itemsize
        i += 1
    return {k: v.cpu() for k, v in out.items()}, i


def main():
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("gib", type=float)
    p.add_argument("--layout", default="hf", choices=["hf", "sharded"])
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--files", type=int, default=4)
    p.add_argument("--quant", default="")
    p.add_argument("--block-fp8", action="store_true")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    gen = torch.Generator(device="cuda").manual_seed(a.seed)
    total = int(a.gib * (1 << 30))
    config = {"architectures": ["ArtfsTestForCausalLM"], "torch_dtype": "bfloat16"}
    if a.quant:
        config["quantization_config"] = {"quant_method": a.quant, "activation_scheme": "dynamic"}
        if a.block_fp8:
            config["quantization_config"]["weight_block_size"] = [128, 128]
    with open(os.path.join(a.dir, "config.json"), "w") as f:
        json.dump(config, f)
    i = 0
    if a.layout == "hf":
        weight_map = {}
        for k in range(a.files):
            name = f"model-{k + 1:05d}-of-{a.files:05d}.safetensors"
            tensors, i = file_tensors(total // a.files, gen, f"model.f{k}", i)
            save_file(tensors, os.path.join(a.dir, name), metadata={"format": "pt"})
            weight_map.update({t: name for t in tensors})
        with open(os.path.join(a.dir, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    else:
        for r in range(a.ranks):
            for part in range(a.files):
                tensors, i = file_tensors(total // (a.ranks * a.files), gen, f"model.p{part}", i)
                save_file(tensors, os.path.join(a.dir, f"model-rank-{r}-part-{part}.safetensors"))
    os.sync()
    print(f"wrote {a.dir}: {total / (1 << 30):.2f} GiB, layout {a.layout}")


if __name__ == "__main__":
    main()
