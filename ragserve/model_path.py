"""Checking a ``--model`` / ``--reranker`` argument before anything heavy is loaded: a path that is not a model
directory would otherwise reach the Hugging Face hub client, which answers seconds later with an unrelated
"Repo id must be in the form ..."."""
from __future__ import annotations

import re
from pathlib import Path

# A hub id: "name" or "org/name" (the form transformers looks up in the local cache).
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")
CONFIG = "config.json"


def model_path_problem(model: str) -> str | None:
    """Why ``model`` names no loadable model, or None: a local directory with a ``config.json``, or a hub id
    that is not a local path (left to the loader, which looks in the local cache)."""
    p = Path(model).expanduser()
    if p.is_dir():
        return None if (p / CONFIG).is_file() else f"{model}: no {CONFIG} there, so not a model directory"
    if p.exists():
        return f"{model} is a file, not a model directory"
    if not _HUB_ID.fullmatch(model):
        return f"no model directory at {model}"
    return None
