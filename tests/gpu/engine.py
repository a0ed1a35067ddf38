# SPDX-License-Identifier: Apache-2.0
"""A stand-in engine, run as its own process by the GPU tests.

    engine.py compare MOUNT WV RANK CKPT [TP]    attach, compare with safetensors, print OK
    engine.py errno MOUNT WV RANK CKPT MUTATE    attach with a mutated expectation, print the errno name
    engine.py hold MOUNT WV RANK CKPT            attach, print READY, wait for a line on stdin
    engine.py watch MOUNT WV RANK CKPT           attach, print READY, poll the file until the daemon dies
"""
import errno
import os
import select
import sys

import torch

import artfs


def expectation(ckpt, rank, tp):
    return artfs.fingerprint(ckpt, tp, 0 if tp == 1 else rank, rank)


def files_of(ckpt, rank):
    names, layout = artfs.weights._checkpoint_files(ckpt)
    if layout == "vllm-sharded":
        names = [n for n in names if n.startswith(f"model-rank-{rank}-part-")]
    return [os.path.join(ckpt, n) for n in names]


def main():
    cmd, mount, wv, rank, ckpt = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
    _, layout = artfs.weights._checkpoint_files(ckpt)
    tp = int(sys.argv[6]) if cmd == "compare" and len(sys.argv) > 6 else None
    if tp is None:
        tp = 1 if layout == "huggingface" else len({n.split("-")[2] for n in os.listdir(ckpt)
                                                   if n.startswith("model-rank-")})
    torch.cuda.set_device(rank)
    expect = expectation(ckpt, rank, tp)
    if cmd == "errno":
        field = sys.argv[6]
        if field == "revision":
            expect["revision"] = bytes(32)
        elif field == "tp_size":
            expect["tp_size"] += 1
        elif field == "architecture":
            expect["architecture"] = "SomethingElse"
        if os.environ.get("ARTFS_WAIT_STDIN"):  # ready first, attach when told
            print("READY", flush=True)
            sys.stdin.readline()
        try:
            w = artfs.attach_weights(wv, rank, expect=expect, mount=mount)
        except OSError as e:
            # Linux's EOPNOTSUPP is ENOTSUP; print the name DESIGN.md uses.
            print("EOPNOTSUPP" if e.errno == errno.EOPNOTSUPP else errno.errorcode.get(e.errno, str(e.errno)))
            return 0
        w.close()
        print("OK")
        return 0
    w = artfs.attach_weights(wv, rank, expect=expect, mount=mount)
    if cmd == "compare":
        from safetensors.torch import load_file
        count = 0
        for path in files_of(ckpt, rank):
            for name, ref in load_file(path, device=f"cuda:{rank}").items():
                got = w[name]
                assert got.dtype == ref.dtype and got.shape == ref.shape, name
                assert got.device == ref.device, name
                assert torch.equal(got.contiguous().view(torch.uint8).reshape(-1),
                                   ref.contiguous().view(torch.uint8).reshape(-1)), name
                count += 1
        assert count == len(w), (count, len(w))
        print(f"OK {count} tensors")
    elif cmd == "hold":
        print("READY", flush=True)
        sys.stdin.readline()
    elif cmd == "watch":
        print("READY", flush=True)
        p = select.poll()
        p.register(w.fd, select.POLLIN | select.POLLERR | select.POLLHUP)
        events = p.poll(60000)
        try:
            os.read(w.fd, 1)
            print(f"ALIVE {events}", flush=True)
        except OSError as e:
            print(f"DEAD {errno.errorcode.get(e.errno)} {events}", flush=True)
            w.fd = None  # already unusable
            return 0
    w.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
