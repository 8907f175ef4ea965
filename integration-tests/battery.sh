#!/usr/bin/env bash
# The reliability and security battery (docs/reliability.md).
#
#   integration-tests/battery.sh           short form (CI's doses), standalone
#   integration-tests/battery.sh --long    long form: 5 broker SIGTERM + 5 SIGKILL restarts per
#                                          test, 150 random SIGKILLs, a 5-minute restart storm,
#                                          every checkpoint file x {flip, truncate, delete},
#                                          60 s of fuzzing per target, the admin-abuse
#                                          throughput benchmark (3 rounds quiet/abused) and
#                                          the 60-minute soak (SOAK_MINUTES to change)
#
# CI runs the short form as part of integration-tests/run.sh (the Rust battery tests under
# its `--test '*'` step, the fuzzing as its "reliability battery: fuzz" step). This script
# starts its own broker and S3 server unless STREAMSTATE_TEST_BOOTSTRAP is set (then it
# uses what is running), and stops them when done.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
long=0
case "${1:-}" in
  --long) long=1 ;;
  "") ;;
  *) echo "usage: $0 [--long]" >&2; exit 2 ;;
esac
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/streamstate-target}"
features=(--features streamstate/failpoints)
if [ "$long" = 1 ]; then
  export STREAMSTATE_TEST_BROKER_RESTARTS=5 STREAMSTATE_TEST_KILLS=150 STREAMSTATE_TEST_STORM_SECS=300 STREAMSTATE_TEST_CORRUPTION=all STREAMSTATE_TEST_ZOMBIES=5
  fuzz_seconds=60 fuzz_engine=cargo-fuzz
else
  fuzz_seconds=20 fuzz_engine=loop
fi
"$root/integration-tests/checker/setup.sh" >/dev/null
if [ -z "${STREAMSTATE_TEST_BOOTSTRAP:-}" ]; then
  "$root/integration-tests/install-deps.sh"
  moto="$root/integration-tests/s3/moto.sh"; kafka="$root/integration-tests/kafka/kafka.sh"
  "$moto" start
  "$kafka" start
  trap '"$kafka" stop || "$kafka" kill || true; "$moto" stop || true' EXIT
  STREAMSTATE_TEST_S3_ENDPOINT="$("$moto" endpoint)"; STREAMSTATE_TEST_PYTHON="$("$moto" python | tail -n1)"
  STREAMSTATE_TEST_BOOTSTRAP="$("$kafka" bootstrap)"
  export STREAMSTATE_TEST_S3_ENDPOINT STREAMSTATE_TEST_PYTHON STREAMSTATE_TEST_BOOTSTRAP
  export AWS_ACCESS_KEY_ID="${AWS_ACCESS_KEY_ID:-test}" AWS_SECRET_ACCESS_KEY="${AWS_SECRET_ACCESS_KEY:-test}" AWS_REGION="${AWS_REGION:-us-east-1}"
fi
echo "== battery: bad input, rules garbage, corrupted checkpoints, restart storm, disk full, secrets"
cargo test --release --locked "${features[@]}" --test battery --test cli -- --test-threads=2
echo "== battery: broker SIGTERM/SIGKILL restarts"
cargo test --release --locked "${features[@]}" --test broker_restart -- --test-threads=1
echo "== battery: random SIGKILLs (${STREAMSTATE_TEST_KILLS:-20})"
cargo test --release --locked "${features[@]}" --test exactly_once random_sigkills -- --test-threads=2
echo "== battery: zombie instances (${STREAMSTATE_TEST_ZOMBIES:-1} per storage)"
cargo test --release --locked "${features[@]}" --test exactly_once zombie -- --test-threads=1
echo "== battery: admin abuse (bad tokens, concurrent triggers, traversal, 1 MiB bodies, slow clients)"
cargo test --release --locked "${features[@]}" --test admin admin_abuse -- --test-threads=1
echo "== battery: soak, short form (2 minutes)"
cargo test --release --locked "${features[@]}" --test soak -- --test-threads=1
echo "== battery: fuzz ${fuzz_seconds}s per target ($fuzz_engine)"
"$root/integration-tests/fuzz.sh" --seconds "$fuzz_seconds" --engine "$fuzz_engine"
if [ "$long" = 1 ]; then
  cargo build --release --locked "${features[@]}" --bin streamstate
  bin="$CARGO_TARGET_DIR/release/streamstate"
  python="$("$root/integration-tests/checker/setup.sh" | tail -n1)"
  out="$(mktemp -d /var/tmp/streamstate-battery.XXXXXX)"
  echo "== battery: zombie instances (${STREAMSTATE_TEST_ZOMBIES:-1} per storage)"
cargo test --release --locked "${features[@]}" --test exactly_once zombie -- --test-threads=1
echo "== battery: admin abuse vs throughput (3 rounds quiet/abused; results in $out/abuse)"
  "$python" "$root/integration-tests/soak/admin_abuse_bench.py" --bin "$bin" \
    --bootstrap "$STREAMSTATE_TEST_BOOTSTRAP" --out "$out/abuse" --rounds 3
  echo "== battery: soak ${SOAK_MINUTES:-60} min at 60% of max throughput (results in $out/soak)"
  STREAMSTATE_BIN="$bin" "$root/integration-tests/soak.sh" --minutes "${SOAK_MINUTES:-60}" --out "$out/soak"
fi
