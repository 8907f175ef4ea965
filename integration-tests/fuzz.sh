#!/usr/bin/env bash
# Fuzzes the decoder, the rule parser/envelope, the checkpoint manifest parser and the admin
# API's request handling, starting from the seed corpus in fuzz/corpus/<target>.
#
#   integration-tests/fuzz.sh [--seconds N] [--engine cargo-fuzz|loop]
#
# --seconds: per target (default 60; CI passes 20).
# --engine cargo-fuzz (default): libFuzzer via cargo-fuzz, needing the nightly toolchain's -Z
#   flags (`cargo +nightly` when installed, else stable with RUSTC_BOOTSTRAP=1); installs
#   cargo-fuzz (pinned) and curl's headers (librdkafka's CMake build) when missing, and links
#   the RocksDB library the main release build already compiled (ROCKSDB_LIB_DIR), so the
#   fuzz build does not redo RocksDB's 20-minute C++ build. Its first build, every dependency
#   with sanitizer flags, takes 15-20 minutes on 2 cores. Found crashes are left in
#   fuzz/artifacts/<target>/ and make the script fail. If the build fails, says so and runs
#   the loop instead.
# --engine loop (CI's short form): integration-tests/fuzz_loop.rs, an in-process mutation
#   loop over the same targets and seeds, built with the tests (no sanitizer build).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
seconds=60
engine=cargo-fuzz
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --engine) engine="$2"; shift 2 ;;
    *) echo "usage: $0 [--seconds N] [--engine cargo-fuzz|loop]" >&2; exit 2 ;;
  esac
done
case "$engine" in cargo-fuzz|loop) ;; *) echo "fuzz.sh: --engine cargo-fuzz or loop" >&2; exit 2 ;; esac
main_target="${CARGO_TARGET_DIR:-/var/tmp/streamstate-target}"
run_loop() {
  echo "== in-process fuzz loop, ${seconds}s per target"
  cd "$root"
  CARGO_TARGET_DIR="$main_target" STREAMSTATE_FUZZ_SECONDS="$seconds" \
    cargo test --release --locked --features failpoints --test fuzz_loop -- --test-threads=1 --nocapture 2>&1 \
    | grep -E "^fuzz |test result|panicked|crash"
  return "${PIPESTATUS[0]}"
}
if [ "$engine" = loop ]; then
  run_loop
  exit $?
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
lib=$(ls -t "$main_target"/release/build/librocksdb-sys-*/out/librocksdb.a 2>/dev/null | head -n1 || true)
if [ -n "$lib" ]; then
  export ROCKSDB_LIB_DIR="$(dirname "$lib")" ROCKSDB_STATIC=1
else
  echo "fuzz.sh: no prebuilt librocksdb.a under $main_target/release: building RocksDB (slow)" >&2
fi
# The fuzz crate builds librdkafka with CMake, which wants curl's headers.
if ! dpkg -s libcurl4-openssl-dev >/dev/null 2>&1; then
  apt-get update -qq && apt-get install -y -qq libcurl4-openssl-dev >/dev/null
fi
# Its own target dir: the sanitizer build shares nothing with the release build's artifacts.
export CARGO_TARGET_DIR="${STREAMSTATE_FUZZ_TARGET_DIR:-$main_target/fuzz}"
mkdir -p "$CARGO_TARGET_DIR"
cd "$root/fuzz"
targets=(decode rules manifest admin)
echo "== build fuzz targets (${targets[*]})"
if ! cargo "${toolchain[@]}" fuzz build -O >"$CARGO_TARGET_DIR/fuzz-build.log" 2>&1; then
  # The in-process loop still covers the same targets and seeds; the failure is named.
  grep -m3 -E "error|Argument list" "$CARGO_TARGET_DIR/fuzz-build.log" >&2 || true
  echo "fuzz.sh: cargo-fuzz build failed (log: $CARGO_TARGET_DIR/fuzz-build.log); running the in-process fuzz loop instead" >&2
  run_loop
  exit $?
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
