#!/usr/bin/env bash
# Install Debian packages: directly as root, through sudo for another user when sudo is there; otherwise say
# what to install and fail (the caller stops).   bash scripts/apt_install.sh PACKAGE...
set -euo pipefail
SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null 2>&1; then
    echo "apt_install: installing $* needs root and there is no sudo here; as root, run:" >&2
    echo "  apt-get update && apt-get install -y $*" >&2
    exit 1
  fi
  SUDO=(sudo)
fi
echo "apt_install: ${SUDO[*]:+${SUDO[*]} }apt-get install $*"
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"
