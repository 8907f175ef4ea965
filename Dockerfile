# syntax=docker/dockerfile:1
# Build stage: dependencies are compiled in their own layer (cargo-chef) so a source
# change does not rebuild RocksDB and librdkafka.
FROM rust:1.88-bookworm AS chef
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
RUN cargo build --release --locked --bin streamstate

# Runtime: slim Debian with only the shared libraries the binary links (libssl, zlib, zstd).
FROM debian:bookworm-slim
LABEL org.opencontainers.image.title="streamstate" \
      org.opencontainers.image.description="Stateful exactly-once stream jobs over Kafka with Flink's state model" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates libssl3 zlib1g libzstd1 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 streamstate \
 && useradd --system --uid 10001 --gid 10001 --no-create-home streamstate \
 && mkdir -p /var/lib/streamstate /etc/streamstate \
 && chown 10001:10001 /var/lib/streamstate
COPY --from=builder /src/target/release/streamstate /usr/local/bin/streamstate
COPY config/streamstate.toml /etc/streamstate/streamstate.toml
USER 10001:10001
# State and checkpoints live only under this volume, so the root filesystem can be read-only.
VOLUME ["/var/lib/streamstate"]
EXPOSE 9464
ENTRYPOINT ["streamstate"]
CMD ["run", "--config", "/etc/streamstate/streamstate.toml"]
