"""Methods by name (as transformers and vLLM keep attention backends): the built-in ones, and any registered later."""
from __future__ import annotations

from ragserve.attention.base import Method
from ragserve.attention.common import AttentionError, SparseConfig
from ragserve.attention.methods import Dense, Dsa, LServe, Quest, SeerThreshold, SeerTopK
from ragserve.attention.names import METHOD_NAMES

_METHODS: dict[str, type[Method]] = {}


def register_method(cls: type[Method]) -> None:
    _METHODS[cls.name] = cls


for _cls in (Dense, Dsa, Quest, LServe, SeerTopK, SeerThreshold):
    register_method(_cls)
assert tuple(_METHODS) == METHOD_NAMES, "names.METHOD_NAMES lists the built-in methods"


def method_names() -> list[str]:
    return list(_METHODS)


def get_method(name: str, config: SparseConfig | None = None, **options) -> Method:
    """A method by name; ``options`` override the fields of ``config`` (budget, page_size, ...)."""
    if name not in _METHODS:
        raise AttentionError(f"unknown attention method {name!r}; choose one of: {', '.join(_METHODS)}")
    return _METHODS[name](config, **options)
