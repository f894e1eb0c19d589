#!/usr/bin/env bash
# Proves that a tag gives the same bytes wherever it is built (gitlab.com and
# the push mirror publish one release, and a checksum pinned from one must
# hold for the other): builds this checkout's release archive twice with
# scripts/release.sh, from two copies of the sources at different paths,
# with different CARGO_HOME and target directories, then compares the
# archives byte for byte and prints both sha256.
#
# Usage: scripts/ci/reproducible.sh [--target TRIPLE]   (default: this host)
#
# The copies are the tracked and untracked-but-not-ignored files of the
# working tree (so a local change is what is checked). Each CARGO_HOME gets
# a copy of this one's registry (index and downloaded crates), so the second
# build downloads nothing again. Needs what scripts/release.sh needs.
# Exit 0: identical; 1: different (the differing archive members are
# listed), or a build failed.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD

die() { printf 'reproducible.sh: %s\n' "$*" >&2; exit 1; }
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --target) [ $# -ge 2 ] || die "--target needs a value"; targets+=(--target "$2"); shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) die "unknown argument: $1 (see --help)" ;;
  esac
done

version=0.0.0-repro
epoch=$(git log -1 --format=%ct 2>/dev/null || echo 1700000000)
commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
home=${CARGO_HOME:-$HOME/.cargo}
work=$(mktemp -d "${TMPDIR:-/tmp}/gha-repro.XXXXXX")
trap 'rm -rf "$work"' EXIT

# Two layouts that share no path: different depths and names.
srcs=("$work/a/src" "$work/bb/deeper/checkout")
# Both copies first, from one snapshot of the tree: an edit made while the
# first build runs must not make the two differ.
git ls-files -z --cached --others --exclude-standard \
  | tar --null -T - --ignore-failed-read -cf "$work/tree.tar" 2>/dev/null
for i in 0 1; do
  src=${srcs[$i]}
  run=$(dirname "$src")
  mkdir -p "$src" "$run/cargo-home-$i"
  tar -C "$src" -xf "$work/tree.tar"
  for d in registry/index registry/cache; do
    [ -d "$home/$d" ] && mkdir -p "$run/cargo-home-$i/$d" && cp -a "$home/$d/." "$run/cargo-home-$i/$d/"
  done
done
for i in 0 1; do
  src=${srcs[$i]}
  run=$(dirname "$src")
  printf '==> build %d in %s\n' "$((i + 1))" "$src"
  (cd "$src" && CARGO_HOME="$run/cargo-home-$i" CARGO_TARGET_DIR="$run/target-$i" \
      DIST_DIR="$run/dist" SOURCE_DATE_EPOCH="$epoch" GITLAB_HAPROXY_AGENT_BUILD_COMMIT="$commit" \
      scripts/release.sh --version "$version" "${targets[@]}") || die "build $((i + 1)) failed"
done

dists=("$(dirname "${srcs[0]}")/dist" "$(dirname "${srcs[1]}")/dist")
sums=gitlab-haproxy-agent_${version}_checksums.txt
printf '==> sha256, build 1 (%s):\n' "${srcs[0]}"; cat "${dists[0]}/$sums"
printf '==> sha256, build 2 (%s):\n' "${srcs[1]}"; cat "${dists[1]}/$sums"
if cmp -s "${dists[0]}/$sums" "${dists[1]}/$sums"; then
  printf '==> identical\n'
  exit 0
fi
# Which members differ, and whether a build path is to blame.
while read -r _ archive; do
  for i in 0 1; do mkdir -p "$work/x$i" && tar -C "$work/x$i" -xzf "${dists[$i]}/$archive"; done
done < "${dists[0]}/$sums"
diff -rq "$work/x0" "$work/x1" >&2 || true
for i in 0 1; do
  n=$(find "$work/x$i" -type f -name gitlab-haproxy-agent -exec strings {} + | grep -c "$work" || true)
  printf 'build %d: %s strings name its build directory\n' "$((i + 1))" "$n" >&2
done
die "the two builds differ"
