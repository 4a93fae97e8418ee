#!/usr/bin/env bash
# Set up .venv and run the whole test suite (slow and interop tests included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
