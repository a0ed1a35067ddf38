#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The whole GPU check on a GPU host, from a build tree made by build.sh (or
# $ARTFS_BUILD): mounts artfs, runs every GPU test and benchmark, prints a
# table last, unmounts. Exit 77 where there is no GPU.
#   ARTFS_GPU_PARTS="tests rl flip restart weights-bench flip-bench flip-in-place-bench cache-bench engine-bench abi-bench hostload-bench disk-bench"
#   what to run (default: all but the loader settings sweeps, hostload-bench,
#   disk-bench and abi-bench, which needs the build before the VMM slabs in
#   $ARTFS_BUILD/old: see bench_weights_abi.py). cache-bench: torch.compile's
#   caches in .cache/ against /dev/shm, on a daemon of its own (bench_cache.py);
#   engine-bench: a 1.1 B engine's whole restart, weights and compile caches
#   from artfs against disk and a cold compile (bench_engine_restart.py)
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
: "${ARTFS_BUILD:=$top/.gpu-build}"
: "${OUT:=/tmp/artfs-gpu-out}"
: "${ARTFS_GPU_PARTS:=tests rl flip restart weights-bench flip-bench flip-in-place-bench cache-bench engine-bench}"
mkdir -p "$OUT"
export ARTFS_BUILD OUT
# Never use NVLink multicast on shared GPU hosts.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$top/contrib/python:$here" PYTHONUNBUFFERED=1
PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.device_count() else 1)' 2>/dev/null; then
	echo "SKIP: no CUDA GPU (or no torch) on this host; the GPU check runs on the GPU host"
	exit 77
fi
[ -x "$ARTFS_BUILD/artfs" ] || { echo "ERROR: no artfs in $ARTFS_BUILD (tests/gpu/build.sh)"; exit 99; }
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv
status=0
for part in $ARTFS_GPU_PARTS; do
	case $part in
	tests) files="$here/test_weights.py" ;;
	restart) files="$here/test_weights_restart.py" ;;
	rl) files="$here/test_rl.py" ;;
	flip) files="$here/test_flip.py" ;;
	*) files= ;;
	esac
	if [ -n "$files" ]; then
		"$PYTHON" -m pytest -v -rP -p no:cacheprovider $files 2>&1 | tee "$OUT/gpu-$part.log" || status=1
		grep -q " failed\| error" "$OUT/gpu-$part.log" && status=1
	fi
	case $part in
	weights-bench) "$PYTHON" "$here/bench_weights.py" 2>&1 | tee "$OUT/gpu-bench.log" || status=1 ;;
	flip-bench) "$PYTHON" "$here/bench_flip.py" 2>&1 | tee "$OUT/flip-bench.log" || status=1 ;;
	flip-in-place-bench) "$PYTHON" "$here/bench_flip_in_place.py" 2>&1 | tee "$OUT/flip-in-place.log" || status=1 ;;
	abi-bench) "$PYTHON" "$here/bench_weights_abi.py" 2>&1 | tee "$OUT/abi-bench.log" || status=1 ;;
	hostload-bench) "$PYTHON" "$here/bench_hostload.py" 2>&1 | tee "$OUT/hostload-bench.log" || status=1 ;;
	disk-bench) "$PYTHON" "$here/bench_disk.py" 2>&1 | tee "$OUT/disk-bench.log" || status=1 ;;
	cache-bench)
		# its own exit status (a pipe's is tee's): 1 on a correctness failure
		{ "$PYTHON" "$here/bench_cache.py" --start --mount /tmp/artfs-cache-bench-mnt
		  echo $? >"$OUT/cache-bench.rc"; } 2>&1 | tee "$OUT/cache-bench.log"
		[ "$(cat "$OUT/cache-bench.rc" 2>/dev/null)" = 0 ] || status=1 ;;
	engine-bench)
		{ "$PYTHON" "$here/bench_engine_restart.py" --start --aot
		  echo $? >"$OUT/engine-bench.rc"; } 2>&1 | tee "$OUT/engine-bench.log"
		[ "$(cat "$OUT/engine-bench.rc" 2>/dev/null)" = 0 ] || status=1 ;;
	esac
done
exit $status
