#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# R3 batch put/get (bench/batch_bench.py) of two builds taking turns on one
# host: a build before a change ($1) and one with it ($2), each mounted
# fresh over an empty store in /dev/shm for each of `rounds` rounds, in
# alternating order. Extra environment for the daemons of the second build
# in $AB_AFTER_ENV (for example ARTFS_WAIT_AWAKE=0); $AB_BENCH names another
# batch_bench.py (an older one, that both builds speak: the before build's,
# with its Python package on PYTHONPATH). Outputs in $OUT.
#     sh bench/batch_ab.sh <build-before> <build-after> [rounds] [objects] [batch]
set -u
before=$1 after=$2 rounds=${3:-6} objects=${4:-6400} batch=${5:-64}
out=${OUT:-/tmp}
py=${PYTHON:-python3}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
mnt=/tmp/artfs-ab-mnt raw=/dev/shm/artfs-ab-raw store=/dev/shm/artfs-ab-store
run_one() { # build-dir name [env...]
	dir=$1 name=$2
	shift 2
	mkdir -p "$mnt" "$raw"
	rm -rf "$store" "$raw"/*
	env "$@" "$dir/artfs" -f -o "store=$store" "$mnt" >"$out/$name.daemon.log" 2>&1 &
	pid=$!
	i=0
	until grep -q " $mnt fuse" /proc/mounts; do
		i=$((i + 1))
		[ $i -gt 200 ] && { echo "no mount for $name"; kill $pid; return 1; }
		sleep 0.05
	done
	"$py" "${AB_BENCH:-$here/batch_bench.py}" "$mnt" "$raw" "$objects" 1 "$batch" >"$out/$name.txt" 2>&1
	grep -E "^(put|get) |^null" "$out/$name.txt" | sed "s/^/$name: /"
	umount "$mnt"
	wait $pid
}
for r in $(seq 1 "$rounds"); do
	if [ $((r % 2)) = 1 ]; then
		run_one "$before" "before-$r"
		run_one "$after" "after-$r" ${AB_AFTER_ENV:-}
	else
		run_one "$after" "after-$r" ${AB_AFTER_ENV:-}
		run_one "$before" "before-$r"
	fi
done
