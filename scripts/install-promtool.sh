#!/usr/bin/env bash
# Installs promtool alone (the tests check the metrics exposition with it),
# taken from Debian's `prometheus` package without installing the package:
# `apt-get install prometheus` would also install and start a Prometheus
# server. Needs apt-get and dpkg-deb (Debian, Ubuntu).
#
#   scripts/install-promtool.sh [DIR]     default DIR: /usr/local/bin
set -euo pipefail
dir=${1:-/usr/local/bin}
command -v apt-get >/dev/null 2>&1 || { echo "install-promtool.sh: apt-get not found: get promtool from https://prometheus.io/download/ and put it on PATH" >&2; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/promtool.XXXXXX")
trap 'rm -rf "$work"' EXIT
chmod 777 "$work" # apt fetches as the _apt user
(cd "$work" && apt-get download -qq prometheus >/dev/null)
dpkg-deb -x "$work"/prometheus_*.deb "$work/root"
install -D -m 0755 "$work/root/usr/bin/promtool" "$dir/promtool"
"$dir/promtool" --version 2>&1 | sed -n 1p
