"""The set-up scripts: setup.sh says what it installs (runtime for the demo, dev for the tests), and the test
prerequisites are installed through sudo when not root, or named when that cannot be done."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("what, target", [("runtime", "-e .[models]"), ("dev", "-e .[dev,models,ray]")])
def test_setup_says_what_it_installs(what, target):
    r = subprocess.run(["bash", "scripts/setup.sh", what], cwd=REPO, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "DRY_RUN": "1"})
    assert r.returncode == 0, r.stderr
    announce, command = r.stdout.strip().splitlines()
    assert announce.startswith("setup: installing") and "GB" in announce and "minutes" in announce
    assert "into .venv" in announce and "models' packages" in announce
    # uv, the version the lock pins, installs into the venv's interpreter; INSTALLER=pip (and uv's fallback) pip
    assert command == f".venv/bin/uv pip install --python .venv/bin/python -c requirements.lock {target}"
    assert "uv==0.13.9" in (REPO / "requirements.lock").read_text().splitlines()
    r = subprocess.run(["bash", "scripts/setup.sh", what], cwd=REPO, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "DRY_RUN": "1", "INSTALLER": "pip"})
    assert r.stdout.strip().splitlines()[1] == f".venv/bin/python -m pip install --disable-pip-version-check " \
                                               f"--progress-bar off -c requirements.lock {target}"
    # VENV= makes another venv the same way (.ci/setup.sh: the runtime-only venv of tests/test_runtime_install.py)
    r = subprocess.run(["bash", "scripts/setup.sh", what], cwd=REPO, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "DRY_RUN": "1", "VENV": ".venv-runtime"})
    assert r.stdout.strip().splitlines()[1].startswith(".venv-runtime/bin/uv pip install --python "
                                                       ".venv-runtime/bin/python ")
    r = subprocess.run(["bash", "scripts/setup.sh", "everything"], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 2 and "usage: bash scripts/setup.sh [runtime|dev]" in r.stderr


@pytest.fixture
def shims(tmp_path):
    """A bin folder with a fake `id` (a non-root user) and fake `sudo` / `apt-get` that log their arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"

    def shim(name: str, body: str) -> None:
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)

    shim("id", "echo 1000")
    shim("apt-get", f'echo "apt-get $*" >> {log}')
    return bin_dir, log, shim


def test_apt_install_uses_sudo_when_not_root(shims):
    bin_dir, log, shim = shims
    shim("sudo", f'echo "sudo $*" >> {log}')
    r = subprocess.run(["/bin/bash", str(REPO / "scripts" / "apt_install.sh"), "chromium"], capture_output=True,
                       text=True, env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    assert log.read_text().splitlines() == [
        "sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq",
        "sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium"]


def test_apt_install_without_sudo_says_what_to_install(shims):
    bin_dir, log, _ = shims
    if any((Path(d) / "sudo").exists() for d in ("/usr/bin", "/bin")):
        pytest.skip("sudo is installed system-wide here")
    r = subprocess.run(["/bin/bash", str(REPO / "scripts" / "apt_install.sh"), "chromium"], capture_output=True,
                       text=True, env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert r.returncode == 1 and not log.exists()
    assert "no sudo" in r.stderr and "apt-get install -y chromium" in r.stderr
