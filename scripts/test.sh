#!/usr/bin/env bash
# The test command: unit tests, integration tests against real haproxy and
# the consul stand-in (or a real consul when CONSUL_BIN or PATH has one),
# (benches are compiled by clippy --all-targets in CI).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/sbin"
cargo test "$@"
