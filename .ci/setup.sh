#!/usr/bin/env bash
# System packages the test suite needs, installed once per machine (idempotent: each step is skipped when present).
set -euo pipefail

# Headless Chromium for the web page's browser test (tests/test_server_web.py, driven by playwright).
if [ ! -x /usr/bin/chromium ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq chromium
fi
