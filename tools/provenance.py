"""The tree a benchmark measured, recorded in its JSON: one helper for every scripts/bench_*.py.

A commit alone is not enough: a copied tree may carry a stale ``.git`` (the H200 runs once recorded a commit
other than the code they ran), or uncommitted edits. So a report records
- ``files_sha256``: a hash of the code's files themselves (paths and bytes of ``CODE``, build outputs left out),
  the same with or without ``.git``: two runs of the same code give the same hash on any machine;
- ``commit``: ``git rev-parse HEAD`` where there is a ``.git`` (else None);
- ``dirty``: whether those files differ from that commit (``git status``), None without git.
Outputs (benchmarks/, runs, indexes) are not part of the hash: adding a result does not change the tree measured.
"""
from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CODE = ("ragserve", "indexer", "hls_bm25", "scripts", "tools", "tests", ".ci", "pyproject.toml", "requirements.lock")
SKIP_DIRS = {"__pycache__", "build", ".pytest_cache"}


def code_files(root: Path = REPO) -> list[Path]:
    out = []
    for top in CODE:
        p = root / top
        if p.is_file():
            out.append(p)
        elif p.is_dir():
            out.extend(f for f in p.rglob("*") if f.is_file() and not SKIP_DIRS.intersection(f.relative_to(root).parts)
                       and f.suffix != ".pyc")
    return sorted(out)


def files_sha256(root: Path = REPO) -> str:
    h = hashlib.sha256()
    for f in code_files(root):
        h.update(f.relative_to(root).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


def _git(root: Path, *args: str) -> str | None:
    try:
        r = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout if r.returncode == 0 else None


def tree_state(root: Path = REPO) -> dict:
    """{"commit", "dirty", "files_sha256"} of the tree at ``root`` (see the module's docstring)."""
    commit = _git(root, "rev-parse", "HEAD") if (root / ".git").exists() else None
    status = _git(root, "status", "--porcelain", "--", *CODE) if commit else None
    return {"commit": commit.strip() if commit else None,
            "dirty": None if status is None else bool(status.strip()),
            "files_sha256": files_sha256(root)}


def stamp(report: dict, root: Path = REPO) -> dict:
    """``report`` with the measured tree under "tree" (what every benchmark JSON carries)."""
    return {**report, "tree": tree_state(root)}
