#!/usr/bin/env bash
# Builds and pushes the release image, $CI_REGISTRY_IMAGE:<tag>, for
# linux/amd64 and linux/arm64 as one manifest list, from the binaries of the
# release archives in DIST_DIR (Dockerfile.release: COPY only, nothing
# compiled), so the image runs the very bytes the archives and their signed
# checksums hold. Prints the pushed digest.
#
# Usage (in a tag pipeline, after release-archives): scripts/ci/release-image.sh [DIST_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."

die() { printf 'release-image.sh: %s\n' "$*" >&2; exit 1; }
for v in CI_REGISTRY CI_REGISTRY_USER CI_REGISTRY_PASSWORD CI_REGISTRY_IMAGE CI_COMMIT_TAG CI_COMMIT_SHA; do
  [ -n "${!v:-}" ] || die "$v is not set (run in a GitLab tag pipeline)"
done
command -v buildah >/dev/null 2>&1 || die "buildah not found on PATH"
dist=${1:-${DIST_DIR:-dist}}
version=${CI_COMMIT_TAG#v}
image=$CI_REGISTRY_IMAGE:$CI_COMMIT_TAG
sums=$dist/gitlab-haproxy-agent_${version}_checksums.txt
[ -f "$sums" ] || die "$sums is missing: run scripts/release.sh first"
(cd "$dist" && sha256sum --check --strict "${sums##*/}") || die "the archives in $dist do not match $sums"

context=$(mktemp -d "${TMPDIR:-/tmp}/gha-image.XXXXXX")
trap 'rm -rf "$context"' EXIT
# The image's mtimes and creation date: the tag's commit time (the
# buildah image may have no git: GitLab's CI_COMMIT_TIMESTAMP).
epoch=${SOURCE_DATE_EPOCH:-$(date -d "${CI_COMMIT_TIMESTAMP:-@0}" +%s)} \
  || die "cannot read CI_COMMIT_TIMESTAMP=${CI_COMMIT_TIMESTAMP:-}"

printf '%s\n' "$CI_REGISTRY_PASSWORD" | buildah login --username "$CI_REGISTRY_USER" --password-stdin "$CI_REGISTRY"
buildah manifest rm "$image" >/dev/null 2>&1 || true
buildah manifest create "$image"
for arch in amd64 arm64; do
  archive=gitlab-haproxy-agent_${version}_linux_${arch}
  [ -f "$dist/$archive.tar.gz" ] || die "$dist/$archive.tar.gz is missing"
  mkdir -p "$context/$arch"
  tar -xzf "$dist/$archive.tar.gz" -C "$context/$arch" --strip-components=1 "$archive/gitlab-haproxy-agent"
  buildah build --file Dockerfile.release --platform "linux/$arch" --manifest "$image" \
    --timestamp "$epoch" \
    --build-arg "GITLAB_HAPROXY_AGENT_VERSION=$version" \
    --build-arg "GITLAB_HAPROXY_AGENT_BUILD_COMMIT=$CI_COMMIT_SHA" \
    --build-arg "GITLAB_HAPROXY_AGENT_SOURCE=${CI_PROJECT_URL:-}" \
    "$context"
done
buildah manifest push --all --digestfile "$context/digest" "$image" "docker://$image"
printf '==> pushed %s@%s (linux/amd64, linux/arm64)\n' "$image" "$(cat "$context/digest")"
