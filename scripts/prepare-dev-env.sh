#!/usr/bin/env bash
# Installs what the tests need, on Debian or Ubuntu, after cloning (and what
# .ci/run installs on a clean CI machine: it calls this script):
#   - haproxy (Debian's) and openssl: the real-haproxy and TLS tests;
#   - prometheus and promtool, the binaries alone (scripts/install-prometheus.sh);
#   - zig (PyPI `ziglang`) and cargo-zigbuild (crates.io), at the versions
#     pinned in ci/versions.yml: the release build tests/it/release.rs runs;
#   - cargo-fuzz (crates.io, pinned likewise): scripts/fuzz.sh;
#   - py-consul (PyPI, pinned likewise): tests/it/py_consul.rs;
#   - node and npm (Debian's, when missing) and node-consul (npm, as
#     tests/it/node_consul/package-lock.json pins it, `npm ci` there):
#     tests/it/node_consul.rs.
# Idempotent: each is installed only when missing. Run as yourself: apt-get
# and the system-wide installs go through sudo when not root; cargo installs
# into your ~/.cargo, pip into your user site. Rust itself comes from
# https://rustup.rs (CI's version: RUST_VERSION in ci/versions.yml).
# --node-consul-only: node, npm and node-consul alone (the CI image has the
# rest).
#
#   scripts/prepare-dev-env.sh [--no-release-tools] [--no-fuzz] [--node-consul-only]
set -euo pipefail
cd "$(dirname "$0")/.."

release_tools=1 fuzz=1 node_consul_only=""
for arg in "$@"; do
  case "$arg" in
    --no-release-tools) release_tools="" ;;
    --no-fuzz) fuzz="" ;;
    --node-consul-only) node_consul_only=1 ;;
    *) sed -n '/^#   scripts\/prepare-dev-env.sh /p' "$0" | sed 's/^# *//; s/^/usage: /' >&2; exit 2 ;;
  esac
done

step() { printf '\n==> %s\n' "$*"; }
have() { printf '    ok: %s\n' "$*"; }
# Runs a quiet install with a progress line every 10 s, so that a minute of
# apt-get or cargo install is not silence; its output is shown if it fails.
progress() { # COMMAND...
  local log pid start rc
  log=$(mktemp) start=$SECONDS
  "$@" >"$log" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    if kill -0 "$pid" 2>/dev/null && (( (SECONDS - start) % 10 == 0 )); then
      printf '    ... %ss, still running: %s\n' "$((SECONDS - start))" "$*"
    fi
  done
  rc=0; wait "$pid" || rc=$?
  if [ "$rc" != 0 ]; then cat "$log" >&2; fi
  rm -f "$log"
  [ "$rc" = 0 ] && printf '    done in %ss\n' "$((SECONDS - start))"
  return "$rc"
}
as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}
pin() { # NAME: its value in ci/versions.yml
  sed -n "s/^ *$1: *\"\{0,1\}\([^\"]*\)\"\{0,1\} *\$/\1/p" ci/versions.yml
}

command -v apt-get >/dev/null 2>&1 || { echo "prepare-dev-env.sh: apt-get not found (Debian or Ubuntu only): install haproxy, openssl, prometheus, promtool, zig, cargo-zigbuild and cargo-fuzz by hand" >&2; exit 1; }
command -v cargo >/dev/null 2>&1 || { echo "prepare-dev-env.sh: cargo not found: install Rust from https://rustup.rs first" >&2; exit 1; }

export DEBIAN_FRONTEND=noninteractive
apt_updated=""
apt_install() { # PACKAGE...
  [ -n "$apt_updated" ] || { progress as_root apt-get update -qq; apt_updated=1; }
  progress as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"
}

# tests/it/node_consul.rs drives the dev KV with node-consul from npm,
# installed in tests/it/node_consul/ as its package-lock.json pins it; once
# there (at the pinned version) nothing is fetched again.
node_consul_pinned() {
  node -p 'require("./tests/it/node_consul/package-lock.json").packages["node_modules/consul"].version'
}
node_consul_installed() {
  node -p 'require("./tests/it/node_consul/node_modules/consul/package.json").version' 2>/dev/null
}
ensure_node_consul() {
  if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    step "apt-get install nodejs npm"
    apt_install nodejs npm
  else have node and npm; fi
  if [ "$(node_consul_installed)" != "$(node_consul_pinned)" ]; then
    step "npm ci in tests/it/node_consul (node-consul $(node_consul_pinned))"
    progress npm ci --prefix tests/it/node_consul --no-audit --no-fund
  else have node-consul; fi
}

if [ -n "$node_consul_only" ]; then
  ensure_node_consul
  echo "node $(node --version), node-consul $(node_consul_installed)"
  exit 0
fi

