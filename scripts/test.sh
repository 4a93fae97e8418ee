#!/usr/bin/env bash
# Set up .venv (the test profile: the test extra, Ray, the browser clients), check the tree with ruff, and run the
# whole test suite, slow and interop tests included; arguments go to pytest. The fast subset:
#   bash scripts/test.sh -m "not slow and not ray and not interop"
# The tests run on 2 pytest-xdist workers (`-n 2 --dist loadgroup`; tests/conftest.py groups the tests that share
# a fixture or the Ray cluster); GPTEDGE_TEST_WORKERS=N runs N, and 0 runs them in this one process.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
# Lint first, one line ([tool.ruff] in pyproject.toml); a finding prints ruff's report and stops here (CI fails).
if findings=$(.venv/bin/python -m ruff check --quiet . 2>&1); then
  echo "lint: ruff check . ... ok" >&2
else
  echo "lint: ruff check . ... failed" >&2
  echo "$findings" >&2
  exit 1
fi
WORKERS=${GPTEDGE_TEST_WORKERS:-2}
PARALLEL=()
if [ "$WORKERS" != 0 ] && .venv/bin/python -c "import xdist" 2>/dev/null; then
  PARALLEL=(-n "$WORKERS" --dist loadgroup)
fi
exec .venv/bin/python -m pytest ${PARALLEL[@]+"${PARALLEL[@]}"} "$@"
