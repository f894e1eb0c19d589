#!/usr/bin/env bash
# Builds the Linux release archives and their checksum file:
#
#   dist/gitlab-haproxy-agent_<version>_linux_<arch>.tar.gz   (one per target)
#   dist/gitlab-haproxy-agent_<version>_checksums.txt           (sha256sum format)
#
# Each archive holds one top-level directory of the same name with the binary,
# README.md and the docs/*.md it links, LICENSE, the systemd unit and the
# environment file.
#
# The binary is built with cargo-zigbuild against glibc 2.17 symbol versions
# (target x86_64-unknown-linux-gnu.2.17 and so on), so it runs on glibc 2.17
# and later (RHEL/CentOS 7+, Debian 8+, Ubuntu 14.04+) whatever the build
# machine's glibc; zig is the linker for every target, arm64 included. Needs
# zig (`pip install ziglang`) and cargo-zigbuild (`cargo install --locked
# cargo-zigbuild`), versions pinned in ci/versions.yml; installs nothing.
#
# The checksums file lists every archive of this version in the output
# directory, so building amd64 and arm64 in two runs lists both, and a
# rebuilt archive replaces its own line.
#
# The same sources give the same bytes wherever they are built (gitlab.com
# and the push mirror publish one release): build paths are remapped
# (the checkout to /build/src, CARGO_HOME to /build/cargo, the target
# directory to /build/target; the toolchain's own sources are /rustc/<hash>
# already), and the shipped binary carries no debug info (zig's linker
# drops the symbol table with it), so zig's install prefix, which the C
# objects' debug info names, is not in it either; a panic still prints its
# message and location. scripts/ci/reproducible.sh checks it.
#
# Usage: scripts/release.sh [--version V] [--target TRIPLE ...]
#
#   --version V   default: $CI_COMMIT_TAG without a leading "v", else Cargo.toml's
#   --target T    a Rust target triple, repeatable; default: this machine's host
#                 (x86_64-unknown-linux-gnu -> amd64, aarch64-unknown-linux-gnu -> arm64);
#                 built as T.2.17 (the glibc floor), which may also be given as is
#
# Environment: DIST_DIR (output directory, default dist), CARGO_TARGET_DIR,
# SOURCE_DATE_EPOCH (archive mtimes, default: the commit time of HEAD),
# GITLAB_HAPROXY_AGENT_BUILD_COMMIT (the commit -version prints, default: git).
# The version is handed to the build as GITLAB_HAPROXY_AGENT_VERSION so that
# `-version` prints it. CI calls this script and nothing else to build releases.
set -euo pipefail

die() { printf 'release.sh: %s\n' "$*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }

cd "$(dirname "$0")/.."
root=$PWD

version=""
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --version) [ $# -ge 2 ] || die "--version needs a value"; version=$2; shift 2 ;;
    --version=*) version=${1#--version=}; shift ;;
    --target) [ $# -ge 2 ] || die "--target needs a value"; targets+=("$2"); shift 2 ;;
    --target=*) targets+=("${1#--target=}"); shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument: $1 (see --help)" ;;
  esac
done

for tool in cargo rustc tar gzip sha256sum; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool not found on PATH"
done

