"""Decode engines (``ragserve.rag.engine.DecodeEngine``) by model type: ``engine_for`` picks the fast one for an
architecture from ``ENGINES``.

Minimal registry of branch b1 (the Gemma 3 engine); the reference engine and its fallback come with the
continuous-batching branch, which owns this file's final form.
"""
from __future__ import annotations

import importlib

import torch

# model_type -> "module:Class" of its engine (imported on first use: an engine's kernels load only when used)
ENGINES: dict[str, str] = {
    "gemma3_text": "ragserve.rag.engines.gemma3:Gemma3Engine",
}


def engine_for(model: torch.nn.Module, device: str | None = None, **options):
    """The registered engine of ``model.config.model_type``, built over ``model`` with ``options``."""
    kind = getattr(model.config, "model_type", None)
    target = ENGINES.get(kind)
    if target is None:
        from ragserve.rag.generator import GeneratorError

        raise GeneratorError(f"no decode engine for model type {kind!r}")
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)(model, device=device, **options)
