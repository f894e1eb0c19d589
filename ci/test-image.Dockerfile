# The CI image: Rust (stable with rustfmt and clippy, the arm64 target, a
# pinned nightly with cargo-fuzz), zig and cargo-zigbuild for the release
# builds (glibc 2.17 symbols, both architectures: no cross gcc), haproxy from
# Debian and a real consul for the integration tests, promtool for the
# metrics check.
# Versions come from ci/versions.yml as build arguments; the defaults below
# equal them (tests/ci_config.rs checks).
ARG RUST_VERSION=1.95.0
ARG CONSUL_VERSION=1.21.2

FROM hashicorp/consul:${CONSUL_VERSION} AS consul

FROM rust:${RUST_VERSION}-bookworm
ARG HAPROXY_MINOR=2.6
ARG RUST_NIGHTLY=nightly-2026-05-19
ARG CARGO_FUZZ_VERSION=0.13.2
ARG ZIG_VERSION=0.17.1
ARG CARGO_ZIGBUILD_VERSION=0.24.1

# Bookworm ships haproxy 2.6; another minor needs the matching Debian
# backports repository added here.
RUN set -eux; \
    apt-get update; \
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        "haproxy=${HAPROXY_MINOR}.*" \
        prometheus \
        python3-pip; \
    rm -rf /var/lib/apt/lists/*; \
    /usr/sbin/haproxy -v | grep -q "version ${HAPROXY_MINOR}\."; \
    promtool --version

COPY --from=consul /bin/consul /usr/local/bin/consul
RUN consul version

# `cargo +nightly` (what scripts/fuzz.sh runs) resolves to the pinned nightly:
# rustup refuses "nightly" as a custom toolchain name, so the pinned
# toolchain's directory is linked under the channel's name.
RUN set -eux; \
    rustup component add rustfmt clippy; \
    rustup target add aarch64-unknown-linux-gnu; \
    host="$(rustc -vV | sed -n 's/^host: //p')"; \
    rustup toolchain install --profile minimal "${RUST_NIGHTLY}"; \
    ln -s "${RUSTUP_HOME}/toolchains/${RUST_NIGHTLY}-${host}" "${RUSTUP_HOME}/toolchains/nightly-${host}"; \
    cargo +nightly --version; \
    cargo install --locked --version "${CARGO_FUZZ_VERSION}" cargo-fuzz; \
    cargo install --locked --version "${CARGO_ZIGBUILD_VERSION}" cargo-zigbuild; \
    rm -rf "${CARGO_HOME}/registry" "${CARGO_HOME}/git"

# zig for cargo-zigbuild, found as `python3 -m ziglang` (a throwaway image:
# pip may write to the system Python).
RUN set -eux; \
    python3 -m pip install --no-cache-dir --break-system-packages "ziglang==${ZIG_VERSION}"; \
    python3 -m ziglang version; \
    cargo zigbuild --help >/dev/null

ENV HAPROXY_BIN=/usr/sbin/haproxy \
    CONSUL_BIN=/usr/local/bin/consul
