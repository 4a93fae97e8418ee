#!/usr/bin/env bash
# Create .venv with what one job needs, one line per step on the terminal and every package manager's output in
# a log file (shown, its tail and its path, only when a step fails). Safe to run again: a part is reinstalled only
# when what it installs from changed (pyproject.toml, the playground's package-lock.json).
#
# Usage: bash scripts/setup.sh [demo|test]   (default: test)
#   demo  the main job (scripts/demo.sh): torch (CPU build), ONNX Runtime, export, quantize, plots, serve
#   test  everything the tests need besides: the test extra (transformers, optimum-onnx, peers, mkdocs), Ray, and
#         the web target's clients (the playground's JavaScript from npm, Debian's Chromium when run as root)
# Environment: PYTHON (default python3), GPTEDGE_VENV (default .venv), GPTEDGE_SETUP_LOG (default $VENV/setup.log),
#   GPTEDGE_SETUP_DRY_RUN=1 (log each install command instead of running it; stamps are written, for testing the flow).
set -euo pipefail
cd "$(dirname "$0")/.."
PROFILE=${1:-test}
case "$PROFILE" in
  demo) EXTRAS="cpu,export,plot,serve" ;;
  test) EXTRAS="cpu,export,plot,serve,test,ray,docs" ;;
  *) echo "usage: bash scripts/setup.sh [demo|test]" >&2; exit 2 ;;
esac
PY=${PYTHON:-python3}
VENV=${GPTEDGE_VENV:-.venv}
LOG=${GPTEDGE_SETUP_LOG:-$VENV/setup.log}
DRY=${GPTEDGE_SETUP_DRY_RUN:-}
mkdir -p "$(dirname "$LOG")"

# step "what it does" COMMAND...: one line on stderr; the command's output goes to the log.
step() {
  local what=$1 rc=0
  shift
  printf 'setup: %s ... ' "$what" >&2
  printf '\n== %s  %s\n$ %s\n' "$(date -u +%FT%TZ)" "$what" "$*" >>"$LOG"
  if [ -n "$DRY" ]; then
    echo "(dry run)" >>"$LOG"
  else
    "$@" >>"$LOG" 2>&1 </dev/null || rc=$?
  fi
  ended "$rc"
}

# ended RC: the end of a step's line, "ok", or "failed" with the log's tail, and the exit.
ended() {
  if [ "$1" -ne 0 ]; then
    echo "failed (exit $1)" >&2
    echo "---- the last 40 lines of $LOG:" >&2
    tail -n 40 "$LOG" >&2
    echo "---- the whole log: $LOG" >&2
    exit "$1"
  fi
  echo "ok" >&2
}

# background NAME "what it does" COMMAND...: a step that needs nothing the others make (the web clients, beside
# pip's install) started now, its output in $LOG.NAME; `finish NAME` waits for it, appends that output to the log
# and prints the step's one line. A background step still running when setup.sh exits (a failed step) is stopped.
declare -A BG_PID BG_WHAT
trap 'for pid in "${BG_PID[@]}"; do [ -z "$pid" ] || kill "$pid" 2>/dev/null || true; done' EXIT
background() {
  local name=$1 what=$2
  shift 2
  BG_WHAT[$name]=$what
  BG_PID[$name]=""
  printf '\n== %s  %s\n$ %s\n' "$(date -u +%FT%TZ)" "$what" "$*" >"$LOG.$name"
  if [ -n "$DRY" ]; then
    echo "(dry run)" >>"$LOG.$name"
  else
    "$@" >>"$LOG.$name" 2>&1 </dev/null &
    BG_PID[$name]=$!
  fi
}
finish() {
  local name=$1 rc=0
  [ -z "${BG_PID[$name]}" ] || wait "${BG_PID[$name]}" || rc=$?
  BG_PID[$name]=""
  cat "$LOG.$name" >>"$LOG"
  rm -f "$LOG.$name"
  printf 'setup: %s ... ' "${BG_WHAT[$name]}" >&2
  ended "$rc"
}

# A stamp holds the hash of what a part was installed from; `fresh STAMP WANT` is true when it still matches.
fresh() { [ -f "$1" ] && [ "$(cat "$1")" = "$2" ]; }

# The web target's clients (test profile; tests/web/test_web_*.py skip with one line where these are missing),
# installed in the background while pip installs the Python packages:
# - the playground's JavaScript, from the npm registry as gptedge/playground/package-lock.json pins it; scripts never
#   run (--ignore-scripts: onnxruntime-node's postinstall would download; its binary is already in the package);
# - Debian's Chromium, driven by the playwright Python package (in [test]); `playwright install` never runs.
PLAYGROUND=gptedge/playground
WEB_STAMP="$PLAYGROUND/node_modules/.gptedge-lock"
WEB_WANT="$(sha256sum "$PLAYGROUND/package-lock.json" | cut -c1-16)"
NPM="" CHROMIUM=""
if [ "$PROFILE" = test ]; then
  if ! command -v npm >/dev/null; then
    echo "setup: no npm on this machine: the playground's JavaScript is not installed (its tests skip)" >&2
  elif ! fresh "$WEB_STAMP" "$WEB_WANT"; then
    NPM=1
    background npm "installing the playground's JavaScript (npm ci --ignore-scripts)" \
      bash -c 'cd "$1" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error' npm-ci "$PLAYGROUND"
  fi
  if [ ! -x /usr/bin/chromium ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      CHROMIUM=1
      # a failed index update is not fatal: the package may be installable from the index already there
      background chromium "installing Debian's chromium (apt-get update, then no recommends)" \
        sh -c 'apt-get update -qq || true
               DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium'
    else
      echo "setup: no /usr/bin/chromium and no root to install it: the browser tests skip" >&2
    fi
  fi
fi

# Python packages. The test profile installs a superset of demo's, so a test stamp satisfies demo too.
WANT="$(sha256sum pyproject.toml | cut -c1-16)"
if fresh "$VENV/.gptedge-installed-$PROFILE" "$WANT" || { [ "$PROFILE" = demo ] && fresh "$VENV/.gptedge-installed-test" "$WANT"; }; then
  echo "setup: $VENV is up to date ($PROFILE)" >&2
else
  [ -x "$VENV/bin/python" ] || step "creating $VENV with $PY" "$PY" -m venv "$VENV"
  step "updating pip" "$VENV/bin/python" -m pip install --upgrade pip
  # torch first, the CPU build pinned, so nothing later pulls a multi-GB CUDA build
  step "installing torch 2.13.0 (CPU build)" "$VENV/bin/python" -m pip install torch==2.13.0
  step "installing gptedge[$EXTRAS] (editable)" "$VENV/bin/python" -m pip install -e ".[$EXTRAS]"
  echo "$WANT" >"$VENV/.gptedge-installed-$PROFILE"
fi
if [ -n "$NPM" ]; then
  finish npm
  [ -n "$DRY" ] || echo "$WEB_WANT" >"$WEB_STAMP"  # a dry run must not mark the repository's node_modules installed
fi
[ -z "$CHROMIUM" ] || finish chromium
