#!/usr/bin/env bash
# Create .venv and install ragserve with every pinned dependency (requirements.lock) from the package registry.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# The lock file pins the whole dependency tree; pyproject.toml pins the direct dependencies.
.venv/bin/python -m pip install -q --disable-pip-version-check -c requirements.lock -e ".[dev,ray]"
