#!/usr/bin/env bash
# bench-flood.sh: the responder bench (benches/responder.rs, external mode)
# against two agent binaries, side by side: CPU per check and latency in
# every scenario, bytes per idle connection, then check latency under a
# flood of idle connections holding -max-connections twice over (issue 39).
#
#   scripts/bench-flood.sh BEFORE_BIN AFTER_BIN
#
# Each binary runs in turn in -dev on free loopback ports, pinned to CPU 0;
# the generator is pinned to CPU 1. Knobs: DUR [3] s per scenario, IDLE
# [10000] idle connections, LIMIT [1000] the flood run's -max-connections
# (the flood holds 2 x LIMIT). Tables go to target/bench-results/.
set -euo pipefail
cd "$(dirname "$0")/.."
A=${1:?usage: bench-flood.sh BEFORE_BIN AFTER_BIN}
B=${2:?usage: bench-flood.sh BEFORE_BIN AFTER_BIN}
DUR=${DUR:-3} IDLE=${IDLE:-10000} LIMIT=${LIMIT:-1000}
cargo bench --bench responder --no-run -q 2>/dev/null
BENCH=$(ls -t target/release/deps/responder-* | grep -v '\.d$' | head -1)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

run_one() { # BIN LABEL [BENCH_FLOOD]
	local port kv pid limit=20000
	port=$(free_port) kv=$(free_port)
	[[ -n ${3:-} ]] && limit=$LIMIT
	GITLAB_LOG_LEVEL=warn taskset -c 0 "$1" -dev -listen-addr "127.0.0.1:$port" -dev-kv-addr "127.0.0.1:$kv" \
		-monitoring-addr "" -pprof-addr "" -read-timeout 60s -max-connections "$limit" 2>/dev/null &
	pid=$!
	for _ in $(seq 50); do curl -sf -o /dev/null "http://127.0.0.1:$kv/v1/status/leader" && break; sleep 0.1; done
	echo "== $2 ($1)"
	BENCH_ADDR="127.0.0.1:$port" BENCH_PID=$pid BENCH_DURATION=$DUR BENCH_IDLE=$IDLE BENCH_FLOOD=${3:-} \
		"$BENCH" 2>&1 | grep -v '^$' || true
	kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
}
run_one "$A" before
run_one "$B" after
run_one "$A" before-flood $((2 * LIMIT))
run_one "$B" after-flood $((2 * LIMIT))
