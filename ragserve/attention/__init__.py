"""Sparse attention on the memory-processing kernels: methods registered by name behind one interface, as
transformers and vLLM keep attention backends. See ``base.Method`` for the stages and ``hf`` for the decoder hook.

Importing the package is light (the command line lists ``METHOD_NAMES``); the rest loads torch on first use.
"""
from __future__ import annotations

from ragserve.attention.names import METHOD_NAMES

_LAZY = {"AttentionError": "common", "Index": "common", "Relevancy": "common", "Selection": "common",
         "SparseConfig": "common", "Method": "base", "get_method": "registry", "method_names": "registry",
         "register_method": "registry"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"ragserve.attention.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'ragserve.attention' has no attribute {name!r}")


__all__ = ["METHOD_NAMES", *_LAZY]
