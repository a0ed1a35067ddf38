#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The restart gap of two builds taking turns on one host (bench/
# restart_bench.py, empty store): a build before a change ($1) and one with
# it ($2), each `rounds` times, with daemons killed 0.3 s after they serve
# (before a GPU node's daemon touches the GPU) and 3 s after (past the
# warm-up delay: it has its CUDA contexts and pinned buffers). Outputs and
# the daemons' logs in $OUT (default /tmp).
#     sh bench/restart_ab.sh <build-before> <build-after> [rounds] [kills]
set -u
before=$1 after=$2 rounds=${3:-2} kills=${4:-8}
out=${OUT:-/tmp}
py=${PYTHON:-python3}
here=$(dirname "$0")
for r in $(seq 1 "$rounds"); do
	for settle in 0.3 3; do
		for b in before after; do
			eval dir=\$$b
			name="restart-ab-$b-settle$settle-$r"
			echo "== $name ($dir)"
			ARTFS_BENCH_SETTLE=$settle ARTFS_BENCH_LOG="$out/$name.log" \
				"$py" "$here/restart_bench.py" "$dir/artfs" "$dir/artfsctl" "" "$kills" 2 2>&1 |
				tee "$out/$name.txt" | grep -E "^(each|gap|readers)"
		done
	done
done
