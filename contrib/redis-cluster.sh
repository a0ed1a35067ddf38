#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# A small Redis Cluster on loopback, to try artfs's remote= tier and for its
# tests: 6 redis-server
# (3 masters, 1 replica each) bound to 127.0.0.1, nothing persisted.
#
#   cluster.sh start <dir> <base_port>   ports base..base+5, bus ports +10000
#                                        (keep both below the ephemeral range)
#   cluster.sh stop <dir>                kills them all (even if stopped), removes dir
#
# start fails (exit 2, servers killed) when a port is taken or the cluster is
# not ok within 30 s. Every wait is bounded. The node timeout is 3 s: short
# for a quick failover test, long enough that a busy test machine does not
# fail nodes over by itself.
set -eu

usage() {
	echo "usage: $0 start <dir> <base_port> | stop <dir>" >&2
	exit 2
}

cmd=${1:-}
dir=${2:-}
if [ -z "$cmd" ] || [ -z "$dir" ]; then
	usage
fi

stop() {
	[ -d "$dir" ] || return 0
	for pidfile in "$dir"/redis-*.pid; do
		[ -f "$pidfile" ] || continue
		pid=$(cat "$pidfile" 2>/dev/null || true)
		if [ -n "$pid" ]; then
			kill -KILL "$pid" 2>/dev/null || true
		fi
	done
	rm -rf "$dir"
}

cli() {
	port=$1
	shift
	timeout 5 redis-cli -h 127.0.0.1 -p "$port" "$@"
}

# Waits up to $1 seconds for "$2 ..." to succeed.
wait_for() {
	limit=$(($(date +%s) + $1))
	shift
	until "$@"; do
		[ "$(date +%s)" -lt "$limit" ] || return 1
		sleep 0.1
	done
}

answers_as_ours() {
	pid=$(cat "$dir/redis-$1.pid" 2>/dev/null || true)
	got=$(cli "$1" info server 2>/dev/null | tr -d '\r' | sed -n 's/^process_id://p')
	[ -n "$pid" ] && [ "$got" = "$pid" ]
}

cluster_ok() {
	cli "$1" cluster info 2>/dev/null | grep -q '^cluster_state:ok'
}

replica_linked() {
	! cli "$1" info replication 2>/dev/null | tr -d '\r' | grep -q '^master_link_status:down'
}

start() {
	base=$1
	ports="$base $((base + 1)) $((base + 2)) $((base + 3)) $((base + 4)) $((base + 5))"
	for p in $ports; do
		for q in "$p" "$((p + 10000))"; do
			if [ -n "$(ss -Htan "sport = :$q" 2>/dev/null)" ]; then
				echo "cluster.sh: port $q is in use" >&2
				return 2
			fi
		done
	done
	mkdir -p "$dir"
	for p in $ports; do
		mkdir -p "$dir/$p"
		redis-server --port "$p" --bind 127.0.0.1 --cluster-enabled yes \
			--cluster-config-file "$dir/$p/nodes.conf" --cluster-node-timeout 3000 \
			--save '' --appendonly no --dir "$dir/$p" --daemonize yes \
			--pidfile "$dir/redis-$p.pid" --logfile "$dir/$p/redis.log" \
			--maxmemory-policy noeviction >/dev/null
	done
	# Each port answers from the process started here, not from a server
	# of someone else that took the port meanwhile.
	limit=$(($(date +%s) + 10))
	for p in $ports; do
		until answers_as_ours "$p"; do
			if grep -q aborting "$dir/$p/redis.log" 2>/dev/null ||
				[ "$(date +%s)" -ge "$limit" ]; then
				echo "cluster.sh: redis-server on port $p did not start; its log ends:" >&2
				tail -n 3 "$dir/$p/redis.log" >&2 2>/dev/null
				return 2
			fi
			sleep 0.1
		done
	done
	addrs=""
	for p in $ports; do
		addrs="$addrs 127.0.0.1:$p"
	done
	# shellcheck disable=SC2086
	if ! cli "$base" --cluster create $addrs --cluster-replicas 1 --cluster-yes \
		>"$dir/create.log" 2>&1; then
		echo "cluster.sh: redis-cli --cluster create failed:" >&2
		cat "$dir/create.log" >&2
		return 2
	fi
	# Every node sees the cluster ok, every replica is linked (WAIT 1 works).
	for p in $ports; do
		if ! wait_for 30 cluster_ok "$p" || ! wait_for 30 replica_linked "$p"; then
			echo "cluster.sh: port $p: cluster not ok or replica not linked after 30 s" >&2
			return 2
		fi
	done
}

case "$cmd" in
start)
	[ -n "${3:-}" ] || usage
	if ! start "$3"; then
		stop
		exit 2
	fi
	;;
stop)
	stop
	;;
*)
	usage
	;;
esac
