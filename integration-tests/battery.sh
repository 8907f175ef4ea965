#!/usr/bin/env bash
# The reliability and security battery (docs/reliability.md).
#
#   integration-tests/battery.sh           short form (CI's doses), standalone
#   integration-tests/battery.sh --long    long form: 5 broker SIGTERM + 5 SIGKILL restarts per
#                                          test, 150 random SIGKILLs, a 5-minute restart storm,
#                                          every checkpoint file x {flip, truncate, delete},
#                                          60 s of fuzzing per target
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
  export STREAMSTATE_TEST_BROKER_RESTARTS=5 STREAMSTATE_TEST_KILLS=150 STREAMSTATE_TEST_STORM_SECS=300 STREAMSTATE_TEST_CORRUPTION=all
  fuzz_seconds=60
else
  fuzz_seconds=20
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
echo "== battery: fuzz ${fuzz_seconds}s per target"
"$root/integration-tests/fuzz.sh" --seconds "$fuzz_seconds"
