#!/usr/bin/env bash
# Installs the `prometheus` and `promtool` binaries alone, taken from
# Debian's `prometheus` package without installing the package: `apt-get
# install prometheus` would also start a Prometheus server as a service.
# The tests check the metrics exposition and the rules in monitoring/ with
# promtool, and run their own Prometheus server (tests/it/prometheus.rs).
# Needs apt-get and dpkg-deb (Debian, Ubuntu).
#
#   scripts/install-prometheus.sh [DIR]     default DIR: /usr/local/bin
set -euo pipefail
dir=${1:-/usr/local/bin}
command -v apt-get >/dev/null 2>&1 || { echo "install-prometheus.sh: apt-get not found: get prometheus and promtool from https://prometheus.io/download/ and put them on PATH" >&2; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/prometheus.XXXXXX")
trap 'rm -rf "$work"' EXIT
chmod 777 "$work" # apt fetches as the _apt user
(cd "$work" && apt-get download -qq prometheus >/dev/null)
dpkg-deb -x "$work"/prometheus_*.deb "$work/root"
for bin in prometheus promtool; do
  install -D -m 0755 "$work/root/usr/bin/$bin" "$dir/$bin"
  "$dir/$bin" --version 2>&1 | sed -n 1p
done
