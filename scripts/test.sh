#!/usr/bin/env bash
# Set everything up from scratch and run the whole suite: lint, types, tests (slow ones included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
.venv/bin/ruff check .
.venv/bin/mypy
set +e
.venv/bin/pytest "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure" >&2
  exit 1
fi
exit "$status"
