#!/usr/bin/env bash
# Set up (venv, pinned packages, system packages the tests need) and run the whole test suite, on two pytest-xdist
# workers: many tests wait on servers and subprocesses, so two workers finish well inside CI's 10 minutes on two
# cores. Each test module runs whole on one worker and the shared indexes are built once (tests/conftest.py).
# Arguments go to pytest after these: `scripts/test.sh -n 0` runs in one process, `scripts/test.sh -m slow` only the
# long end-to-end checks (they run in the default run too).
set -euo pipefail
cd "$(dirname "$0")/.."
# Debian's chromium (the browser test's) downloads and unpacks while the venv installs: both wait mostly on the
# network and the disk. A failed apt install stops the run here, as it would in .ci/setup.sh.
apt_pid=
if [ ! -x /usr/bin/chromium ]; then
  bash scripts/apt_install.sh chromium &
  apt_pid=$!
fi
bash scripts/setup.sh dev
if [ -n "$apt_pid" ]; then
  wait "$apt_pid"
fi
bash .ci/setup.sh
exec .venv/bin/python -m pytest -q -p no:cacheprovider --durations=30 -n 2 --dist loadgroup "$@"
