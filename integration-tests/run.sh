#!/usr/bin/env bash
# Installs what the build and tests need, starts a real Kafka broker, runs every test,
# and stops the broker even when tests fail. This is the README's test command and what
# CI runs (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

# One stable target directory outside the clone: RocksDB's C++ build takes ~20 minutes
# on 2 cores, so repeat runs must be incremental.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/streamstate-target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

"$root/integration-tests/install-deps.sh"

echo "== build (release: one RocksDB build serves tests, demo and benches)"
cargo build --release --workspace --all-targets --locked

echo "== unit tests (no broker needed)"
cargo test --release --workspace --locked --lib --bins

kafka="$root/integration-tests/kafka/kafka.sh"
"$kafka" reset >/dev/null 2>&1 || true
"$kafka" start
trap '"$kafka" stop || "$kafka" kill || true' EXIT
export STREAMSTATE_TEST_BOOTSTRAP="$("$kafka" bootstrap)"

echo "== integration tests on the real broker at $STREAMSTATE_TEST_BOOTSTRAP"
cargo test --release --workspace --locked --test '*' -- --test-threads=2
