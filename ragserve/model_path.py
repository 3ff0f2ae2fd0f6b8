"""Checking a ``--model`` / ``--reranker`` argument before anything heavy is loaded, and the directory it names.

Local names come first and nothing reaches a hub: a directory, an installed short name (``gemma-270m``,
``minilm``: ``ragserve.models``) or a hub id already in the local Hugging Face cache. Anything else fails in one line
at once, where the hub client would retry for a minute and then answer with an unrelated message."""
from __future__ import annotations

from ragserve.models import ModelError, resolve_model

CONFIG = "config.json"


def model_dir(model: str) -> str:
    """The model directory ``model`` names (a path, a short name or a cached hub id); ``ModelError`` (one line)
    when it names none, or a folder without a ``config.json``."""
    p = resolve_model(model)
    if not p.is_dir():
        raise ModelError(f"{model} is a file, not a model directory")
    if not (p / CONFIG).is_file():
        raise ModelError(f"{model}: no {CONFIG} there, so not a model directory")
    return str(p)


def model_path_problem(model: str) -> str | None:
    """Why ``model`` names no loadable model directory, or None."""
    try:
        model_dir(model)
    except ModelError as e:
        return str(e)
    return None
