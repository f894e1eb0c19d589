#!/usr/bin/env bash
# The test command: the whole suite, unit tests and integration tests
# against real haproxy and the consul stand-in (or a real consul when
# CONSUL_BIN or PATH has one); benches are compiled by clippy --all-targets
# in CI. The two halves alone (what mise.toml's tasks run):
#
#   scripts/test.sh [unit|integration] [CARGO TEST ARGS...]
#
#   unit          the unit tests beside the code: cargo test --lib
#   integration   the integration tests: cargo test --test it (one target,
#                 tests/it/, one module a topic);
#                 one topic: scripts/test.sh integration --test it -- haproxy::
#   (neither)     cargo test: both, and the doc tests
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/sbin"
case "${1:-}" in
  unit) shift; exec cargo test --lib "$@" ;;
  integration) shift; exec cargo test --test it "$@" ;;
  *) exec cargo test "$@" ;;
esac
