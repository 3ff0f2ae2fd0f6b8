"""Sparse attention on the memory-processing kernels: methods registered by name behind one interface, as
transformers and vLLM keep attention backends. See ``base.Method`` for the stages and ``hf`` for the decoder hook."""
from __future__ import annotations

from ragserve.attention.base import Method
from ragserve.attention.common import AttentionError, Index, Relevancy, Selection, SparseConfig
from ragserve.attention.methods import Dense, Dsa, LServe, Quest, SeerThreshold, SeerTopK

_METHODS: dict[str, type[Method]] = {}


def register_method(cls: type[Method]) -> None:
    _METHODS[cls.name] = cls


for _cls in (Dense, Dsa, Quest, LServe, SeerTopK, SeerThreshold):
    register_method(_cls)

METHOD_NAMES = tuple(_METHODS)


def method_names() -> list[str]:
    return list(_METHODS)


def get_method(name: str, config: SparseConfig | None = None, **options) -> Method:
    """A method by name; ``options`` override the fields of ``config`` (budget, page_size, ...)."""
    if name not in _METHODS:
        raise AttentionError(f"unknown attention method {name!r}; choose one of: {', '.join(_METHODS)}")
    return _METHODS[name](config, **options)


__all__ = ["AttentionError", "Index", "Method", "Relevancy", "Selection", "SparseConfig", "METHOD_NAMES",
           "get_method", "method_names", "register_method"]
