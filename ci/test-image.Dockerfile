# The CI image: Rust (stable with rustfmt and clippy, the arm64 target, a
# pinned nightly with cargo-fuzz), zig and cargo-zigbuild for the release
# builds (glibc 2.17 symbols, both architectures: no cross gcc), haproxy from
# Debian and the upstream haproxy LTS lines built from source, a real consul
# for the integration tests, promtool for the metrics check.
# Versions come from ci/versions.yml as build arguments; the defaults below
# equal them (tests/ci_config.rs checks).
ARG RUST_VERSION=1.95.0
ARG CONSUL_VERSION=1.21.2

FROM hashicorp/consul:${CONSUL_VERSION} AS consul

# The upstream haproxy LTS lines beside Debian's 2.6 (the haproxy-lts matrix
# job): source from haproxy.org checked against the pinned sha256, built
# without libraries (the agent checks need none), one binary per line in
# /opt/haproxy-<line>/haproxy.
FROM rust:${RUST_VERSION}-bookworm AS haproxy-lts
ARG HAPROXY_LTS_2_8_VERSION=2.8.19
ARG HAPROXY_LTS_2_8_SHA256=1c7b8fcc99d87f6e30c5060738e36a4c7d393e1d3c96f5abd84de422a9637b81
ARG HAPROXY_LTS_3_0_VERSION=3.0.11
ARG HAPROXY_LTS_3_0_SHA256=a133e2d550c5fd9a849b5c7ab17bb945bcdad209ca140d41f45ebf31943ae783
ARG HAPROXY_LTS_3_2_VERSION=3.2.19
ARG HAPROXY_LTS_3_2_SHA256=b08ebbd57f575012e4a5eb5b772721531fbacf6913ffd334f0281736a1ad78b6
RUN set -eu; \
    build() { \
        version="$1"; sum="$2"; line="${version%.*}"; src="/usr/src/haproxy-${version}"; \
        curl -fsSL -o "/tmp/haproxy-${version}.tar.gz" \
            "https://www.haproxy.org/download/${line}/src/haproxy-${version}.tar.gz"; \
        echo "${sum}  /tmp/haproxy-${version}.tar.gz" | sha256sum -c -; \
        mkdir -p "$src"; \
        tar -xzf "/tmp/haproxy-${version}.tar.gz" -C "$src" --strip-components=1; \
        make -C "$src" -j"$(nproc)" TARGET=linux-glibc >"/tmp/haproxy-${version}.log" 2>&1 \
            || { tail -n 30 "/tmp/haproxy-${version}.log"; exit 1; }; \
        install -D -m 0755 "$src/haproxy" "/opt/haproxy-${line}/haproxy"; \
        "/opt/haproxy-${line}/haproxy" -v | grep -Eq "version ${version}[- ]"; \
    }; \
    build "${HAPROXY_LTS_2_8_VERSION}" "${HAPROXY_LTS_2_8_SHA256}"; \
    build "${HAPROXY_LTS_3_0_VERSION}" "${HAPROXY_LTS_3_0_SHA256}"; \
    build "${HAPROXY_LTS_3_2_VERSION}" "${HAPROXY_LTS_3_2_SHA256}"

FROM rust:${RUST_VERSION}-bookworm
ARG HAPROXY_MINOR=2.6
ARG RUST_NIGHTLY=nightly-2026-05-19
ARG CARGO_FUZZ_VERSION=0.13.2
ARG ZIG_VERSION=0.17.1
ARG CARGO_ZIGBUILD_VERSION=0.24.1
ARG PY_CONSUL_VERSION=1.8.0

# Bookworm ships haproxy 2.6; another minor needs the matching Debian
# backports repository added here.
RUN set -eux; \
    apt-get update; \
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        "haproxy=${HAPROXY_MINOR}.*" \
        openssl \
        prometheus \
        python3-pip \
        python3-yaml; \
    rm -rf /var/lib/apt/lists/*; \
    /usr/sbin/haproxy -v | grep -q "version ${HAPROXY_MINOR}\."; \
    promtool --version

COPY --from=consul /bin/consul /usr/local/bin/consul
RUN consul version

# Every LTS line at /opt/haproxy-<line>/haproxy, 2.6 being Debian's.
COPY --from=haproxy-lts /opt/ /opt/
RUN set -eux; \
    mkdir -p "/opt/haproxy-${HAPROXY_MINOR}"; \
    ln -s /usr/sbin/haproxy "/opt/haproxy-${HAPROXY_MINOR}/haproxy"; \
    for h in /opt/haproxy-*/haproxy; do "$h" -v | head -n 1; done

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

# zig for cargo-zigbuild, found as `python3 -m ziglang`, and py-consul for
# tests/py_consul.rs (a throwaway image: pip may write to the system Python).
RUN set -eux; \
    python3 -m pip install --no-cache-dir --break-system-packages \
        "ziglang==${ZIG_VERSION}" "py-consul==${PY_CONSUL_VERSION}"; \
    python3 -c "import consul"; \
    python3 -m ziglang version; \
    cargo zigbuild --help >/dev/null

ENV HAPROXY_BIN=/usr/sbin/haproxy \
    CONSUL_BIN=/usr/local/bin/consul
