#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Builds the fuzz targets (tests/fuzz/fuzz.mk) with clang and libFuzzer.
#     tests/fuzz/build.sh [SRCDIR [BUILDDIR]]     (default: this checkout, .)
# BUILDDIR is a configured build directory (it holds autoconf.h); the
# targets go to BUILDDIR/tests/fuzz/<name>. Exit status 77 when clang or
# libFuzzer is missing. FUZZ_JOBS (default 2) parallel compiles.
set -e
here=$(cd "$(dirname "$0")" && pwd)
srcdir=${1:-$here/../..}
builddir=${2:-.}
CLANG=${CLANG:-clang}

if ! command -v "$CLANG" >/dev/null 2>&1; then
	echo "fuzz: $CLANG not found; the fuzz targets need clang with libFuzzer" >&2
	exit 77
fi
if [ ! -f "$builddir/autoconf.h" ]; then
	echo "fuzz: $builddir/autoconf.h not found; run configure first" >&2
	exit 1
fi
probe=$(mktemp -d "${TMPDIR:-/tmp}/artfs-fuzz-probe.XXXXXX")
printf '#include <stddef.h>\n#include <stdint.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { return 0; }\n' \
	> "$probe/probe.c"
if ! "$CLANG" -fsanitize=fuzzer,address,undefined -o "$probe/probe" "$probe/probe.c" >"$probe/log" 2>&1; then
	echo "fuzz: $CLANG cannot build a libFuzzer target with ASan/UBSan:" >&2
	cat "$probe/log" >&2
	rm -rf "$probe"
	exit 77
fi
rm -rf "$probe"
# Called from a make rule, MAKEFLAGS may name a jobserver this make cannot
# reach; FUZZ_JOBS says how many compiles run at once instead.
unset MAKEFLAGS MFLAGS
exec ${MAKE:-make} -j"${FUZZ_JOBS:-2}" -f "$srcdir/tests/fuzz/fuzz.mk" \
	SRCDIR="$srcdir" BUILDDIR="$builddir" CLANG="$CLANG"
