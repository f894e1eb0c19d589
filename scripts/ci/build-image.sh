#!/usr/bin/env bash
# Builds a Dockerfile with buildah (no Docker daemon, no privileges) and pushes
# it to the project's own container registry, whichever GitLab instance runs
# the pipeline ($CI_REGISTRY: gitlab.com or the ops push mirror alike).
#
# Usage: scripts/ci/build-image.sh DOCKERFILE IMAGE:TAG [--also IMAGE:TAG ...] [-- BUILDAH-BUILD-ARGS...]
set -euo pipefail
cd "$(dirname "$0")/../.."

die() { printf 'build-image.sh: %s\n' "$*" >&2; exit 1; }
[ $# -ge 2 ] || die "usage: build-image.sh DOCKERFILE IMAGE:TAG [--also IMAGE:TAG ...] [-- BUILD-ARGS...]"
dockerfile=$1 image=$2
shift 2
extra=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  case "$1" in
    --also) [ $# -ge 2 ] || die "--also needs an image"; extra+=("$2"); shift 2 ;;
    *) die "unknown argument: $1" ;;
  esac
done
[ "${1:-}" = "--" ] && shift
[ -f "$dockerfile" ] || die "$dockerfile is missing"
command -v buildah >/dev/null 2>&1 || die "buildah not found on PATH"
for v in CI_REGISTRY CI_REGISTRY_USER CI_REGISTRY_PASSWORD; do
  [ -n "${!v:-}" ] || die "$v is not set (run in GitLab CI or export it)"
done

printf '%s\n' "$CI_REGISTRY_PASSWORD" | buildah login --username "$CI_REGISTRY_USER" --password-stdin "$CI_REGISTRY"
buildah build --file "$dockerfile" --tag "$image" "$@" .
buildah push "$image"
for e in "${extra[@]}"; do
  buildah tag "$image" "$e"
  buildah push "$e"
done
