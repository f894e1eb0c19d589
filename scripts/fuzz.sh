#!/usr/bin/env bash
# Bounded fuzzing of every parser that sees outside bytes (cargo-fuzz crate
# in fuzz/, targets in fuzz/fuzz_targets/).
#
#   scripts/fuzz.sh smoke              replay, then every target FUZZ_SECONDS (30) each
#   scripts/fuzz.sh run TARGET [SECS]  one target, SECS (default FUZZ_SECONDS) seconds
#   scripts/fuzz.sh replay [TARGET]    run the committed corpus and artifacts once, no fuzzing
#   scripts/fuzz.sh list               the targets
#
# New inputs go to a scratch corpus (FUZZ_SCRATCH, default a fresh temp
# dir); the committed fuzz/corpus/<target>/ is only read. A crash, timeout
# (FUZZ_TIMEOUT, 10 s per input) or out-of-memory leaves its input in
# fuzz/artifacts/<target>/ and makes the script exit non-zero. Commit that
# file (or better, a unit test next to the parser, named for the bug) as the
# regression: every committed artifact is replayed by `smoke` and `replay`.
#
# This toolchain is stable: cargo-fuzz needs RUSTC_BOOTSTRAP=1 for its
# nightly-only flags (-Zsanitizer).
set -euo pipefail
cd "$(dirname "$0")/.."
export RUSTC_BOOTSTRAP=1
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

SECONDS_EACH="${FUZZ_SECONDS:-30}"
TIMEOUT="${FUZZ_TIMEOUT:-10}"

usage() {
  sed -n '5,8p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

ensure_cargo_fuzz() {
  if ! cargo fuzz --help >/dev/null 2>&1; then
    echo "cargo-fuzz missing: cargo install cargo-fuzz --locked" >&2
    cargo install cargo-fuzz --locked
  fi
}

targets() {
  (cd fuzz && cargo fuzz list)
}

scratch_dir() {
  if [ -n "${FUZZ_SCRATCH:-}" ]; then
    mkdir -p "$FUZZ_SCRATCH/$1"
    echo "$FUZZ_SCRATCH/$1"
  else
    mktemp -d "${TMPDIR:-/tmp}/fuzz-$1.XXXXXX"
  fi
}

# Runs the committed inputs of one target once each (seeds and artifacts).
replay() {
  local t=$1 inputs=()
  shopt -s nullglob
  inputs=(fuzz/corpus/"$t"/* fuzz/artifacts/"$t"/*)
  shopt -u nullglob
  [ ${#inputs[@]} -gt 0 ] || return 0
  local log
  log=$(mktemp "${TMPDIR:-/tmp}/fuzz-replay-$t.XXXXXX")
  if cargo fuzz run "$t" "${inputs[@]}" -- -timeout="$TIMEOUT" >"$log" 2>&1; then
    echo "replay $t: ${#inputs[@]} inputs ok"
    rm -f "$log"
  else
    tail -n 60 "$log" >&2
    echo "replay $t: FAILED (log: $log)" >&2
    return 1
  fi
}

# Fuzzes one target for $2 seconds; prints libFuzzer's last status line.
fuzz_one() {
  local t=$1 secs=$2 scratch log
  scratch=$(scratch_dir "$t")
  log="$scratch.log"
  echo "fuzz $t: ${secs}s, scratch corpus $scratch"
  if cargo fuzz run "$t" "$scratch" "fuzz/corpus/$t" -- \
    -max_total_time="$secs" -timeout="$TIMEOUT" -print_final_stats=1 >"$log" 2>&1; then
    grep -E '^#[0-9]+' "$log" | tail -n 1
    grep -E '^stat::(number_of_executed_units|average_exec_per_sec)' "$log" || true
    # A scratch corpus of our own is thrown away; a named one is kept.
    [ -n "${FUZZ_SCRATCH:-}" ] || rm -rf "$scratch" "$log"
  else
    tail -n 80 "$log" >&2
    echo "fuzz $t: FINDING (log: $log; input in fuzz/artifacts/$t/)" >&2
    return 1
  fi
}

cmd="${1:-}"
case "$cmd" in
  list)
    ensure_cargo_fuzz
    targets
    ;;
  replay)
    ensure_cargo_fuzz
    failed=0
    for t in ${2:-$(targets)}; do
      replay "$t" || failed=1
    done
    exit "$failed"
    ;;
  run)
    [ $# -ge 2 ] || usage
    ensure_cargo_fuzz
    replay "$2"
    fuzz_one "$2" "${3:-$SECONDS_EACH}"
    ;;
  smoke)
    ensure_cargo_fuzz
    (cd fuzz && cargo fuzz build)
    failed=()
    for t in $(targets); do
      if ! replay "$t" || ! fuzz_one "$t" "$SECONDS_EACH"; then
        failed+=("$t")
      fi
    done
    if [ ${#failed[@]} -gt 0 ]; then
      echo "fuzz smoke: findings in ${failed[*]}" >&2
      exit 1
    fi
    echo "fuzz smoke: every target ran ${SECONDS_EACH}s with no finding"
    ;;
  *)
    usage
    ;;
esac
