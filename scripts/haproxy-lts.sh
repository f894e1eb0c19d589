#!/usr/bin/env bash
# Build an upstream haproxy from its source tarball, once, and print the
# binary's path on stdout (the only line printed there):
#
#   scripts/haproxy-lts.sh [TARBALL]
#   HAPROXY_BIN=$(scripts/haproxy-lts.sh) cargo test --test it -- haproxy::
#
# TARBALL defaults to ../shared/haproxy/haproxy-3.0.11.tar.gz (relative to the
# repository root). The build goes to target/haproxy-<version>/haproxy and is
# reused while that binary runs; `make TARGET=linux-glibc` needs no library
# beyond libc (no OpenSSL, Lua, PCRE); USE_PROMEX=1 adds haproxy's own Prometheus
# exporter (`http-request use-service prometheus-exporter`). The build is quiet (its log is
# target/haproxy-<version>.log, whose tail is printed on failure) and bounded
# by HAPROXY_BUILD_TIMEOUT seconds (default 900). Exit codes: 0 built or
# reused, 1 build failed, 3 tarball missing.
set -euo pipefail
# A TARBALL argument is relative to the caller's directory, the default to
# the repository root.
if [ $# -gt 0 ] && [ -f "$1" ]; then
  tarball=$(realpath "$1")
else
  tarball=${1:-../shared/haproxy/haproxy-3.0.11.tar.gz}
fi
cd "$(dirname "$0")/.."
root=$PWD

if [ ! -f "$tarball" ]; then
  echo "haproxy-lts: $tarball not found" >&2
  exit 3
fi
name=$(basename "$tarball" .tar.gz) # haproxy-3.0.11
case "$name" in
  haproxy-[0-9]*) ;;
  *) echo "haproxy-lts: $tarball is not named haproxy-<version>.tar.gz" >&2; exit 1 ;;
esac
version=${name#haproxy-}
dir="$root/target/$name"
bin="$dir/haproxy"
log="$root/target/$name.log"

# `haproxy -v` starts "HAProxy version 3.0.11-9e587df 2025/06/02 ...".
is_built() {
  local out
  out=$("$bin" -v 2>/dev/null) || return 1
  case "$out" in
    *"version $version-"* | *"version $version "*) return 0 ;;
    *) return 1 ;;
  esac
}
if [ -x "$bin" ] && is_built; then
  echo "$bin"
  exit 0
fi

mkdir -p "$root/target"
rm -rf "$dir"
tar -xzf "$tarball" -C "$root/target"
if [ ! -f "$dir/Makefile" ]; then
  echo "haproxy-lts: $tarball did not unpack to target/$name" >&2
  exit 1
fi

jobs=$(nproc 2>/dev/null || echo 2)
start=$(date +%s)
echo "haproxy-lts: building haproxy $version (make -j$jobs TARGET=linux-glibc USE_PROMEX=1; log: target/$name.log)" >&2
limit=${HAPROXY_BUILD_TIMEOUT:-900}
rc=0
timeout "$limit" nice make -C "$dir" -j"$jobs" TARGET=linux-glibc USE_PROMEX=1 >"$log" 2>&1 || rc=$?
if [ "$rc" -ne 0 ] || ! is_built; then
  why="failed (make exit $rc)"
  [ "$rc" -eq 124 ] && why="timed out after $limit s (HAPROXY_BUILD_TIMEOUT)"
  [ "$rc" -eq 0 ] && why="made no haproxy $version binary"
  echo "haproxy-lts: build of haproxy $version $why; last lines of target/$name.log:" >&2
  tail -n 30 "$log" >&2
  rm -f "$bin"
  exit 1
fi
echo "haproxy-lts: built haproxy $version in $(($(date +%s) - start)) s" >&2
echo "$bin"
