#!/usr/bin/env bash
# Set up (venv, pinned packages, system packages the tests need) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
bash .ci/setup.sh
exec .venv/bin/python -m pytest -q -p no:cacheprovider --durations=30 "$@"
