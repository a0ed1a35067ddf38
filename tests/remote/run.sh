#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Runs the Redis Cluster client tests with one test program: run.sh <program>.
# First the tests that need no cluster; then, on a fresh cluster of 6
# redis-server on 127.0.0.1 (contrib/redis-cluster.sh), the rest. The cluster
# is always stopped at the end. Exit 77 (skip) only where redis-server or
# redis-cli is missing, or artfs was built without hiredis; it says which.
prog="$1"
here=$(cd "$(dirname "$0")" && pwd)
[ -x "$prog" ] || { echo "ERROR: no test program at $prog"; exit 99; }

timeout 120 "$prog"
rc=$?
if [ "$rc" = 77 ]; then
	echo "SKIP: artfs was built without hiredis (libhiredis-dev): no Redis Cluster tier to test"
	exit 77
fi
[ "$rc" = 0 ] || exit "$rc"
for tool in redis-server redis-cli; do
	if ! command -v "$tool" >/dev/null 2>&1; then
		echo "SKIP: $tool is missing (apt-get install redis-server redis-tools): cluster tests not run"
		exit 77
	fi
done

dir=$(mktemp -d "${TMPDIR:-/tmp}/artfs-remote.XXXXXX")
cleanup() {
	sh "$here/../../contrib/redis-cluster.sh" stop "$dir/cluster"
	rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Ports base..base+5 and their bus ports +10000, all below the range the
# kernel picks outgoing ports from (which a bind may otherwise meet in use).
ephemeral=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
top=$((ephemeral - 10006))
[ "$top" -gt 2000 ] || top=22700
low=10000
[ "$top" -gt 11000 ] || low=1024
started=
for attempt in 1 2 3; do
	base=$(shuf -i "$low-$top" -n 1)
	if sh "$here/../../contrib/redis-cluster.sh" start "$dir/cluster" "$base"; then
		started=yes
		break
	fi
	echo "cluster.sh start failed (attempt $attempt), trying other ports"
done
[ -n "$started" ] || { echo "ERROR: could not start a Redis Cluster on 127.0.0.1"; exit 99; }

ARTFS_REMOTE_PORT=$base ARTFS_REMOTE_DIR="$dir/cluster" timeout 300 "$prog"
