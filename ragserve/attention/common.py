"""The data the attention methods and their callers share: settings and index; the kernels' results (scores,
selection) and error come from the kernel library's contract, where the kernels that produce them can see them."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ragserve.kernels.contract import AttentionError, Relevancy, Selection

__all__ = ["AttentionError", "Index", "Relevancy", "Selection", "SparseConfig"]


@dataclass(frozen=True)
class SparseConfig:
    """Settings shared by the methods (each uses the ones it needs).

    ``budget``: tokens attended per KV group, sink and local window included (a page method counts whole pages, the
    last one with the tokens it holds). ``sink`` / ``local``: the first / last tokens always attended, rounded up to
    whole units. ``threshold``: seer-threshold keeps a block when its gate probability (softmax over the blocks of
    the gate scores) is at least this, the budget being the cap.
    """

    budget: int = 2048
    page_size: int = 16
    block_size: int = 64
    sink: int = 16
    local: int = 64
    threshold: float = 1e-3

    def validate(self) -> None:
        for name in ("budget", "page_size", "block_size"):
            if getattr(self, name) < 1:
                raise AttentionError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.sink < 0 or self.local < 0:
            raise AttentionError("sink and local must be >= 0")
        if not 0.0 <= self.threshold <= 1.0:
            raise AttentionError(f"threshold must be in [0, 1], got {self.threshold}")

    def min_budget(self, unit: int) -> int:
        """The smallest budget that selects anything once the context outgrows it: the sink and local units
        and one more."""
        return (math.ceil(self.sink / unit) + math.ceil(self.local / unit) + 1) * unit


@dataclass
class Index:
    """A method's index of the first ``n`` cached tokens: named arrays, units along axis -2 (or none). ``room``
    holds the arrays' backing stores, longer than the units in use, that decode steps fill in place."""

    n: int
    arrays: dict[str, Any] = field(default_factory=dict)
    room: dict[str, Any] = field(default_factory=dict)
