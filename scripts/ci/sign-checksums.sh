#!/usr/bin/env bash
# Signs the release's checksums file, DIST_DIR/gitlab-haproxy-agent_<version>_checksums.txt,
# with the project's release key: writes <that file>.sig, an Ed25519
# signature (deterministic: gitlab.com and the push mirror, holding the same
# key, publish the same signature bytes), then verifies it against the
# public key committed in the repository, so a wrong key fails the release.
#
# Usage: scripts/ci/sign-checksums.sh [DIST_DIR]   (default: $DIST_DIR, else dist)
#
# Environment:
#   RELEASE_SIGNING_KEY         path of the PEM Ed25519 private key (a GitLab CI
#                               variable of type File, protected and masked,
#                               the same on both instances)
#   RELEASE_SIGNING_PUBLIC_KEY  default: packaging/release-signing.pub.pem of this checkout
#
# Verify a download (OpenSSL 3):
#   openssl pkeyutl -verify -pubin -inkey release-signing.pub.pem -rawin \
#     -in gitlab-haproxy-agent_<v>_checksums.txt -sigfile gitlab-haproxy-agent_<v>_checksums.txt.sig
#
# Making the key (once, docs/install.md "Release signing key"):
#   openssl genpkey -algorithm ed25519 -out release-signing.pem
#   openssl pkey -in release-signing.pem -pubout -out packaging/release-signing.pub.pem
set -euo pipefail

die() { printf 'sign-checksums.sh: %s\n' "$*" >&2; exit 1; }
dist=${1:-${DIST_DIR:-dist}}
command -v openssl >/dev/null 2>&1 || die "openssl not found on PATH"
key=${RELEASE_SIGNING_KEY:-}
public=${RELEASE_SIGNING_PUBLIC_KEY:-$(dirname "$0")/../../packaging/release-signing.pub.pem}
[ -n "$key" ] || die "RELEASE_SIGNING_KEY is not set (a File variable holding the release's Ed25519 private key)"
[ -f "$key" ] || die "RELEASE_SIGNING_KEY names $key, which is not a file"
[ -f "$public" ] || die "$public is missing: commit the public half of the release key"

shopt -s nullglob
sums=("$dist"/gitlab-haproxy-agent_*_checksums.txt)
[ ${#sums[@]} -eq 1 ] || die "expected one gitlab-haproxy-agent_<version>_checksums.txt in $dist, found ${#sums[@]}"
file=${sums[0]}
openssl pkeyutl -sign -inkey "$key" -rawin -in "$file" -out "$file.sig.tmp" 2>/dev/null \
  || { rm -f "$file.sig.tmp"; die "cannot sign $file with $key (an Ed25519 PEM private key?)"; }
openssl pkeyutl -verify -pubin -inkey "$public" -rawin -in "$file" -sigfile "$file.sig.tmp" >/dev/null 2>&1 \
  || { rm -f "$file.sig.tmp"; die "the signature does not verify with $public: RELEASE_SIGNING_KEY is not the release key"; }
mv "$file.sig.tmp" "$file.sig"
printf '==> signed %s\n' "$file.sig"
