"""Shared test fixtures: where ../shared/data is, and small indexes built once per session."""
from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def shared(*parts: str) -> Path:
    """Path of a file in ../shared/data; skips the test only if the shared folder is absent entirely."""
    p = SHARED_DATA.joinpath(*parts)
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data is not present")
    assert p.exists(), f"missing shared data file {p}"
    return p
