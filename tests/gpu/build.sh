#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Builds self-contained binaries for the GPU host (GPU.md: no libfuse there,
# nothing installable): libfuse3, jansson and libcrypto linked statically,
# the CUDA runtime statically, NCCL loaded at run time. Output: .gpu-build/
set -eu
top=$(cd "$(dirname "$0")/../.." && pwd)
src=/tmp/artfs-gpu-src
rm -rf "$src"
mkdir -p "$src"
(cd "$top" && git ls-files -co --exclude-standard | tar -cf - -T -) | tar -xf - -C "$src"
cd "$src"
autoreconf -fi >/dev/null 2>&1
./configure -q --enable-static-deps --disable-shared --enable-static
make -j"$(nproc)" artfs artfsctl bench/attach_bench bench/flip_bench bench/r3_bench bench/materialize_bench bench/scale_bench >/dev/null
out="$top/.gpu-build"
rm -rf "$out"
mkdir -p "$out"
cp artfs artfsctl bench/attach_bench bench/flip_bench bench/r3_bench bench/materialize_bench bench/scale_bench "$out/"
for b in "$out"/*; do
	echo "$b: $(ldd "$b" | awk '{print $1}' | tr '\n' ' ')"
done