name=gitlab-haproxy-agent
cargo_version=$(awk '
  /^\[/ { in_pkg = ($0 == "[package]") }
  in_pkg && /^version *=/ { gsub(/^version *= *"|".*$/, ""); print; exit }
' Cargo.toml)
[ -n "$cargo_version" ] || die "cannot read the package version from Cargo.toml"

if [ -z "$version" ] && [ -n "${CI_COMMIT_TAG:-}" ]; then
  version=${CI_COMMIT_TAG#v}
fi
version=${version:-$cargo_version}
# The version ends up in file names and in the version line: keep it plain.
[[ "$version" =~ ^[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}$ ]] \
  || die "invalid version \"$version\" (letters, digits and . + _ - only)"

host=$(rustc -vV | sed -n 's/^host: //p')
[ -n "$host" ] || die "cannot read the host triple from rustc -vV"
[ ${#targets[@]} -gt 0 ] || targets=("$host")

# The oldest glibc the release binary runs on: cargo-zigbuild links against
# this version's symbols (tests/it/release.rs checks the binary needs no newer).
glibc_floor=2.17

arch_of() {
  case "${1%.$glibc_floor}" in
    x86_64-unknown-linux-gnu) echo amd64 ;;
    aarch64-unknown-linux-gnu) echo arm64 ;;
    *) return 1 ;;
  esac
}
for t in "${targets[@]}"; do
  arch_of "$t" >/dev/null || die "unsupported target $t (x86_64-unknown-linux-gnu or aarch64-unknown-linux-gnu, optionally with the .$glibc_floor suffix)"
done

# The build tools, after the arguments (a bad argument is reported as such).
pin() { sed -n "s/^ *$1: *\"\{0,1\}\([^\"]*\)\"\{0,1\} *\$/\1/p" ci/versions.yml 2>/dev/null; }
zig_pin=$(pin ZIG_VERSION); zigbuild_pin=$(pin CARGO_ZIGBUILD_VERSION)
cargo zigbuild --help >/dev/null 2>&1 \
  || die "cargo-zigbuild not found: cargo install --locked cargo-zigbuild${zigbuild_pin:+ --version $zigbuild_pin} (and zig: pip install ziglang${zig_pin:+==$zig_pin})"
# Where cargo-zigbuild looks: python3 -m ziglang first, then zig on PATH.
"${CARGO_ZIGBUILD_PYTHON_PATH:-python3}" -m ziglang version >/dev/null 2>&1 \
  || "${CARGO_ZIGBUILD_ZIG_PATH:-zig}" version >/dev/null 2>&1 \
  || die "zig not found (cargo-zigbuild links with it): pip install ziglang${zig_pin:+==$zig_pin}"

if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
  SOURCE_DATE_EPOCH=$(git -C "$root" log -1 --format=%ct 2>/dev/null) \
    || die "not a git checkout: set SOURCE_DATE_EPOCH"
fi
[[ "$SOURCE_DATE_EPOCH" =~ ^[0-9]+$ ]] || die "SOURCE_DATE_EPOCH must be seconds since the epoch"
export SOURCE_DATE_EPOCH

for f in README.md LICENSE packaging/$name.service packaging/$name.env packaging/haproxy.service.d/$name.conf; do
  [ -f "$f" ] || die "$f is missing (every archive ships it)"
done

dist=${DIST_DIR:-dist}
mkdir -p "$dist"
dist=$(cd "$dist" && pwd)
target_dir=${CARGO_TARGET_DIR:-target}
mkdir -p "$target_dir"
target_abs=$(cd "$target_dir" && pwd)
cargo_home=${CARGO_HOME:-$HOME/.cargo}
# The shipped binary's bytes must not depend on where it was built.
export RUSTFLAGS="${RUSTFLAGS:+$RUSTFLAGS }--remap-path-prefix=$root=/build/src --remap-path-prefix=$cargo_home=/build/cargo --remap-path-prefix=$target_abs=/build/target"
export CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_STRIP=debuginfo
stage=$(mktemp -d "${TMPDIR:-/tmp}/$name-release.XXXXXX")
trap 'rm -rf "$stage"' EXIT

archives=()
for t in "${targets[@]}"; do
  arch=$(arch_of "$t")
  t=${t%.$glibc_floor}
  if [ "$t" != "$host" ] && command -v rustup >/dev/null 2>&1 \
    && ! rustup target list --installed | grep -qx "$t"; then
    die "Rust target $t is not installed (rustup target add $t)"
  fi
  # cargo-zigbuild leaves a linker or C compiler set in the environment in
  # place (the old CI image set one for arm64): that would link against the
  # build machine's glibc, so zig must be the only one.
  t_env=${t//-/_}
  unset "CARGO_TARGET_${t_env^^}_LINKER" "CC_$t_env" "CXX_$t_env"

  printf '==> %s %s for %s.%s (%s)\n' "$name" "$version" "$t" "$glibc_floor" "$arch"
  GITLAB_HAPROXY_AGENT_VERSION=$version cargo zigbuild --release --locked --target "$t.$glibc_floor" \
    || die "cargo zigbuild for $t.$glibc_floor failed"

  dir="${name}_${version}_linux_${arch}"
  mkdir -p "$stage/$dir/packaging/haproxy.service.d" "$stage/$dir/docs"
  install -m 0755 "$target_dir/$t/release/$name" "$stage/$dir/$name"
  install -m 0644 README.md LICENSE "$stage/$dir/"
  # The pages README.md links (its images stay in the repository).
  install -m 0644 docs/*.md "$stage/$dir/docs/"
  install -m 0644 "packaging/$name.service" "packaging/$name.env" "$stage/$dir/packaging/"
  install -m 0644 "packaging/haproxy.service.d/$name.conf" "$stage/$dir/packaging/haproxy.service.d/"

  tar -C "$stage" --sort=name --owner=0 --group=0 --numeric-owner \
      --mode=u+rwX,go+rX,go-w --mtime="@$SOURCE_DATE_EPOCH" --format=gnu -cf - "$dir" \
    | gzip -9 -n > "$stage/$dir.tar.gz"
  mv "$stage/$dir.tar.gz" "$dist/$dir.tar.gz"
  archives+=("$dir.tar.gz")
done

# One line per archive of this version in the output directory (this run's
# and earlier runs' for other targets), sorted, in sha256sum's own format; the
# file is replaced whole, so another version's lines never linger in it. Its
# name holds the version (goreleaser's), so a download cache never mixes two.
sums=${name}_${version}_checksums.txt
(
  cd "$dist"
  shopt -s nullglob
  all=("${name}_${version}_linux_"*.tar.gz)
  sha256sum "${all[@]}" > "$sums.tmp"
  mv "$sums.tmp" "$sums"
) || die "cannot write $dist/$sums"

printf '==> wrote\n'
for a in "${archives[@]}" "$sums"; do printf '  %s\n' "$dist/$a"; done
