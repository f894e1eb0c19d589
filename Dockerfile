# The gitlab-haproxy-agent container image (the Kubernetes sidecar), built
# from source: for `docker build .` by hand. The image CI publishes is
# Dockerfile.release, made of the release archives' binaries.
#
#   docker build --build-arg GITLAB_HAPROXY_AGENT_VERSION=1.2.3 \
#                --build-arg GITLAB_HAPROXY_AGENT_BUILD_COMMIT="$(git rev-parse --short=12 HEAD)" .
#
# The runtime image is distroless: no shell, no package manager, runs as the
# nonroot user (65532). It has no HEALTHCHECK (that would need a shell or a
# client binary): probe GET /-/liveness and /-/readiness on the monitoring
# port (9778) from the orchestrator instead (packaging/kubernetes/sidecar.yaml).
# The binary is built as the release archives are, by scripts/release.sh
# (cargo-zigbuild, glibc 2.17 symbols). The ARG defaults of pinned versions
# equal ci/versions.yml (tests/it/ci_config.rs checks).
ARG RUST_VERSION=1.95.0

FROM rust:${RUST_VERSION}-bookworm AS build
ARG ZIG_VERSION=0.17.1
ARG CARGO_ZIGBUILD_VERSION=0.24.1
RUN set -eux; \
    apt-get update; \
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3-pip; \
    rm -rf /var/lib/apt/lists/*; \
    python3 -m pip install --no-cache-dir --break-system-packages "ziglang==${ZIG_VERSION}"; \
    cargo install --locked --version "${CARGO_ZIGBUILD_VERSION}" cargo-zigbuild; \
    rm -rf "${CARGO_HOME}/registry" "${CARGO_HOME}/git"
# Empty means Cargo.toml's version and an "unknown" commit (.git is not in
# the build context); a full commit hash is cut to the 12 digits git prints.
ARG GITLAB_HAPROXY_AGENT_VERSION=
ARG GITLAB_HAPROXY_AGENT_BUILD_COMMIT=
WORKDIR /src
COPY . .
RUN set -eu; \
    if [ -n "${GITLAB_HAPROXY_AGENT_VERSION}" ]; then export GITLAB_HAPROXY_AGENT_VERSION; else unset GITLAB_HAPROXY_AGENT_VERSION; fi; \
    if [ -n "${GITLAB_HAPROXY_AGENT_BUILD_COMMIT}" ]; then \
        GITLAB_HAPROXY_AGENT_BUILD_COMMIT="$(printf %s "${GITLAB_HAPROXY_AGENT_BUILD_COMMIT}" | cut -c1-12)"; \
        export GITLAB_HAPROXY_AGENT_BUILD_COMMIT; \
    else unset GITLAB_HAPROXY_AGENT_BUILD_COMMIT; fi; \
    SOURCE_DATE_EPOCH=0 DIST_DIR=/tmp/dist scripts/release.sh ${GITLAB_HAPROXY_AGENT_VERSION:+--version "$GITLAB_HAPROXY_AGENT_VERSION"}; \
    host="$(rustc -vV | sed -n 's/^host: //p')"; \
    install -D -m 0755 "target/$host/release/gitlab-haproxy-agent" /out/gitlab-haproxy-agent; \
    /out/gitlab-haproxy-agent -version

FROM gcr.io/distroless/cc-debian12:nonroot
ARG GITLAB_HAPROXY_AGENT_VERSION=
ARG GITLAB_HAPROXY_AGENT_BUILD_COMMIT=
LABEL org.opencontainers.image.title="gitlab-haproxy-agent" \
      org.opencontainers.image.description="HAProxy agent-check responder answering the desired admin state of each backend server from consul KV" \
      org.opencontainers.image.licenses="MIT" \
      org.opencontainers.image.vendor="GitLab B.V." \
      org.opencontainers.image.version="${GITLAB_HAPROXY_AGENT_VERSION}" \
      org.opencontainers.image.revision="${GITLAB_HAPROXY_AGENT_BUILD_COMMIT}"
COPY --from=build /out/gitlab-haproxy-agent /gitlab-haproxy-agent
USER nonroot:nonroot
# 9777 agent-check (haproxy), 9778 monitoring (/-/metrics, /-/liveness,
# /-/readiness). The debug listener stays on loopback (127.0.0.1:9779).
EXPOSE 9777 9778
ENTRYPOINT ["/gitlab-haproxy-agent"]
