#!/usr/bin/env bash
# Set up .venv (the test profile: the test extra, Ray, the browser clients) and run the whole test suite, slow and
# interop tests included; arguments go to pytest. The fast subset: bash scripts/test.sh -m "not slow and not ray and not interop"
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
exec .venv/bin/python -m pytest "$@"
