#!/usr/bin/env bash
# bench-ab.sh: CPU per check of two agent binaries, side by side.
#
#   scripts/bench-ab.sh BEFORE_BIN AFTER_BIN
#
# Starts each binary in turn (-dev, pinned to CPU 0, fixed loopback ports),
# drives it with the comparison kit's load generator pinned to CPU 1 (closed
# loop c16, or MODE=open: 10,000 checks/s), and prints the CPU it used per
# check (utime + stime ticks from /proc/PID/stat over the run), alternating
# A B A B ... so slow drift of the machine hits both alike. For a refactor
# that must not touch the answer path: build the old commit's binary in a
# worktree, then compare. Knobs: REPS [5], DUR [3] seconds, MODE [c16|open],
# PEERS (a writable copy of the kit, as scripts/bench-compare.sh uses), EXTRA
# (more agent flags for both, e.g. EXTRA="-state-file /tmp/ab.json").
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
A=${1:?usage: bench-ab.sh BEFORE_BIN AFTER_BIN}
B=${2:?usage: bench-ab.sh BEFORE_BIN AFTER_BIN}
REPS=${REPS:-5} DUR=${DUR:-3} MODE=${MODE:-c16}
PEERS=${PEERS:-/tmp/bench-peers-wtbench}
[[ -d "$PEERS/loadgen" ]] || { cp -r "${BENCH_PEERS_SRC:-$ROOT/../shared/bench-peers}" "$PEERS" && chmod -R u+w "$PEERS"; }
LG=$PEERS/loadgen/target/release/loadgen
[[ -x $LG ]] || (cd "$PEERS/loadgen" && cargo build --release -q)
PORT=${AB_PORT:-9777} KV_PORT=${AB_KV_PORT:-9778}
args="--concurrency 16"; [[ $MODE == open ]] && args="--rate 10000"

run_one() { # BIN LABEL
	GITLAB_LOG_LEVEL=warn taskset -c 0 "$1" -dev -listen-addr "127.0.0.1:$PORT" -dev-kv-addr "127.0.0.1:$KV_PORT" \
		-monitoring-addr "" -pprof-addr "" -read-timeout 60s ${EXTRA:-} 2>/dev/null &
	local pid=$!
	for _ in $(seq 50); do curl -sf -o /dev/null "http://127.0.0.1:$KV_PORT/v1/status/leader" && break; sleep 0.1; done
	curl -sf -X PUT --data drain "http://127.0.0.1:$KV_PORT/v1/kv/gitlab-haproxy-agent/state/be_1/srv_1" >/dev/null
	sleep 0.5
	# shellcheck disable=SC2086
	taskset -c 1 "$LG" --addr "127.0.0.1:$PORT" $args --duration 1 >/dev/null 2>&1 || true
	local t0 t1 out
	t0=$(awk '{print $14+$15}' "/proc/$pid/stat")
	# shellcheck disable=SC2086
	out=$(taskset -c 1 "$LG" --addr "127.0.0.1:$PORT" $args --duration "$DUR" 2>/dev/null)
	t1=$(awk '{print $14+$15}' "/proc/$pid/stat")
	kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
	OUT="$out" T="$((t1 - t0))" HZ="$(getconf CLK_TCK)" LABEL="$2" MODE="$MODE" python3 -c '
import json, os
e = os.environ
d = json.loads(e["OUT"])
us = int(e["T"]) * 1e6 / int(e["HZ"]) / d["checks"]
print("%-6s %s checks=%d errors=%d cpu_us_per_check=%.1f" % (e["LABEL"], e["MODE"], d["checks"], d.get("errors", 0), us))'
}
for _ in $(seq "$REPS"); do
	run_one "$A" before
	run_one "$B" after
done
