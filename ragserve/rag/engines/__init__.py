"""Decode engines (``ragserve.rag.engine.DecodeEngine``) by architecture: ``engine_for`` picks the fast engine
registered for the model's ``config.model_type``, else the reference engine that runs any transformers causal LM.

A registered engine is ``"module:Class"``, imported on first use and built as
``Class(model, device, max_slots=..., max_length=...)`` from the loaded transformers model.
"""
from __future__ import annotations

import importlib

import torch

from ragserve.rag.decoding import GeneratorError
from ragserve.rag.engine import DecodeEngine

# model_type -> "module:Class" of its fast engine (imported on first use: its kernels load only when used)
ENGINES: dict[str, str] = {
    "gemma3_text": "ragserve.rag.engines.gemma3:Gemma3Engine",
}
ENGINE_KINDS = ("auto", "reference", "fast")


def engine_for(model: torch.nn.Module, device: str | None = None, *, kind: str = "auto", max_slots: int = 8,
               max_length: int | None = None, **options) -> DecodeEngine:
    """``kind``: ``auto`` (the fast engine of the model's type if there is one, else the reference), ``reference``
    or ``fast`` (an error when the type has none). ``device``: the model's own by default. ``options`` go to the
    fast engine (the Gemma 3 engine's ``gguf``, ``threads``, ...)."""
    if kind not in ENGINE_KINDS:
        raise GeneratorError(f"unknown engine {kind!r}; choose one of {', '.join(ENGINE_KINDS)}")
    if device is None:
        device = str(next(model.parameters()).device)
    model_type = getattr(model.config, "model_type", "")
    target = ENGINES.get(model_type) if kind != "reference" else None
    if target is None:
        if kind == "fast":
            raise GeneratorError(f"no fast decode engine for model type {model_type!r} "
                                 f"(engines exist for: {', '.join(sorted(ENGINES)) or 'none'})")
        if options:
            raise GeneratorError(f"the reference engine takes no options ({', '.join(sorted(options))})")
        from ragserve.rag.engines.reference import ReferenceEngine
        return ReferenceEngine(model, device, max_slots=max_slots, max_length=max_length)
    module, _, name = target.partition(":")
    cls = getattr(importlib.import_module(module), name)
    sizes = {"max_slots": max_slots} if max_length is None else {"max_slots": max_slots, "max_length": max_length}
    return cls(model, device, **sizes, **options)
