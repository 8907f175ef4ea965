# syntax=docker/dockerfile:1
# streamstate container image: a multi-stage build (cargo-chef keeps the dependency build,
# RocksDB and librdkafka, in its own cached layer) and a slim, non-root runtime that works
# with a read-only root filesystem.
#
#   docker build -t streamstate:0.1.0 --build-arg VERSION=0.1.0 .
#
# The build and runtime stages are both Debian bookworm, so the binary's glibc and OpenSSL
# match the runtime's. docker/runtime-libraries.txt lists every shared library the binary
# links and where the runtime image gets it; integration-tests/chart/image-check.sh proves
# the list (CI has no Docker engine) by running the binary on those packages alone.

FROM rust:1.88-bookworm AS chef
# Build tools for librocksdb-sys (bindgen, C++) and librdkafka (cmake, OpenSSL, zlib);
# jemalloc (tikv-jemalloc-sys) builds with the base image's make.
# Versions are not pinned: the stage tracks bookworm's security updates.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends libclang-dev clang cmake pkg-config libssl-dev zlib1g-dev libzstd-dev \
 && rm -rf /var/lib/apt/lists/* \
 && cargo install cargo-chef --locked --version 0.1.71
WORKDIR /src

FROM chef AS planner
COPY . .
RUN cargo chef prepare --recipe-path recipe.json

FROM chef AS builder
COPY --from=planner /src/recipe.json recipe.json
RUN cargo chef cook --release --recipe-path recipe.json
COPY . .
# No `failpoints` feature: crash points are for the tests only.
RUN cargo build --release --locked --bin streamstate

# Runtime: debian:bookworm-slim already has libc6, libgcc-s1 and libstdc++6 (apt needs them);
# add OpenSSL and zlib for librdkafka's SASL/SSL, and the CA bundle for TLS to brokers and S3.
FROM debian:bookworm-slim
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="streamstate" \
      org.opencontainers.image.description="Stateful exactly-once stream jobs over Kafka with Flink's state model" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="docker.io/library/debian:bookworm-slim"
# Unpinned for the same reason as above (security updates).
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates libssl3 zlib1g \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 streamstate \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin streamstate \
 && mkdir -p /var/lib/streamstate/state /var/lib/streamstate/checkpoints /etc/streamstate/secrets \
 && chown -R 10001:10001 /var/lib/streamstate
COPY --from=builder /src/target/release/streamstate /usr/local/bin/streamstate
COPY config/streamstate.toml /etc/streamstate/streamstate.toml
# A fixed numeric UID, so Kubernetes' runAsNonRoot can verify it without /etc/passwd.
USER 10001:10001
# State and checkpoints live only under this volume, so the root filesystem can be
# read-only. The default config reads the admin token from a mounted Secret at
# /etc/streamstate/secrets/admin-token.
VOLUME ["/var/lib/streamstate"]
WORKDIR /var/lib/streamstate
# Admin HTTP: /livez, /readyz, /metrics, checkpoint triggers.
EXPOSE 9464
ENTRYPOINT ["streamstate"]
CMD ["run", "--config", "/etc/streamstate/streamstate.toml"]
