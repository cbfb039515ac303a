#!/usr/bin/env bash
# Create .venv and install the broker with pinned dependencies (idempotent).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip uv
.venv/bin/uv pip install -q --python .venv/bin/python -c requirements-lock.txt -e ".[${1:-dev}]"
