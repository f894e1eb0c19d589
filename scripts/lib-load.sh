# Shared by scripts/load.sh and scripts/soak.sh (sourced, not run): stop
# every process they start, by PID, however they end; find or build the
# bench-peers load generator; build the agent. Expects ROOT (the checkout).
# Sets TOOL (the python helper), WORK (a fresh temp dir named for the
# script), LOADGEN and BIN.
TOOL="python3 scripts/loadtool.py"
WORK=$(mktemp -d "/tmp/gha-$(basename "$0" .sh).XXXXXX")
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT INT TERM

# LOADGEN: a built ../shared/bench-peers loadgen (copied to /tmp/bench-peers
# and built there when unset; BENCH_PEERS_SRC moves the source).
if [[ -z "${LOADGEN:-}" ]]; then
    if [[ ! -x /tmp/bench-peers/loadgen/target/release/loadgen ]]; then
        rm -rf /tmp/bench-peers && cp -r "${BENCH_PEERS_SRC:-$ROOT/../shared/bench-peers}" /tmp/bench-peers
        (cd /tmp/bench-peers/loadgen && cargo build --release -q)
    fi
    LOADGEN=/tmp/bench-peers/loadgen/target/release/loadgen
fi
cargo build --release -q
BIN=target/release/gitlab-haproxy-agent
