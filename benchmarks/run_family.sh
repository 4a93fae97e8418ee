#!/usr/bin/env bash
# The GPT-2 family run (issue #14): medium, large and XL (seeded random weights), each through export ->
# quantize (dynamic, weight-only 8-bit, 4-bit) -> generate -> bench, 2 threads. Run it on a quiet machine
# with ~24 GiB of memory and ~32 GB of free disk; the report lands in benchmarks/results/.
#   bash benchmarks/run_family.sh [WORK_DIR] [SIZES]      (defaults: .cache/family, medium,large,xl)
set -euo pipefail
cd "$(dirname "$0")/.."
W=${1:-.cache/family}
S=${2:-medium,large,xl}
PY=${PYTHON:-.venv/bin/python}
exec "$PY" benchmarks/family.py --sizes "$S" --work "$W" --threads 2 --out "benchmarks/results/family-$(date -u +%F).md"
