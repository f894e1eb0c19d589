#!/usr/bin/env bash
# bench-compare.sh: the agent beside the yardsticks, in one run.
#
# Starts the release agent in -dev mode pinned to CPU 0 on fixed loopback
# ports, loads 1,000 keys (be_N/srv_M = "ready", the identities loadgen and
# the yardsticks use) through PUTs on its dev KV, then hands it to the
# bench-peers kit's run-baseline.sh as EXTRA_PID, which runs the same matrix
# (closed loop c1/c16/c256, open loop 1000/s and 10000/s, c64 on all CPUs,
# 10,000 idle connections) against limit-c, peer-go and the agent, taking
# turns per repetition, and writes medians (min-max), steal and foreign-load
# flags to a Markdown report. The agent is stopped by its PID at the end.
#
# Knobs (environment): PEERS [/tmp/bench-peers-wtbench] (a private writable copy of
# ../shared/bench-peers), AGENT_PORT [9711], AGENT_KV_PORT [9712], OUT_MD
# [target/bench-results/compare.md], plus every run-baseline.sh knob
# (REPEAT [5], DURATION [5], RESPONDERS, CONCS, RATES, IDLE_CONNS ...).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PEERS=${PEERS:-/tmp/bench-peers-wtbench}
AGENT_PORT=${AGENT_PORT:-9711}
AGENT_KV_PORT=${AGENT_KV_PORT:-9712}
mkdir -p target/bench-results
export OUT_MD=${OUT_MD:-$ROOT/target/bench-results/compare.md}
export REPEAT=${REPEAT:-5} DURATION=${DURATION:-5}
[[ -x "$PEERS/run-baseline.sh" ]] || { cp -r "${BENCH_PEERS_SRC:-$ROOT/../shared/bench-peers}" "$PEERS" && chmod -R u+w "$PEERS"; }

cargo build --release -q
BIN=$ROOT/target/release/gitlab-haproxy-agent
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

LOG=$ROOT/target/bench-results/compare-agent.log
GITLAB_LOG_LEVEL=warn taskset -c 0 "$BIN" -dev -listen-addr "127.0.0.1:$AGENT_PORT" -dev-kv-addr "127.0.0.1:$AGENT_KV_PORT" \
	-monitoring-addr "" -pprof-addr "" -read-timeout 60s 2>"$LOG" &
AGENT_PID=$!
stop() {
	kill -TERM "$AGENT_PID" 2>/dev/null || return 0
	for _ in $(seq 50); do kill -0 "$AGENT_PID" 2>/dev/null || break; sleep 0.1; done
	kill -KILL "$AGENT_PID" 2>/dev/null || true
	wait "$AGENT_PID" 2>/dev/null || true
}
trap stop EXIT
trap 'exit 130' INT TERM

for _ in $(seq 100); do # <= 10 s for the dev KV to listen
	curl -sf -o /dev/null "http://127.0.0.1:$AGENT_KV_PORT/v1/kv/x" -X PUT -d ready && break
	sleep 0.1
done
# 1,000 PUTs over one keep-alive connection (curl reuses it within one call).
args=(-X PUT --data-binary ready)
for i in $(seq 0 999); do
	args+=(-o /dev/null "http://127.0.0.1:$AGENT_KV_PORT/v1/kv/gitlab-haproxy-agent/state/be_$((i / 10))/srv_$((i % 10))")
done
curl -sf "${args[@]}"
sleep 0.5 # the watcher re-reads the prefix once the writes stop

EXTRA_ADDR=127.0.0.1:$AGENT_PORT EXTRA_NAME=agent EXTRA_PID=$AGENT_PID \
	EXTRA_LOADGEN_ARGS="--id-count 1000" EXTRA_EXPECT="ready 100%" \
	"$PEERS/run-baseline.sh"
echo "report: $OUT_MD"
