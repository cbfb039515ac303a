#!/usr/bin/env bash
# Create .venv and install the broker with the locked, hash-checked dependencies (idempotent).
#   bash scripts/setup.sh           # dev (default): the broker, every cloud SDK, the tools and tests
#   bash scripts/setup.sh runtime   # the broker and every cloud SDK, as tested (requirements.lock)
# The lock files say at their top how to regenerate them after pyproject.toml changes.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
UV_VERSION=0.13.9
case "${1:-dev}" in
  dev) LOCK=requirements-dev.lock ;;
  runtime) LOCK=requirements.lock ;;
  *) echo "usage: bash scripts/setup.sh [dev|runtime]" >&2; exit 2 ;;
esac
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
if [ "$(.venv/bin/uv --version 2>/dev/null | cut -d' ' -f2)" != "$UV_VERSION" ]; then
  .venv/bin/python -m pip install -q "uv==$UV_VERSION"
fi
# Compiled at install time: every broker, agent and replica process the tests start imports from
# bytecode instead of compiling SQLAlchemy, FastAPI and the SDKs again (Python reads .pyc files even
# where PYTHONDONTWRITEBYTECODE keeps it from writing them).
.venv/bin/uv pip install -q --python .venv/bin/python --compile-bytecode --require-hashes -r "$LOCK"
.venv/bin/uv pip install -q --python .venv/bin/python --no-deps -e .
if [ "$LOCK" = requirements-dev.lock ]; then
  # PyTorch, Lightning and Transformers for the job helper's tests, through pip (see requirements-ml.txt),
  # held to the lock's versions of everything they share (torch needs a newer setuptools).
  grep -E '^[A-Za-z0-9][^ ]*==' "$LOCK" | sed 's/ *\\$//' | grep -v '^setuptools==' > .venv/ml-constraints.txt
  .venv/bin/python -m pip install -q -c .venv/ml-constraints.txt -r requirements-ml.txt
fi
