"""The machine a benchmark ran on, as its reports name it: one copy for every script (figures name the CPU)."""
from __future__ import annotations

import platform
import subprocess
from pathlib import Path


def cpu_model() -> str:
    """The host CPU's model name from /proc/cpuinfo; platform's processor or machine string where there is none."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def gpu_name() -> str | None:
    """The first GPU as nvidia-smi names it ("name, memory.total"), or None without one (or without nvidia-smi)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[0] if out.returncode == 0 and lines else None
