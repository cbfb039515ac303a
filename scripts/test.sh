#!/usr/bin/env bash
# Set everything up from scratch and run the whole suite: lint, types, tests (slow ones included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
# The dashboard's browser tests drive Debian's Chromium; the alert rules are checked by promtool.
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null || ! command -v promtool >/dev/null; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver prometheus
  else
    echo "chromium, chromium-driver or promtool missing and apt-get unusable: their tests will fail under CI" >&2
  fi
fi
# checkov (tests/terraform) pins versions that conflict with ours: it gets a venv of its own.
if [ ! -x .venv-checkov/bin/checkov ]; then
  .venv/bin/uv venv -q --python .venv/bin/python .venv-checkov
  .venv/bin/uv pip install -q --python .venv-checkov/bin/python --compile-bytecode checkov==3.3.30
fi
.venv/bin/ruff check .
.venv/bin/mypy
# The project's own modules compiled once, as setup.sh compiles the dependencies: the tests start
# many broker processes, and PYTHONDONTWRITEBYTECODE may be set.
.venv/bin/python -m compileall -q -j 0 broker providers policies tests benchmarks >/dev/null
# The suite runs in parallel: most slow tests wait on processes they started (measured: the tests and
# their processes kept 2 cores about 40 % busy with 4 workers), so more workers than cores pay; each
# test has its own broker home, ports and PostgreSQL database. The ten slowest are printed at the end.
set +e
.venv/bin/pytest -n "${TEST_WORKERS:-6}" --dist worksteal --durations=10 "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure" >&2
  exit 1
fi
exit "$status"
