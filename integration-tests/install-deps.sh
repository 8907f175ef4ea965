#!/usr/bin/env bash
# Installs the system packages the build and the broker rig need, only when missing.
# `--build-only` skips what only the test broker needs (Java, Maven).
set -euo pipefail

missing=()
need_pkg() { dpkg -s "$1" >/dev/null 2>&1 || missing+=("$1"); }
need_pkg libclang-dev      # bindgen for librocksdb-sys
need_pkg clang             # bindgen finds its headers through clang
need_pkg cmake
need_pkg g++
need_pkg make
need_pkg pkg-config
need_pkg libssl-dev        # librdkafka with SSL/SASL
need_pkg zlib1g-dev
need_pkg libzstd-dev
if [ "${1:-}" != "--build-only" ]; then
  # The test broker runs on the JVM; its jars come from Maven Central.
  command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
  command -v mvn >/dev/null 2>&1 || missing+=(maven)
  # javac: the benchmark's Kafka Streams and Flink contenders are compiled in CI
  command -v javac >/dev/null 2>&1 || missing+=(openjdk-17-jdk-headless)
  need_pkg python3-venv    # the S3 test server (moto) installs into a venv
  # The console's browser test (integration-tests/console.rs): Debian's Chromium, driven
  # by playwright-core from web/node_modules (npm ci), which never downloads a browser.
  command -v chromium >/dev/null 2>&1 || missing+=(chromium)
  command -v npm >/dev/null 2>&1 || missing+=(nodejs npm)
fi

if [ ${#missing[@]} -gt 0 ]; then
  echo "== installing system packages: ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then
    echo "error: need root (or sudo) to apt-get install ${missing[*]}" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "error: cargo not found; install Rust (rustup) 1.88 or newer" >&2
  exit 1
fi
