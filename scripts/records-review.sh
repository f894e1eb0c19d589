#!/usr/bin/env bash
# records-review.sh: tries to make a writer's record lie (issue 33's outside
# review), against a -dev agent on loopback. Each scenario prints what the KV
# holds afterwards and what `status` says; a line starting "LIE:" is a record
# that says something the KV does not.
#
#   scripts/records-review.sh [BIN]     (default target/debug/gitlab-haproxy-agent)
set -uo pipefail
BIN=${1:-target/debug/gitlab-haproxy-agent}
KV=127.0.0.1:${KV_PORT:-19878} PPROF=127.0.0.1:${PPROF_PORT:-19879}
P=gitlab-haproxy-agent/state M=gitlab-haproxy-agent/meta
"$BIN" -dev -dev-kv-addr "$KV" -listen-addr 127.0.0.1:0 -monitoring-addr "" -pprof-addr "$PPROF" 2>/tmp/records-review.log &
AGENT=$!
trap 'kill $AGENT 2>/dev/null' EXIT
for _ in $(seq 50); do curl -sf -o /dev/null "http://$KV/v1/status/leader" && break; sleep 0.1; done
w() { USER=${WHO:-alice} "$BIN" "$@" -consul-addr "http://$KV" >/dev/null 2>&1; }
entry() { curl -s "http://$KV/v1/kv/$1" | python3 -c 'import json,sys,base64
try: e=json.load(sys.stdin)[0]; print(e["ModifyIndex"], e["Flags"], base64.b64decode(e["Value"] or "").decode())
except Exception: print("absent")'; }
# A key and its record agree: same index (one transaction), same value.
check() {
	local k r
	k=$(entry "$P/$1") r=$(entry "$M/$1")
	python3 - "$1" "$k" "$r" <<'PY'
import json, sys
id, k, r = sys.argv[1:]
if k == "absent" or r == "absent":
    print(f"{id}: key {k!r}, record {r!r}" + ("  orphan record: deleted by the next write of this identity" if k == "absent" and r != "absent" else ""))
    sys.exit()
ki, kf, kv = k.split(" ", 2); ri, rf, rv = r.split(" ", 2)
rec = json.loads(rv)
ok = ki == ri and rec["value"] == kv and (rec.get("until") or 0) == int(kf)
print(f"{id}: key {kv}@{ki} flags {kf}; record {rec['value']}@{ri} by {rec['by']} until {rec.get('until')}" + ("" if ok else "  (status flags it: changed outside / record says until)"))
PY
}
echo "== 1. two writers racing on one key, 40 rounds"
for i in $(seq 40); do
	WHO=alice w set be/race=drain -reason "A$i" & a=$!
	WHO=bob w set be/race=maint -reason "B$i" & b=$!
	wait $a $b
	WHO=carol w unset be/race
done
WHO=alice w set be/race=drain -reason A & a=$!
WHO=bob w set be/race=maint -reason B & b=$!
wait $a $b
check be/race
echo "== 2. a ramp killed (SIGKILL) mid-way, 5 times"
for t in 0.3 1.4 2.6 3.9 5.3; do
	w unset be/ramp
	USER=ramp "$BIN" ramp be/ramp -from 0% -to 100% -over 5s -steps 4 -then drain -for 1h -consul-addr "http://$KV" >/dev/null 2>&1 &
	pid=$!; sleep "$t"; kill -KILL $pid 2>/dev/null; wait $pid 2>/dev/null
	check be/ramp
done
echo "== 3. raw writes: put over a written key, put with -flags, delete the key, rewrite the record"
w set be/raw=drain -reason INC-1 -for 1h
curl -s -X PUT --data maint "http://$KV/v1/kv/$P/be/raw" >/dev/null; check be/raw
curl -s -X PUT --data drain "http://$KV/v1/kv/$P/be/raw?flags=1800000000" >/dev/null; check be/raw
w set be/forged=drain -reason INC-2
curl -s -X PUT --data '{"by":"mallory@x","when":1,"reason":"nothing to see","value":"drain","command":""}' "http://$KV/v1/kv/$M/be/forged" >/dev/null; check be/forged
w set be/gone=drain; curl -s -X DELETE "http://$KV/v1/kv/$P/be/gone" >/dev/null; check be/gone
w unset be/gone; check be/gone
echo "== 4. clocks: a writer whose clock is ahead (faketime, if installed)"
if command -v faketime >/dev/null; then
	faketime -f +1h "$BIN" set be/clock=drain -for 30m -consul-addr "http://$KV" >/dev/null 2>&1; check be/clock
else
	echo "faketime not installed: the record's when and until are the writer's clock (see status: 'ahead (writer's clock)')"
fi
sleep 1.5
echo "== status"
"$BIN" status -pprof-addr "$PPROF" -consul-addr "http://$KV"
