"""What every attention method shares: its settings, the four stages of the memory pipeline and their timing.

A decode step of one layer, for B sequences with Hq query heads in G KV groups (GQA, g = Hq / G heads a group):
- prepare: build or extend the method's index of the KV cache (index keys, page bounds, pooled keys);
- relevancy: score the index's units (tokens, pages or blocks) against the step's queries, one row of unit scores
  per KV group (a selection is shared by the query heads of its group);
- retrieval: pick units: the sink and local-window units always, the best others by score up to the budget
  (``topk_rows``: ties go to the earlier unit), and expand them into token positions;
- apply: attention of each query head over its group's selected tokens only.

Arrays are numpy (the CPU kernels) or torch tensors on any device (the GPU path); ``ops_for`` picks the kernels
from the arrays' type. Shapes: q [B, Hq, D], keys/values [B, G, N, D].
"""
from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from dataclasses import replace
from typing import Any, ClassVar

from ragserve.attention.common import AttentionError, Index, Relevancy, Selection, SparseConfig
from ragserve.attention.ops import ops_for
from ragserve.kernels.contract import StageTimes


class Method(ABC):
    """One attention method, split by the pipeline's stages. Subclasses set ``name`` and the unit they select."""

    name: ClassVar[str]
    sparse: ClassVar[bool] = True

    def __init__(self, config: SparseConfig | None = None, ops=None, **options) -> None:
        """``ops``: the kernels to run on (default: by the arrays' type, see ``ops_for``); ``options`` override
        fields of ``config``."""
        try:
            self.config = replace(config or SparseConfig(), **options)
        except TypeError as e:
            raise AttentionError(str(e)) from None
        self.config.validate()
        self._ops = ops

    def ops(self, x):
        return self._ops if self._ops is not None else ops_for(x)

    @property
    def unit(self) -> int:
        """Tokens per unit of selection."""
        return 1

    # -- the stages ---------------------------------------------------------------------------------
    def prepare(self, keys, index: Index | None = None) -> Index:
        """The index of ``keys`` [B, G, N, D]; given the index of a prefix of them, only the units from the first
        one the new tokens touch are rebuilt, in place in the index's spare room (a decode step's update: its cost
        follows the new tokens, not the context; the room doubles when it runs out)."""
        ops = self.ops(keys)
        n = keys.shape[-2]
        u0 = 0 if index is None or index.n > n else index.n // self.unit
        built = self.build(ops, keys, u0)
        if u0 == 0:
            return Index(n, built)
        arrays, room = {}, {}
        for name, a in built.items():
            store = index.room.get(name, index.arrays[name])
            end = u0 + a.shape[-2]
            if store.shape[-2] < end:
                store = ops.grow(store, u0, 2 * end)
            store[..., u0:end, :] = a
            arrays[name], room[name] = store[..., :end, :], store
        return Index(n, arrays, room)

    def build(self, ops, keys, u0: int) -> dict[str, Any]:
        """Index arrays of units ``u0`` onwards."""
        return {}

    @abstractmethod
    def relevancy(self, index: Index, q, keys, key_valid=None) -> Relevancy:
        """Unit scores of the step's queries q [B, Hq, D]; ``key_valid`` [B, N] marks attendable tokens."""

    def retrieval(self, rel: Relevancy, n: int) -> Selection:
        """The sink and local units, and the best others up to the budget, as token positions."""
        ops = self.ops(rel.scores)
        sink, local, k = self.plan(n)
        num_units = rel.scores.shape[-1]
        top = rel.top if rel.top is not None else ops.top_units(rel.scores[..., sink:num_units - local], k, sink)
        return ops.expand_units(top, self.keep(ops, rel, top), sink, local, num_units, self.unit, n)

    def apply(self, q, keys, values, sel: Selection, scale: float, key_valid=None):
        """Attention of q [B, Hq, D] over the selected tokens of its group: [B, Hq, D]."""
        return self.ops(q).attend_selected(q, keys, values, sel.tokens, sel.valid, scale, key_valid)

    # -- helpers ----------------------------------------------------------------------------------------
    def num_units(self, n: int) -> int:
        return -(-n // self.unit)

    @property
    def min_budget(self) -> int:
        """The smallest budget that works at every context (see ``SparseConfig.min_budget``)."""
        return self.config.min_budget(self.unit) if self.sparse else 1

    def check_budget(self) -> None:
        """Raise unless the budget works at every context (a decoder's context grows past it)."""
        if self.config.budget < self.min_budget:
            raise AttentionError(f"{self.name}: budget {self.config.budget} is below {self.min_budget} tokens, "
                                 f"the sink ({self.config.sink}) and local ({self.config.local}) tokens in "
                                 f"units of {self.unit} plus one unit")

    def plan(self, n: int) -> tuple[int, int, int]:
        """(sink units, local units, units to pick by score) for a cache of ``n`` tokens."""
        if self.config.budget < n:
            self.check_budget()
        u = self.num_units(n)
        sink = min(math.ceil(self.config.sink / self.unit), u)
        local = min(math.ceil(self.config.local / self.unit), u - sink)
        if self.config.budget >= n:
            total = u
        else:
            last = n - (u - 1) * self.unit  # tokens in the last (possibly partial) unit
            total = (self.config.budget - last) // self.unit + 1 if self.config.budget >= last else 0
        return sink, local, max(0, min(total, u) - sink - local)

    def keep(self, ops, rel: Relevancy, top):
        """Which of the ``top`` units to attend (None: all of them)."""
        return None

    def step(self, q, keys, values, scale: float, index: Index | None = None, key_valid=None,
             times: StageTimes | None = None, sync=None) -> tuple[Any, Selection | None, Index]:
        """One decode step through the four stages, timing each into ``times`` (``sync`` waits for the device)."""
        clock = _Clock(times, sync)
        index = self.prepare(keys, index)
        clock.lap("prepare")
        rel = self.relevancy(index, q, keys, key_valid)
        clock.lap("relevancy")
        sel = self.retrieval(rel, keys.shape[-2])
        clock.lap("retrieval")
        out = self.apply(q, keys, values, sel, scale, key_valid)
        clock.lap("apply")
        return out, sel, index


class _Clock:
    def __init__(self, times: StageTimes | None, sync) -> None:
        self.times, self.sync = times, sync
        self.t = self._now()

    def _now(self) -> float:
        if self.sync is not None:
            self.sync()
        return time.perf_counter()

    def lap(self, stage: str) -> None:
        if self.times is None:
            return
        t = self._now()
        setattr(self.times, stage, getattr(self.times, stage) + t - self.t)
        self.t = t
