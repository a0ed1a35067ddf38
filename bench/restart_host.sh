#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The restart measurements of bench/restart_bench.py on one host, over an
# empty store and over a store of a million objects (written by
# bench/scale_bench), from a build tree (default: the static binaries of
# tests/gpu/build.sh in .gpu-build). Outputs in $OUT (default /tmp).
#     sh bench/restart_host.sh [build-dir]
set -u
build=${1:-.gpu-build}
out=${OUT:-/tmp}
py=${PYTHON:-python3}
here=$(dirname "$0")
"$py" "$here/restart_bench.py" "$build/artfs" "$build/artfsctl" "" 20 5 2>&1 | tee "$out/restart-empty.txt"
"$build/scale_bench" --starts=1 "$build/artfs" /dev/shm/scale >"$out/scale.txt" 2>&1 ||
	{ tail -20 "$out/scale.txt"; exit 1; }
grep -E "^start|memory per|VmRSS" "$out/scale.txt"
"$py" "$here/restart_bench.py" "$build/artfs" "$build/artfsctl" /dev/shm/scale/store 20 5 2>&1 |
	tee "$out/restart-1m.txt"