step "checking what is installed"
if ! command -v haproxy >/dev/null 2>&1 && [ ! -x /usr/sbin/haproxy ]; then
  step "apt-get install haproxy"
  apt_install haproxy
else have haproxy; fi
if ! command -v systemd-analyze >/dev/null 2>&1; then
  # tests/it/haproxy_reload.rs verifies the haproxy.service drop-in with it.
  step "apt-get install systemd (for systemd-analyze)"
  apt_install systemd
else have systemd-analyze; fi
if ! command -v openssl >/dev/null 2>&1; then
  # The TLS tests make their certificates with the openssl CLI.
  step "apt-get install openssl"
  apt_install openssl
else have openssl; fi
if ! python3 -c 'import yaml' >/dev/null 2>&1; then
  # tests/it/kubernetes.rs reads the Kubernetes example with PyYAML.
  step "apt-get install python3-yaml"
  apt_install python3-yaml
else have python3-yaml; fi
if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
  # The binaries alone: the prometheus package would also start a server.
  step "prometheus and promtool (from Debian's prometheus package, no server)"
  [ -n "$apt_updated" ] || { progress as_root apt-get update -qq; apt_updated=1; }
  progress as_root scripts/install-prometheus.sh /usr/local/bin
else have prometheus and promtool; fi

# Release builds (scripts/release.sh, which tests/it/release.rs runs) link with
# zig through cargo-zigbuild (glibc 2.17 symbols): ziglang from PyPI
# (cargo-zigbuild finds it as `python3 -m ziglang`), cargo-zigbuild from
# crates.io.
ensure_zigbuild() {
  local zig_pin zigbuild_pin pip
  zig_pin=$(pin ZIG_VERSION)
  zigbuild_pin=$(pin CARGO_ZIGBUILD_VERSION)
  if ! python3 -m ziglang version >/dev/null 2>&1 && ! zig version >/dev/null 2>&1; then
    step "pip install ziglang==$zig_pin"
    python3 -m pip --version >/dev/null 2>&1 || apt_install python3-pip
    pip=(python3 -m pip install --quiet --disable-pip-version-check "ziglang==$zig_pin")
    [ "$(id -u)" = 0 ] || pip+=(--user)
    # A Debian system Python refuses plain installs (PEP 668).
    progress sh -c '"$@" 2>/dev/null || "$@" --break-system-packages' sh "${pip[@]}"
  else have zig; fi
  if ! cargo zigbuild --help >/dev/null 2>&1; then
    step "cargo install --locked cargo-zigbuild@$zigbuild_pin (a few minutes: it compiles)"
    progress cargo install --locked --quiet --version "$zigbuild_pin" cargo-zigbuild
  else have cargo-zigbuild; fi
}

ensure_cargo_fuzz() {
  local fuzz_pin
  fuzz_pin=$(pin CARGO_FUZZ_VERSION)
  if ! cargo fuzz --help >/dev/null 2>&1; then
    step "cargo install --locked cargo-fuzz@$fuzz_pin (a few minutes: it compiles)"
    progress cargo install --locked --quiet --version "$fuzz_pin" cargo-fuzz
  else have cargo-fuzz; fi
}

# tests/it/py_consul.rs drives the dev KV with a consul client from PyPI.
ensure_py_consul() {
  local pip
  if ! python3 -c 'import consul' >/dev/null 2>&1; then
    step "pip install py-consul==$(pin PY_CONSUL_VERSION)"
    python3 -m pip --version >/dev/null 2>&1 || apt_install python3-pip
    pip=(python3 -m pip install --quiet --disable-pip-version-check "py-consul==$(pin PY_CONSUL_VERSION)")
    [ "$(id -u)" = 0 ] || pip+=(--user)
    # A Debian system Python refuses plain installs (PEP 668).
    progress sh -c '"$@" 2>/dev/null || "$@" --break-system-packages' sh "${pip[@]}"
  else have py-consul; fi
}


ensure_py_consul
ensure_node_consul
[ -z "$release_tools" ] || ensure_zigbuild
[ -z "$fuzz" ] || ensure_cargo_fuzz

step "ready"
export PATH="$PATH:/usr/sbin"
haproxy -v | sed -n 1p # sed reads it all: no SIGPIPE under pipefail
openssl version
promtool --version 2>&1 | sed -n 1p
prometheus --version 2>&1 | sed -n 1p
if [ -n "$release_tools" ]; then
  printf 'zig %s, ' "$(python3 -m ziglang version 2>/dev/null || zig version)"
  cargo-zigbuild --version 2>/dev/null || echo "cargo-zigbuild (cargo zigbuild)"
fi
[ -z "$fuzz" ] || cargo fuzz --version 2>/dev/null || echo "cargo-fuzz (cargo fuzz)"
python3 -c 'import importlib.metadata as m; print("py-consul", m.version("py-consul"))'
echo "node $(node --version), node-consul $(node_consul_installed)"
