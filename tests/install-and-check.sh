#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Installs what artfs needs, builds it, and runs the whole test suite:
# Check unit tests (plain and sanitized) and the real-mount tests against the
# daemon and its AddressSanitizer/UBSan build. For Debian 12, as root.
set -eu
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
if [ "$(id -u)" = 0 ]; then
	apt-get update -qq
	# shellcheck disable=SC2046
	apt-get install -y -qq --no-install-recommends $(cat contrib/debian-packages) >/dev/null
	# What building and checking the Debian packages needs (tests/debian).
	# shellcheck disable=SC2046
	apt-get install -y -qq --no-install-recommends $(cat contrib/debian-packages-check) >/dev/null
fi
autoreconf -fi
./configure
make -j"$(nproc)"
status=0
make -j"$(nproc)" check || status=$?

# What each suite said, then one line for the totals (Check's and pytest's
# closing lines, summed).
logs=""
for log in tests/unit/test_core.log tests/unit/test_core_asan.log tests/mount/normal.log \
	tests/mount/asan.log tests/remote/remote.log tests/remote/remote_asan.log; do
	[ -f "$log" ] || continue
	echo "== $log"
	tail -n 3 "$log"
	logs="$logs $log"
done
# shellcheck disable=SC2086
set -- $(awk '
	/^[0-9]+%: Checks: / {
		gsub(/,/, ""); p += $3 - $5 - $7; f += $5 + $7
	}
	/ in [0-9.]+s/ && / (passed|failed|error|errors|skipped)/ {
		for (i = 2; i <= NF; i++) {
			w = $i; gsub(/[^a-z]/, "", w)
			if (w == "passed") p += $(i - 1)
			if (w == "failed" || w == "error" || w == "errors") f += $(i - 1)
			if (w == "skipped") s += $(i - 1)
		}
	}
	END { print p + 0, f + 0, s + 0 }' $logs /dev/null)
passed=$1 failed=$2 skipped=$3
if [ "$status" != 0 ]; then
	echo "== test-suite.log"
	cat test-suite.log
	[ "$failed" -gt 0 ] || failed=1
fi
echo "$passed passed, $failed failed, $skipped skipped"
exit "$status"
