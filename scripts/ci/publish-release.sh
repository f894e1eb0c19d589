#!/usr/bin/env bash
# Publishes what scripts/release.sh and scripts/ci/sign-checksums.sh left in
# dist/ for the tag being built (the archives, the versioned checksums file
# and its signature): uploads every file to the project's generic package
# registry, then creates
# the GitLab release for the tag with links to those files. Uses only the
# job token and the API of the instance running the pipeline ($CI_API_V4_URL),
# so the push mirror publishes the same release on its own.
#
# Usage (in a tag pipeline): scripts/ci/publish-release.sh [DIST_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."

die() { printf 'publish-release.sh: %s\n' "$*" >&2; exit 1; }
for v in CI_API_V4_URL CI_PROJECT_ID CI_JOB_TOKEN CI_COMMIT_TAG; do
  [ -n "${!v:-}" ] || die "$v is not set (run in a GitLab tag pipeline)"
done
command -v curl >/dev/null 2>&1 || die "curl not found on PATH"

dist=${1:-${DIST_DIR:-dist}}
tag=$CI_COMMIT_TAG
version=${tag#v}
# Both go into URLs and JSON unescaped: keep them plain.
[[ "$tag" =~ ^[0-9A-Za-z][0-9A-Za-z.+_-]*$ ]] || die "unsupported tag name \"$tag\""
sums=gitlab-haproxy-agent_${version}_checksums.txt
[ -f "$dist/$sums" ] || die "$dist/$sums is missing: run scripts/release.sh first"
[ -f "$dist/$sums.sig" ] || die "$dist/$sums.sig is missing: run scripts/ci/sign-checksums.sh first"

files=()
while read -r _sum file; do
  [ -f "$dist/$file" ] || die "$dist/$sums names $file, which is missing"
  files+=("$file")
done < "$dist/$sums"
[ ${#files[@]} -gt 0 ] || die "$dist/$sums lists no archive"
(cd "$dist" && sha256sum --check --strict "$sums") || die "checksums do not match $dist"
files+=("$sums" "$sums.sig")

package_url="$CI_API_V4_URL/projects/$CI_PROJECT_ID/packages/generic/gitlab-haproxy-agent/$version"
links=""
for f in "${files[@]}"; do
  printf '==> uploading %s\n' "$f"
  curl --silent --show-error --fail-with-body --retry 3 \
       --header "JOB-TOKEN: $CI_JOB_TOKEN" \
       --upload-file "$dist/$f" "$package_url/$f" >/dev/null \
    || die "upload of $f to the package registry failed"
  links+="${links:+,}{\"name\":\"$f\",\"url\":\"$package_url/$f\",\"direct_asset_path\":\"/$f\",\"link_type\":\"package\"}"
done

description="gitlab-haproxy-agent $version\\n\\nsha256:\\n\\n\`\`\`"
while read -r line; do description+="\\n$line"; done < "$dist/$sums"
description+="\\n\`\`\`"
body="{\"name\":\"$tag\",\"tag_name\":\"$tag\",\"description\":\"$description\",\"assets\":{\"links\":[$links]}}"

printf '==> creating release %s\n' "$tag"
status=$(curl --silent --show-error --output /tmp/release-response.json --write-out '%{http_code}' \
  --header "JOB-TOKEN: $CI_JOB_TOKEN" --header "Content-Type: application/json" \
  --data "$body" "$CI_API_V4_URL/projects/$CI_PROJECT_ID/releases") \
  || die "cannot reach $CI_API_V4_URL"
case "$status" in
  201) printf '==> release %s created\n' "$tag" ;;
  409) printf '==> release %s already exists; its links point at the files just uploaded\n' "$tag" ;;
  *) cat /tmp/release-response.json >&2; echo >&2; die "creating release $tag failed: HTTP $status" ;;
esac
