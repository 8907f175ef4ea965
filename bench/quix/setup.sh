#!/usr/bin/env bash
# Installs Quix Streams (PyPI, pinned) into a venv and prints the venv's python last.
#   bench/quix/setup.sh VENV_DIR
set -euo pipefail
QUIX_VERSION=3.28.1
VENV="${1:?venv dir}"
if ! "$VENV/bin/python" -c "import quixstreams, sys; sys.exit(quixstreams.__version__ != '$QUIX_VERSION')" 2>/dev/null; then
    python3 -m venv "$VENV" >&2
    "$VENV/bin/pip" install --disable-pip-version-check --quiet "quixstreams==$QUIX_VERSION" >&2
fi
printf '%s\n' "$VENV/bin/python"
