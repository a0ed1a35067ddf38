#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Writes the seed corpus of every fuzz target into tests/fuzz/corpus/<target>/.

    python3 tests/fuzz/make_corpus.py

The seeds are committed; this script says how they were made and remakes
them when a target's input encoding changes. The encodings are those of
the readers in fuzz_util.c (fz_u8, fz_u16, fz_num, fz_bytes, fz_str)."""
import json
import os
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
VECTORS = os.path.join(HERE, "..", "vectors")
CORPUS = os.path.join(HERE, "corpus")


def u8(v):
    return bytes([v & 0xFF])


def u16(v):
    return struct.pack("<H", v)


def num_small(v):
    """fz_num: selector 8 then one byte (v < 256), selector 6 then a u16."""
    return u8(8) + u8(v) if v < 256 else u8(6) + u16(v)


def blob(data, max_len):
    """fz_bytes: a u8 length (u16 when max > 255), then the bytes."""
    assert len(data) <= max_len
    return (u16(len(data)) if max_len > 255 else u8(len(data))) + data


def write(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def safetensors_file(tensors, metadata=None):
    """tensors: list of (name, dtype, shape, bytes per element)."""
    hdr, off = {}, 0
    for name, dtype, shape, item in tensors:
        size = item
        for s in shape:
            size *= s
        hdr[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + size]}
        off += size
    if metadata is not None:
        hdr["__metadata__"] = metadata
    text = json.dumps(hdr, sort_keys=True, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + bytes(off)


def envelope_seeds():
    for name in sorted(os.listdir(VECTORS)):
        if name.endswith(".envelope"):
            data = open(os.path.join(VECTORS, name), "rb").read()
            write("envelope", name, data)
    data = open(os.path.join(VECTORS, "u16-block.envelope"), "rb").read()
    (h,) = struct.unpack("<I", data[:4])
    write("envelope", "u16-block.header-only", data[4 : 4 + h])
    write("envelope", "truncated", data[:40])


def npy_seeds():
    write("npy", "u1-16x61x8", blob(b"|u1", 5) + u8(2) + num_small(16) + num_small(61) + num_small(8))
    write("npy", "u2-1", blob(b"<u2", 5) + u8(0) + num_small(1))
    write("npy", "f8-8dims-max", blob(b">f8", 5) + u8(7) + u8(1) * 8)
    write("npy", "bad-dtype", blob(b"<u3", 5) + u8(4) + u8(1) + num_small(300) + num_small(0))


def safetensors_seeds():
    two = safetensors_file([("a", "BF16", [2, 3], 2), ("b", "F32", [4], 4)], {"format": "pt"})
    write("safetensors", "two-tensors", u8(0) + two)
    write("safetensors", "two-tensors-as-file", u8(4) + two)
    write("safetensors", "scalar-and-empty", u8(4) + safetensors_file([("s", "I64", [], 8), ("e", "U8", [0, 5], 1)]))
    write("safetensors", "fp8", u8(0) + safetensors_file([("w", "F8_E4M3", [16, 16], 1)]))
    write("safetensors", "size-larger", u8(2) + num_small(7) + two)


def ckpt_entry(name_template, content, name_bytes=b"", kind=0, extra=b""):
    """One entry: how byte (template | kind << 3, raw content), name fields, content."""
    how = name_template | kind << 3
    return u8(how) + name_bytes + extra + blob(content, 2048)


def checkpoint_seeds():
    s1 = safetensors_file([("model.embed_tokens.weight", "BF16", [4, 2], 2)])
    s2 = safetensors_file([("lm_head.weight", "BF16", [2, 4], 2)])
    index = json.dumps({"metadata": {"total_size": 32}, "weight_map": {
        "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
        "lm_head.weight": "model-00002-of-00002.safetensors"}}).encode()
    config = json.dumps({"architectures": ["LlamaForCausalLM"],
                         "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}).encode()
    name1 = blob(b"model-00001-of-00002", 40)
    name2 = blob(b"model-00002-of-00002", 40)
    write("checkpoint", "hf-with-index", u8(3) + ckpt_entry(0, s1, name1) + ckpt_entry(0, s2, name2)
          + ckpt_entry(3, index) + ckpt_entry(4, config))
    write("checkpoint", "hf-single", u8(0) + ckpt_entry(0, s1, blob(b"model", 40)))
    sharded = b""
    for rank in range(2):
        for part in range(2):
            st = safetensors_file([("layer%d.weight" % part, "F32", [2], 4)])
            sharded += ckpt_entry(1, st, u8(rank) + u8(part))
    write("checkpoint", "vllm-sharded", u8(3) + sharded)
    write("checkpoint", "symlink-and-dir", u8(2) + ckpt_entry(0, s1, blob(b"real", 40))
          + u8(0 | 3 << 3) + blob(b"link", 40) + u8(0) + u8(0 | 2 << 3) + blob(b"dir", 40))


def materialize_seeds():
    vec = json.load(open(os.path.join(VECTORS, "vectors.json")))
    hashes = [c["block_hash"] for c in vec["cases"] if c["name"].startswith("req-")]
    text = "token_end 40\n" + "".join(h + "\n" for h in hashes)
    # build(): mode 16 (|u1, 3 dims), dims 61 and 8, block size 16, no changes
    write("materialize", "req-40", text.encode() + b"\xff" + u8(16) + u8(60) + u8(7) + u8(15) + u8(0))
    write("materialize", "block-size", b"block_size 4\n  aa\n\nbb \ncc\n" + b"\xff" + u8(0) + u8(0) + u8(0))
    write("materialize", "anything", b"token_end 3\naabb\n" + b"\xff" + u8(0x80 | 0x40) + u8(8) + u8(3))
    write("materialize", "bad-keyword", b"token_start 5\naa\n")


def control_seeds():
    write("control", "load", b"\x00load default /models/ckpt gpus=0,1\n")
    write("control", "unload", b"\x05unload default\nunload\n")
    write("control", "mixed", b"\x03\tload  v1 /x \r\n\nnonsense words here\nload v1 /x gpus=0,1,\n")


def config_seeds():
    text = (b"# artfs\nstore = /dev/shm/artfs-test\ncapacity = 1.5G\nmax_object=64MiB\n"
            b"ttl = 60\nallow_quant = awq,gptq\numask = 027\nweights.default = /models/x\n")
    write("config", "full", blob(text, 9000) + u8(1) + blob(b"8G", 300) + blob(b"1KiB", 40))
    write("config", "bad-line", blob(b"capacity = lots\n", 9000) + u8(0x80) + blob(b"nope", 40)
          + blob(b"x", 300) + blob(b"12.75T", 40))
    write("config", "from-file-set", blob(b"uid = 0\ngid = 0\n", 9000) + u8(0x40 | 7) + blob(b"0777", 300)
          + blob(b"18446744073709551615", 40))


def attach_seeds():
    write("attach", "abi1-zeros", u8(1) + bytes(900))
    write("attach", "abi1-diff", u8(1 | 1 << 2) + b"\x01\x00\x00\x00" + bytes(896) + u16(200) + u8(7))
    write("attach", "bad-abi", u8(2) + b"\x02\x00\x00\x00" + bytes(100))
    # a request on .artfs/attach ('s'), and one a byte short
    req = struct.pack("<II", 0x534C5441, 2) + bytes(range(32))
    write("attach", "slabs-request", b"s" + req)
    write("attach", "slabs-short", b"s" + req[:-1])
    # the record of ready weights a holder keeps ('w')
    fp = {"architecture": "LlamaForCausalLM", "quant_method": "", "quant_config_sha256": "00" * 32,
          "revision": "ab" * 32, "dtypes": "BF16", "tp_size": 1, "tp_rank": 0, "cc_major": 9,
          "cc_minor": 0, "driver_version": 13000}
    head = {"version": "v1", "quant_method": "", "quant_block_fp8": False,
            "status": "state = ready\n", "ranks": [{"device": 0, "uuid": "11" * 16,
                                                   "slab_size": 4 << 20, "bytes": 1000,
                                                   "fingerprint": fp}]}
    rec = b"artfs-weights 1\n" + json.dumps(head, separators=(",", ":")).encode() + b"\n{}"
    write("attach", "record", b"w" + rec)


# namespace: operation numbers of fuzz_namespace.c's op()
LOOKUP, MKDIR, CREATE, WRITE, WRITE_MEANINGFUL, FLUSH, FSYNC, RELEASE, UNLINK, RMDIR, FORGET, \
    OPEN, READ, ATTR, READDIR, XATTR, AGE, RESTART, STATFS, PUBLISH = range(20)
# names: indexes in fuzz_namespace.c's names[]
V0, V1, DEFAULT, AA, H0A0B, FF, H00112233, HVEC, MATERIALIZE, WEIGHTS, INFO, METRICS, CONFIG, CONTROL = range(14)


def envelope_input(rows, token=0, tail=False):
    # make_envelope: sel (|u1, 1 dim, block or tail), shape byte, token start, payload
    return u8(0x20 if tail else 0) + u8(rows - 1) + u8(token) + bytes(range(1, rows + 1))


def publish(node, name, rows=2, token=0):
    # then write_all: chunk size byte, mode byte (pieces)
    return u8(PUBLISH) + u8(node) + u8(name) + envelope_input(rows, token) + u8(3) + u8(0)


def namespace_seeds():
    big = u8(0xC0) + u8(0) + u8(0)   # 8G capacity, 64M max_object, ttl 1
    small = u8(0x01) + u8(1) + u8(1)  # 1K capacity, 320 B max_object, ttl 2, umask 0
    # mkdir v0 (node 1), publish v0/aa (node 2) and v0/ff (node 3), read a materialized request
    seq = u8(MKDIR) + u8(0) + u8(V0)
    seq += publish(1, AA, 2, 0) + publish(1, FF, 2, 2)
    seq += u8(LOOKUP) + u8(1) + u8(MATERIALIZE)
    seq += u8(OPEN) + u8(4) + u8(2)
    # token_end 4, block_size 2, hashes aa ff; write_all in one piece
    seq += u8(WRITE_MEANINGFUL) + u8(0) + u8(3) + u8(4) + u8(1) + u8(2) + u8(0) + u8(1) + u8(0) + u8(1)
    seq += u8(READ) + u8(0) + u8(0) + num_small(4096)
    seq += u8(RELEASE) + u8(0)
    seq += u8(READDIR) + u8(1) + u8(0) + u8(READDIR) + u8(0) + u8(0)
    seq += u8(XATTR) + u8(2) + u8(64) + u8(1) + u8(3)
    write("namespace", "publish-materialize", big + seq)
    # create, write the envelope in pieces, close, unlink, rmdir, restart
    seq = u8(MKDIR) + u8(0) + u8(V1) + u8(CREATE) + u8(1) + u8(H0A0B) + u8(0)
    seq += u8(WRITE_MEANINGFUL) + u8(0) + envelope_input(3, 0, True) + u8(0) + u8(5) + u8(0)
    seq += u8(FLUSH) + u8(0) + u8(0) + u8(RELEASE) + u8(0)
    seq += u8(RESTART) + u8(1) + u8(MKDIR) + u8(0) + u8(V1) + u8(LOOKUP) + u8(0) + u8(V1)
    seq += u8(UNLINK) + u8(1) + u8(H0A0B) + u8(RMDIR) + u8(0) + u8(V1) + u8(STATFS)
    seq += u8(FORGET) + u8(0) + u8(0) + u8(ATTR) + u8(1) + u8(1)
    write("namespace", "create-unlink-restart", big + seq)
    # a full store: the idle version v0 is collected to make room, then ENOSPC
    seq = u8(MKDIR) + u8(0) + u8(V0) + publish(1, AA, 4) + u8(AGE) + u8(1)
    seq += u8(MKDIR) + u8(0) + u8(V1) + publish(3, FF, 4) + publish(3, H00112233, 4) + publish(3, AA, 4)
    seq += publish(3, H0A0B, 4)
    write("namespace", "full-store", small + seq)
    # the info files and the control file
    seq = u8(LOOKUP) + u8(0) + u8(INFO) + u8(LOOKUP) + u8(1) + u8(CONTROL) + u8(OPEN) + u8(2) + u8(1)
    seq += u8(WRITE_MEANINGFUL) + u8(0) + u8(1) + u8(0) + u8(0) + u8(FLUSH) + u8(0) + u8(0)
    seq += u8(LOOKUP) + u8(1) + u8(METRICS) + u8(OPEN) + u8(3) + u8(0) + u8(READ) + u8(1) + u8(0) + num_small(100)
    write("namespace", "info-files", big + seq)
    # mkdir v0, rmdir it, create in the removed version: the use after free in
    # publish_begin (skipped by the driver until that fix is merged)
    seq = u8(MKDIR) + u8(0) + u8(V0) + u8(RMDIR) + u8(0) + u8(V0) + u8(CREATE) + u8(1) + u8(AA) + u8(0)
    seq += u8(RELEASE) + u8(0)
    write("namespace", "create-in-removed-version", big + seq)
    # opendir of a file, then of the root: the use after free in listing_open
    # (skipped by the driver until that fix is merged)
    seq = u8(LOOKUP) + u8(0) + u8(INFO) + u8(LOOKUP) + u8(1) + u8(METRICS)
    seq += u8(READDIR) + u8(2) + u8(0) + u8(READDIR) + u8(0) + u8(0)
    write("namespace", "opendir-of-a-file", big + seq)


def put_seeds():
    """fuzz_put: per key (6) a rows selector and a second content's extra
    rows; per batch: by path?, records, each a selector (key = s % 6,
    content = s >> 3 & 1, damaged when s >= 0xf0), a cut selector (0 mod 8:
    cut, then key and u32 length), then one selector per write (0: all the
    rest, 1: 1 byte, 2: 7, 3: 100, 4: 4096, 5: 33000, 6: 70000, 7: 200003)."""
    def keys(rows):
        return b"".join(u8(r) + u8(i & 1) for i, r in enumerate(rows))

    def batch(by_path, recs, pieces, cut=None):
        out = u8(by_path) + u8(len(recs) - 1) + b"".join(u8(r) for r in recs)
        out += u8(1) if cut is None else u8(0) + u8(cut[0]) + struct.pack("<I", cut[1])
        return out + b"".join(u8(p) for p in pieces)

    big = keys([40, 60, 70, 80, 90, 98])              # 15-38 KB records
    recs = [(i * 7 + (i // 6)) % 6 | ((i % 5 == 0) << 3) for i in range(40)]
    write("put", "large-writes", big + batch(0, recs, [5, 6, 7] * 20)
          + batch(1, recs[::-1], [6, 7, 5] * 20) + batch(0, recs[:20], [0]))
    small = keys([0, 1, 2, 3, 1, 0])
    write("put", "small-records-small-writes", small + batch(1, recs, [2, 3, 4, 1, 6] * 40)
          + batch(0, recs, [0]))
    damaged = [r | 0xf0 if i % 7 == 3 else r for i, r in enumerate(recs)]
    write("put", "damaged-and-cut", big + batch(0, damaged, [6] * 30, cut=(2, 20000))
          + batch(1, damaged[:10], [5] * 30, cut=(1, 100)))
    pairs = [r for i in range(20) for r in (i % 6, i % 6 | (i % 3 == 0) << 3)]
    write("put", "keys-twice-in-a-row", small + batch(0, pairs, [7]) + batch(1, pairs, [0])
          + batch(0, pairs, [4] * 40))
    write("put", "record-over-1mib", keys([40, 0xf8, 60, 1, 70, 2])
          + batch(0, [0, 1, 2, 3, 1, 4, 9, 5], [7] * 20) + batch(1, [1, 9, 0], [6] * 40))


def resp(v):
    """v in the Redis protocol: int, bytes (bulk), str (simple string;
    "-..." an error), None (nil), list (array)."""
    if v is None:
        return b"$-1\r\n"
    if isinstance(v, int):
        return b":%d\r\n" % v
    if isinstance(v, bytes):
        return b"$%d\r\n%s\r\n" % (len(v), v)
    if isinstance(v, str):
        return (v if v.startswith("-") else "+" + v).encode() + b"\r\n"
    return b"*%d\r\n" % len(v) + b"".join(resp(e) for e in v)


def cluster_seeds():
    """Replies of a cluster, after a u16 that says how they are cut."""
    ids = [b"%040x" % i for i in range(3)]
    slots = resp([[0, 5460, [b"127.0.0.1", 7000, ids[0]], [b"127.0.0.1", 7003, b"r0"]],
                  [5461, 10922, [b"", 7001, ids[1]]],
                  [10923, 16383, [b"?", 7002, ids[2]]]])
    nodes = resp(b"".join([
        ids[0] + b" 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460\n",
        b"r0 127.0.0.1:7003@17003 slave " + ids[0] + b" 0 0 1 connected\n",
        b"r1 127.0.0.1:7004@17004 slave,fail " + ids[1] + b" 0 0 1 connected\n",
        b"r2 [::1]:7005@17005 slave " + ids[1] + b" 0 0 1 connected"]))
    write("cluster", "slots-then-nodes", u16(4095) + slots + nodes)
    write("cluster", "slots-in-bytes", u16(0) + slots)
    write("cluster", "redirections", u16(7) + resp("-MOVED 3999 127.0.0.1:6381")
          + resp("-ASK 12 [::1]:7000") + resp("-MOVED 16384 h:1") + resp("-ASK x y"))
    write("cluster", "errors", u16(100) + b"".join(resp(e) for e in (
        "-OOM command not allowed", "-TRYAGAIN", "-LOADING", "-BUSY", "-CLUSTERDOWN",
        "-MASTERDOWN", "-READONLY", "-NOAUTH", "OK", None, 1, b"value")))
    write("cluster", "wide-array", u16(64) + b"*70000\r\n" + resp(1) * 3)


def tree_names_seeds():
    for name, data in [("plain", b"kernel.cubin"), ("dot", b"."), ("dotdot", b".."),
                       ("hidden", b".tmp.123"), ("slash", b"a/b"), ("nul", b"a\0b"),
                       ("max", b"n" * 255), ("long", b"n" * 256), ("empty", b""),
                       ("block-key", b"vllm-artifact/0/" + b"ab" * 32),
                       ("tail-key", b"r3-tail:" + b"cd" * 32), ("key-max", b"k/" * 255 + b"ab"),
                       ("key-empty-seg", b"a//b"), ("key-space", b"a b/c")]:
        write("tree_names", name, data)


def main():
    if os.path.isdir(CORPUS):
        shutil.rmtree(CORPUS)
    envelope_seeds()
    npy_seeds()
    safetensors_seeds()
    checkpoint_seeds()
    materialize_seeds()
    control_seeds()
    config_seeds()
    attach_seeds()
    namespace_seeds()
    put_seeds()
    cluster_seeds()
    tree_names_seeds()


if __name__ == "__main__":
    main()
