#!/usr/bin/env bash
# The CI image's tag: the first 16 hex digits of the sha256 of ci/versions.yml
# (less its TEST_IMAGE_TAG line) and ci/test-image.Dockerfile, so any pin or
# Dockerfile change names a new image.
#
# Usage: scripts/ci/test-image-tag.sh           print the tag
#        scripts/ci/test-image-tag.sh --check   fail unless ci/versions.yml records it
#        scripts/ci/test-image-tag.sh --write   record it in ci/versions.yml
set -euo pipefail
cd "$(dirname "$0")/../.."

pins=ci/versions.yml
dockerfile=ci/test-image.Dockerfile
for f in "$pins" "$dockerfile"; do
  [ -f "$f" ] || { echo "test-image-tag.sh: $f is missing" >&2; exit 1; }
done

tag=$({ grep -v '^ *TEST_IMAGE_TAG:' "$pins"; cat "$dockerfile"; } | sha256sum | cut -c1-16)
recorded=$(sed -n 's/^ *TEST_IMAGE_TAG: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' "$pins")

case "${1:-}" in
  "") echo "$tag" ;;
  --check)
    if [ "$recorded" != "$tag" ]; then
      echo "test-image-tag.sh: $pins records TEST_IMAGE_TAG \"$recorded\" but the pins hash to \"$tag\": run scripts/ci/test-image-tag.sh --write" >&2
      exit 1
    fi ;;
  --write)
    grep -q '^ *TEST_IMAGE_TAG:' "$pins" || { echo "test-image-tag.sh: no TEST_IMAGE_TAG line in $pins" >&2; exit 1; }
    sed -i "s/^\( *TEST_IMAGE_TAG:\).*/\1 \"$tag\"/" "$pins"
    echo "$tag" ;;
  *) echo "test-image-tag.sh: unknown argument $1 (none, --check or --write)" >&2; exit 2 ;;
esac
