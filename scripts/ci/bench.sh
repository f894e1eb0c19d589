#!/usr/bin/env bash
# CI's bench job: runs `cargo bench` (harness = false benches) and keeps the
# report under target/bench-results/ for the job's artifacts. Benches may write
# their own files (JSON, say) into $BENCH_RESULTS_DIR.
set -euo pipefail
cd "$(dirname "$0")/../.."
export BENCH_RESULTS_DIR="${BENCH_RESULTS_DIR:-$PWD/target/bench-results}"
mkdir -p "$BENCH_RESULTS_DIR"
{
  printf 'commit: %s\n' "$(git rev-parse HEAD 2>/dev/null || echo unknown)"
  printf 'rustc: %s\n' "$(rustc --version)"
  printf 'cpu: %s\n' "$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | sed -n 1p)"
  printf 'cpus: %s\n' "$(nproc)"
} > "$BENCH_RESULTS_DIR/environment.txt"
cargo bench --locked "$@" 2>&1 | tee "$BENCH_RESULTS_DIR/cargo-bench.txt"
