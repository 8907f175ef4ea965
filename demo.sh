#!/usr/bin/env bash
# Quickstart: runs the main job on an in-process mock Kafka with generated events and
# serves the web console, admin API and metrics on 127.0.0.1:9464 (open http://127.0.0.1:9464/). Installs build dependencies when missing.
# Pass arguments through, e.g. `./demo.sh --duration 60s`.
set -euo pipefail
cd "$(dirname "$0")"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/streamstate-target}"
./integration-tests/install-deps.sh --build-only
echo "== the console will be at http://127.0.0.1:9464/ (or the --admin-listen address) once the demo runs"
exec cargo run --release --locked --bin streamstate -- demo "$@"
