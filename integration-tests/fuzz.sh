#!/usr/bin/env bash
# Fuzzes the decoder, the rule parser/envelope, the checkpoint manifest parser and the admin
# API's request handling with cargo-fuzz (libFuzzer), starting from the seed corpus in
# fuzz/corpus/<target>.
#
#   integration-tests/fuzz.sh [--seconds N]     (default 60 per target; CI passes 20)
#
# Needs the nightly toolchain's -Z flags: uses `cargo +nightly` when installed, else the
# stable toolchain with RUSTC_BOOTSTRAP=1. Installs cargo-fuzz (pinned) when missing. Links
# the RocksDB library the main release build already compiled (ROCKSDB_LIB_DIR), so the
# fuzz build does not redo RocksDB's 20-minute C++ build. Found crashes are left in
# fuzz/artifacts/<target>/ and make the script fail. If cargo-fuzz cannot build, runs the
# in-process fuzz loop (integration-tests/fuzz_loop.rs) on the same parsers instead.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
seconds=60
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    *) echo "usage: $0 [--seconds N]" >&2; exit 2 ;;
  esac
done
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/streamstate-target}"
# cargo-fuzz currently cannot build librdkafka (see the fallback below) and a failed attempt
# costs ~10 minutes of compiling: try it only when asked (STREAMSTATE_CARGO_FUZZ=1).
if [ "${STREAMSTATE_CARGO_FUZZ:-0}" != 1 ]; then
  echo "== in-process fuzz loop, ${seconds}s per target (STREAMSTATE_CARGO_FUZZ=1 tries cargo-fuzz first)"
  STREAMSTATE_FUZZ_SECONDS="$seconds" cargo test --release --locked --features failpoints --test fuzz_loop -- --test-threads=1 --nocapture 2>&1 \
    | grep -E "^fuzz |test result|panicked|crash"
  exit "${PIPESTATUS[0]}"
fi
CARGO_FUZZ_VERSION=0.13.1
if ! cargo fuzz --version 2>/dev/null | grep -q "$CARGO_FUZZ_VERSION"; then
  cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked
fi
toolchain=()
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  toolchain=(+nightly)
else
  export RUSTC_BOOTSTRAP=1
fi
# Reuse the release build's librocksdb.a (run.sh / cargo build --release builds it first).
lib=$(ls -t "$CARGO_TARGET_DIR"/release/build/librocksdb-sys-*/out/librocksdb.a 2>/dev/null | head -n1 || true)
if [ -n "$lib" ]; then
  export ROCKSDB_LIB_DIR="$(dirname "$lib")" ROCKSDB_STATIC=1
else
  echo "fuzz.sh: no prebuilt librocksdb.a under $CARGO_TARGET_DIR/release: building RocksDB (slow)" >&2
fi
cd "$root/fuzz"
targets=(decode rules manifest admin)
echo "== build fuzz targets (${targets[*]})"
if ! cargo "${toolchain[@]}" fuzz build -O >"$CARGO_TARGET_DIR/fuzz-build.log" 2>&1; then
  # Known: librdkafka's own configure (rdkafka-sys, mklove) fails under cargo-fuzz's build
  # ("rm: Argument list too long"), so the targets cannot link. Fall back to the in-process
  # fuzz loop over the same parsers and seeds (integration-tests/fuzz_loop.rs).
  grep -m3 -E "error|Argument list" "$CARGO_TARGET_DIR/fuzz-build.log" >&2 || true
  echo "fuzz.sh: cargo-fuzz build failed (log: $CARGO_TARGET_DIR/fuzz-build.log); running the in-process fuzz loop instead" >&2
  cd "$root"
  STREAMSTATE_FUZZ_SECONDS="$seconds" cargo test --release --locked --features failpoints --test fuzz_loop -- --test-threads=1 --nocapture 2>&1 \
    | grep -E "^fuzz |test result|panicked|crash" 
  exit "${PIPESTATUS[0]}"
fi
status=0
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t" "artifacts/$t"
  # A scratch copy of the seeds: new inputs libFuzzer finds do not land in the repo.
  work=$(mktemp -d)
  cp -r "corpus/$t/." "$work/"
  echo "== fuzz $t for ${seconds}s"
  if ! cargo "${toolchain[@]}" fuzz run -O "$t" "$work" -- -max_total_time="$seconds" -max_len=1048576 -rss_limit_mb=2048 \
       -artifact_prefix="artifacts/$t/" -print_final_stats=1 2>"$work.log"; then
    tail -n 40 "$work.log" >&2
    echo "fuzz.sh: $t found a crash: see fuzz/artifacts/$t/ (add it as a unit test with the input)" >&2
    status=1
  else
    grep -E "stat::number_of_executed_units|stat::new_units_added|Done " "$work.log" | sed "s/^/  $t: /" || true
  fi
  rm -rf "$work" "$work.log"
done
exit $status
