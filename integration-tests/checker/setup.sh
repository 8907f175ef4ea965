#!/usr/bin/env bash
# Installs the independent exactly-once checker's Python (confluent-kafka from PyPI, pinned)
# into a venv under /var/tmp and prints the venv's python as the last line.
#
#   integration-tests/checker/setup.sh
#
# Environment:
#   STREAMSTATE_CHECKER_VENV  venv dir (default /var/tmp/streamstate-checker-venv)
#   PYTHON                    interpreter that creates the venv (default python3)
set -euo pipefail
CONFLUENT_KAFKA_VERSION=2.11.1
VENV="${STREAMSTATE_CHECKER_VENV:-/var/tmp/streamstate-checker-venv}"
PYTHON="${PYTHON:-python3}"
LOCK="${VENV}.lock"
mkdir -p "$(dirname "$VENV")"
exec 9>"$LOCK"
flock 9
if ! "$VENV/bin/python" -c "import confluent_kafka, sys; sys.exit(confluent_kafka.version()[0] != '$CONFLUENT_KAFKA_VERSION')" 2>/dev/null; then
    if ! command -v "$PYTHON" >/dev/null 2>&1 || ! "$PYTHON" -m venv --help >/dev/null 2>&1; then
        apt-get update -qq && apt-get install -y -qq python3 python3-venv >/dev/null
        PYTHON=python3
    fi
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV" >&2 || { apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null && "$PYTHON" -m venv "$VENV" >&2; }
    "$VENV/bin/python" -m pip install --disable-pip-version-check --quiet "confluent-kafka==$CONFLUENT_KAFKA_VERSION" >&2
    echo "checker/setup.sh: installed confluent-kafka==$CONFLUENT_KAFKA_VERSION into $VENV" >&2
fi
printf '%s\n' "$VENV/bin/python"
