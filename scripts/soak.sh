#!/usr/bin/env bash
# Bounded soak (issue 7): loopback only, stops by itself (SOAK_SECS, default
# 180). Not part of `cargo test`.
#
# The release agent in -dev mode with 1,000 keys answers a steady check rate
# while the KV churns (one PUT every CHURN_MS, default 100 ms: every PUT is a
# full re-read and swap); RSS is sampled every SAMPLE_SECS (5) and printed as
# a series, then judged: flat when the last quarter's mean is within
# max(512 KiB, 5 %) of the second quarter's (the first quarter is warm-up).
#
# Knobs: SOAK_SECS, RATE (1000 checks/s), CHURN_MS, SAMPLE_SECS, LOADGEN.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SOAK_SECS=${SOAK_SECS:-180}
RATE=${RATE:-1000}
CHURN_MS=${CHURN_MS:-100}
SAMPLE_SECS=${SAMPLE_SECS:-5}
# shellcheck source=scripts/lib-load.sh
. scripts/lib-load.sh


"$BIN" -dev -listen-addr 127.0.0.1:0 -monitoring-addr 127.0.0.1:0 -pprof-addr "" \
    -dev-kv-addr 127.0.0.1:0 2>"$WORK/agent.log" &
AGENT=$!
PIDS+=("$AGENT")
for _ in $(seq 100); do $TOOL addrs "$WORK/agent.log" >/dev/null 2>&1 && break; sleep 0.1; done
read -r LISTEN MON KV < <($TOOL addrs "$WORK/agent.log")
PREFIX=gitlab-haproxy-agent/state
$TOOL put-keys "$KV" "$PREFIX" 1000
echo "agent pid $AGENT listen $LISTEN; 1000 keys; ${SOAK_SECS}s at ${RATE}/s, a PUT every ${CHURN_MS} ms"

"$LOADGEN" --addr "$LISTEN" --rate "$RATE" --duration "$SOAK_SECS" --id-count 1000 --threads 1 \
    --label soak >"$WORK/loadgen.json" &
LG=$!
PIDS+=("$LG")
$TOOL churn "$KV" "$PREFIX" "$SOAK_SECS" "$CHURN_MS" 2>"$WORK/churn.log" &
PIDS+=("$!")

SERIES=()
start=$(date +%s)
while kill -0 "$LG" 2>/dev/null; do
    read -r RSS HWM < <($TOOL rss "$AGENT")
    t=$(( $(date +%s) - start ))
    SERIES+=("$RSS")
    printf 't=%4ss rss=%6s KiB\n' "$t" "$RSS"
    sleep "$SAMPLE_SECS"
done
wait "$LG" || true
read -r RSS HWM < <($TOOL rss "$AGENT")
SWAPS=$($TOOL metric "$MON" gitlab_haproxy_agent_state_swaps_total)
OPEN=$($TOOL metric "$MON" gitlab_haproxy_agent_open_connections)

echo
echo "== soak summary =="
echo "loadgen            $(cat "$WORK/loadgen.json")"
echo "churn              $(cat "$WORK/churn.log")"
echo "state swaps        $SWAPS"
echo "open connections   $OPEN at the end"
echo "RSS series (KiB)   ${SERIES[*]}"
echo "RSS end / peak     $RSS / $HWM KiB"
python3 - "${SERIES[@]}" <<'EOF'
import sys
s = [int(x) for x in sys.argv[1:]]
if len(s) < 8:
    sys.exit(print("verdict            too few samples to judge"))
q = len(s) // 4
warm, tail = s[q:2 * q], s[-q:]
a, b = sum(warm) / len(warm), sum(tail) / len(tail)
slack = max(512, 0.05 * a)
print(f"verdict            {'FLAT' if b - a <= slack else 'GROWING'}: 2nd quarter mean {a:.0f} KiB, last quarter {b:.0f} KiB (slack {slack:.0f})")
EOF
