#!/usr/bin/env bash
# Bounded load run (issue 7): loopback only, stops by itself (~60 s with the
# defaults). Not part of `cargo test`.
#
# Starts the release agent in -dev mode with 1,000 keys, measures normal
# checks at a steady rate with nothing else connected (idle), then again
# beside SILENT connections that send nothing and DRIP connections that send
# one byte a second, and reports: p99 idle vs beside slow peers (target within
# 2x), checks/s, open connections, peak RSS.
#
# Knobs (environment): RATE (2000 checks/s), PHASE_SECS (15), SILENT (10000,
# shrunk to what RLIMIT_NOFILE allows), DRIP (1000), LOADGEN (path to a built
# ../shared/bench-peers loadgen; built into /tmp/bench-peers if unset).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
RATE=${RATE:-2000}
PHASE_SECS=${PHASE_SECS:-15}
SILENT=${SILENT:-10000}
DRIP=${DRIP:-1000}
# shellcheck source=scripts/lib-load.sh
. scripts/lib-load.sh

ulimit -n "$(ulimit -Hn)"
max=$(( $(ulimit -n) - 500 ))
if (( SILENT + DRIP > max )); then SILENT=$(( max - DRIP )); echo "fd limit: SILENT shrunk to $SILENT"; fi

# exec: run in the background, $! is the program itself (killed by PID).
pin() { if command -v taskset >/dev/null && (( $(nproc) > 1 )); then exec taskset -c "$1" "${@:2}"; else exec "${@:2}"; fi; }

# Long read timeout: the slow peers stay open through the measured phase.
(pin 0 "$BIN" -dev -listen-addr 127.0.0.1:0 -monitoring-addr 127.0.0.1:0 -pprof-addr "" \
    -dev-kv-addr 127.0.0.1:0 -read-timeout 60s -max-connections 20000 2>"$WORK/agent.log") &
AGENT=$!
PIDS+=("$AGENT")
for _ in $(seq 100); do $TOOL addrs "$WORK/agent.log" >/dev/null 2>&1 && break; sleep 0.1; done
read -r LISTEN MON KV < <($TOOL addrs "$WORK/agent.log")
PREFIX=gitlab-haproxy-agent/state
$TOOL put-keys "$KV" "$PREFIX" 1000
echo "agent pid $AGENT listen $LISTEN monitoring $MON; 1000 keys"

run() { # label
    pin 1 "$LOADGEN" --addr "$LISTEN" --rate "$RATE" --duration "$PHASE_SECS" --id-count 1000 \
        --threads 1 --timeout-ms 2000 --label "$1"
}
field() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }

(pin 1 "$LOADGEN" --addr "$LISTEN" --rate "$RATE" --duration 2 --id-count 1000 --threads 1 >/dev/null)
$TOOL hist "$MON" "$WORK/h0"
IDLE=$(run idle)
$TOOL hist "$MON" "$WORK/h1"
echo "idle:       $IDLE"

HOLD=$(( PHASE_SECS + 20 ))
pin 1 "$LOADGEN" --addr "$LISTEN" --hold-idle "$SILENT" --hold-secs "$HOLD" --threads 1 \
    --ready-file "$WORK/silent.ready" >"$WORK/hold.json" &
PIDS+=("$!")
pin 1 $TOOL drip "$LISTEN" "$DRIP" "$HOLD" "$WORK/drip.ready" 2>"$WORK/drip.log" &
PIDS+=("$!")
for _ in $(seq 300); do [[ -e "$WORK/silent.ready" && -e "$WORK/drip.ready" ]] && break; sleep 0.1; done
sleep 1
OPEN_BEFORE=$($TOOL metric "$MON" gitlab_haproxy_agent_open_connections)
$TOOL hist "$MON" "$WORK/h2"
LOADED=$(run "beside $SILENT silent + $DRIP dripping")
$TOOL hist "$MON" "$WORK/h3"
OPEN_AFTER=$($TOOL metric "$MON" gitlab_haproxy_agent_open_connections)
echo "slow peers: $LOADED"
read -r RSS HWM < <($TOOL rss "$AGENT")
CPU=$(awk '{print $14 + $15}' "/proc/$AGENT/stat")

P99_IDLE=$(field "$IDLE" p99_us)
P99_LOADED=$(field "$LOADED" p99_us)
RATIO=$(python3 -c "print(f'{$P99_LOADED / max($P99_IDLE, 1):.2f}')")
VERDICT=$(python3 -c "print('PASS' if $P99_LOADED <= 2 * $P99_IDLE else 'FAIL')")
echo
echo "== load summary =="
echo "rate target        ${RATE}/s for ${PHASE_SECS}s per phase"
echo "checks/s idle      $(field "$IDLE" rate_per_s) (errors $(field "$IDLE" errors))"
echo "checks/s loaded    $(field "$LOADED" rate_per_s) (errors $(field "$LOADED" errors))"
echo "p50 idle/loaded    $(field "$IDLE" p50_us) / $(field "$LOADED" p50_us) us"
echo "p99 idle/loaded    $P99_IDLE / $P99_LOADED us  (ratio $RATIO, target <= 2x: $VERDICT)"
echo "p999 idle/loaded   $(field "$IDLE" p999_us) / $(field "$LOADED" p999_us) us"
echo "agent-side p99     $($TOOL hist-p99 "$WORK/h0" "$WORK/h1") / $($TOOL hist-p99 "$WORK/h2" "$WORK/h3") (accept -> reply written, from its own histogram)"
echo "loadgen start lag  p99 $(field "$IDLE" start_lag_p99_us) / $(field "$LOADED" start_lag_p99_us) us (the generator's own lag, inside the figures above)"
echo "agent process      $(cat /proc/$AGENT/comm) pid $AGENT"
echo "open connections   $OPEN_BEFORE before, $OPEN_AFTER after the loaded phase"
echo "RSS now / peak     $RSS / $HWM KiB"
echo "agent CPU ticks    $CPU"
echo "work dir           $WORK"
