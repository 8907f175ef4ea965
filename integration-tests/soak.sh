#!/usr/bin/env bash
# Soak: the `count` function for N minutes at 60% of its measured maximum throughput with
# checkpoints every 10 s, on the real broker; RSS, end-to-end latency, checkpoint duration
# and lag sampled once a minute; the independent checker over everything at the end.
# Summary (text and JSON) in OUT/summary.{txt,json}. See docs/reliability.md.
#
#   integration-tests/soak.sh [--minutes N] [--prefill N] [--rate EVENTS_PER_S] [--out DIR]
#     --minutes N   soak length (default 60)
#     --prefill N   events for the max-throughput measurement (default 300000)
#     --rate R      soak at R events/s instead of 60% of the maximum (the maximum is
#                   still measured and reported unless --prefill 0)
#     --out DIR     where the summary, samples and service logs go (default: a new dir
#                   under /var/tmp)
#
# Starts its own broker unless STREAMSTATE_TEST_BOOTSTRAP is set (then uses that one) and
# builds the binary unless STREAMSTATE_BIN names one. Exit 0 only if the checker found no
# lost, duplicated or wrong output. Speed figures are reported, never asserted.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
args=()
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes|--prefill|--rate) args+=("$1" "$2"); shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "usage: $0 [--minutes N] [--prefill N] [--rate R] [--out DIR]" >&2; exit 2 ;;
  esac
done
out="${out:-$(mktemp -d /var/tmp/streamstate-soak.XXXXXX)}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/streamstate-target}"
if [ -z "${STREAMSTATE_BIN:-}" ]; then
  cargo build --release --locked --features failpoints --bin streamstate >&2
  STREAMSTATE_BIN="$CARGO_TARGET_DIR/release/streamstate"
fi
python="$("$root/integration-tests/checker/setup.sh" | tail -n1)"
if [ -z "${STREAMSTATE_TEST_BOOTSTRAP:-}" ]; then
  "$root/integration-tests/install-deps.sh"
  kafka="$root/integration-tests/kafka/kafka.sh"
  "$kafka" start
  trap '"$kafka" stop || "$kafka" kill || true' EXIT
  STREAMSTATE_TEST_BOOTSTRAP="$("$kafka" bootstrap)"
fi
echo "soak: output in $out" >&2
"$python" "$root/integration-tests/soak/soak.py" run --bin "$STREAMSTATE_BIN" \
  --bootstrap "$STREAMSTATE_TEST_BOOTSTRAP" --out "$out" "${args[@]}"
