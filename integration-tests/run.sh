#!/usr/bin/env bash
# Installs what the build and tests need, starts a local S3 server (moto), a Schema
# Registry (Apicurio) and a real Kafka broker, runs every test, and stops them even when
# tests fail. This is the README's test command and what CI runs (.ci/run).
#
#   integration-tests/run.sh [--kills N]
#     --kills N   SIGKILLs in the random-kill exactly-once test (default 20; long form 150)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

while [ $# -gt 0 ]; do
  case "$1" in
    --kills) export STREAMSTATE_TEST_KILLS="$2"; shift 2 ;;
    *) echo "usage: $0 [--kills N]" >&2; exit 2 ;;
  esac
done

# One stable target directory outside the clone: RocksDB's C++ build takes ~20 minutes
# on 2 cores, so repeat runs must be incremental.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/streamstate-target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

"$root/integration-tests/install-deps.sh"

# The web console (web/): its built files in web/dist/ are committed and embedded by the
# Rust build; here they are rebuilt from the locked sources and must come out identical, so
# what the binary serves is what web/src says. node_modules also gives the browser test
# its playwright-core. npm's cache lives outside the clone.
echo "== console: npm ci and rebuild web/dist (must equal the committed files)"
(cd "$root/web" && npm ci --no-audit --no-fund --cache /var/tmp/streamstate-npm-cache >/dev/null && npm run build >/dev/null)
if [ -n "$(git -C "$root" status --porcelain -- web/dist)" ]; then
  git -C "$root" status --short -- web/dist >&2
  echo "error: web/dist differs from a rebuild of web/src: run 'npm run build' in web/ and commit web/dist" >&2
  exit 1
fi

# Container and Kubernetes checks (no broker): hadolint, helm lint/template of every
# helm/streamstate/ci values file validated against Kubernetes schemas, values.schema.json
# refusals, and the binary on the runtime image's libraries. The chart test (--test chart)
# renders the chart with the helm this step installed.
echo "== chart and image checks (integration-tests/chart/check.sh)"
"$root/integration-tests/chart/check.sh"
STREAMSTATE_HELM="$("$root/integration-tests/chart/check.sh" --tools-only | tail -n1)"
export STREAMSTATE_HELM

# S3-compatible server for the s3:// checkpoint storage tests, unit and integration.
moto="$root/integration-tests/s3/moto.sh"
registry="$root/integration-tests/registry/apicurio.sh"
"$moto" start
trap '"$registry" stop || "$registry" kill || true; "$moto" stop || true' EXIT
STREAMSTATE_TEST_S3_ENDPOINT="$("$moto" endpoint)"
export STREAMSTATE_TEST_S3_ENDPOINT
# Confluent-compatible Schema Registry (Apicurio Registry, in memory) for the Avro tests,
# and the independent reader that decodes the Avro output (runs on the venv's python below).
"$registry" stop >/dev/null 2>&1 || true   # in memory: a registry left from an aborted run restarts empty
"$registry" start
STREAMSTATE_TEST_REGISTRY_URL="$("$registry" url)"
export STREAMSTATE_TEST_REGISTRY_URL
export STREAMSTATE_TEST_READ_AVRO="$root/integration-tests/registry/read_avro.py"
# Python with `jsonschema` (the test that validates the rule JSON Schema) and `confluent-kafka`
# + `fastavro` (read_avro.py).
STREAMSTATE_TEST_PYTHON="$("$moto" python | tail -n1)"
export STREAMSTATE_TEST_PYTHON
export AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1

# Tests run the binary built with crash points (`failpoints`): inert unless a test sets
# FAILPOINTS for a run.
features=(--features streamstate/failpoints)

echo "== build (release: one RocksDB build serves tests, demo and benches)"
cargo build --release --workspace --all-targets --locked "${features[@]}"

# The benchmark's JVM contenders (bench/run.sh builds and runs them; CI only compiles them,
# so an API change in Kafka Streams or Flink shows here and not at the next benchmark).
# Maven Central into ~/.m2 once (~140 MB for Flink 2.2 and its Kafka connector).
echo "== benchmark contenders compile (Maven: bench/kstreams, bench/flink; no benchmark run)"
for pom in bench/kstreams/pom.xml bench/flink/pom.xml; do
  mvn -q -B -Dstyle.color=never -f "$root/$pom" compile
done

echo "== unit tests (no broker needed; S3 storage tests use moto at $STREAMSTATE_TEST_S3_ENDPOINT)"
cargo test --release --workspace --locked "${features[@]}" --lib --bins
echo "== doc tests (API examples; the compile-fail proof that keyed code cannot write broadcast state)"
cargo test --release --workspace --locked "${features[@]}" --doc

kafka="$root/integration-tests/kafka/kafka.sh"
"$kafka" reset >/dev/null 2>&1 || true
"$kafka" start
trap '"$kafka" stop || "$kafka" kill || true; "$registry" stop || "$registry" kill || true; "$moto" stop || true' EXIT
export STREAMSTATE_TEST_BOOTSTRAP="$("$kafka" bootstrap)"

echo "== integration tests on the real broker at $STREAMSTATE_TEST_BOOTSTRAP"
cargo test --release --workspace --locked --no-fail-fast "${features[@]}" --test '*' -- --test-threads=2

# The backend is a setting, so what exactly-once rests on must hold on both: the
# exactly-once suite (failpoint matrix, random kills, zombies), the rules tests and the
# savepoint round trip run again with every service on the heap backend (~7 min). The
# run above was RocksDB's; integration-tests/backends.rs switches between the two.
echo "== exactly-once, rules and savepoint tests again on the hashmap backend"
STREAMSTATE_TEST_BACKEND=hashmap cargo test --release --workspace --locked --no-fail-fast "${features[@]}" \
  --test exactly_once --test rules --test rules_event_time -- --test-threads=2
STREAMSTATE_TEST_BACKEND=hashmap cargo test --release --workspace --locked --no-fail-fast "${features[@]}" \
  --test admin -- --test-threads=2 stop_with_savepoint

# The battery's Rust tests (integration-tests/battery.rs, broker_restart.rs) ran above; its
# fuzzing runs here. Long form: integration-tests/battery.sh --long (docs/reliability.md).
echo "== reliability battery: fuzz the decoder, rule parser, manifest parser and admin requests (in-process loop, 20 s per target)"
"$root/integration-tests/fuzz.sh" --seconds 20 --engine loop
