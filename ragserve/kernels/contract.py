"""What every retrieval backend shares: the ``Backend`` interface, its result (``TopK``), stage timings and errors;
and what every device's attention kernels return (``Relevancy``, ``Selection``) or raise (``AttentionError``).

The memory pipeline's stages, and where each backend draws the line between the two it times:
- prepare: analysing the query into weighted terms (the searcher; backends never time it);
- relevancy: the device's scoring pass, with whatever running selection is fused into it (the CPU's block heap,
  the GPU's running threshold, the FPGA kernel's on-chip top-k);
- retrieval: everything after it up to the ranked ids and scores (the k-th score, collecting and ranking the
  candidates, the read-back, merging shards), and then fetching the passages (the searcher);
- apply: building the prompt and generating (the RAG loop).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from indexer.bm25 import QueryTerms
from indexer.reader import IndexReader

MAX_K = 10_000  # the largest k any retriever answers; a backend may declare less (``Backend.max_k``)


class SearchError(ValueError):
    """Bad search input (empty query, k out of range, bad k1/b): callers turn it into a 4xx / exit 2."""


class ShardsUnavailable(RuntimeError):
    """Shard groups did not answer (a distributed replica died and is being restarted, or timed out): callers
    turn it into a 503 / exit 1, or ask for partial results."""

    def __init__(self, missing: list[int], reason: str) -> None:
        self.missing = sorted(missing)
        super().__init__(f"shards {', '.join(map(str, self.missing))} are unavailable ({reason}); retry once "
                         f"their replica is back, or ask for partial results")


@dataclass
class StageTimes:
    """Seconds spent in each stage of the memory pipeline (summed over calls when reused)."""

    prepare: float = 0.0
    relevancy: float = 0.0
    retrieval: float = 0.0
    apply: float = 0.0

    def add(self, other: "StageTimes") -> None:
        self.prepare += other.prepare
        self.relevancy += other.relevancy
        self.retrieval += other.retrieval
        self.apply += other.apply

    def to_dict(self) -> dict:
        return {"prepare": self.prepare, "relevancy": self.relevancy, "retrieval": self.retrieval, "apply": self.apply}


@dataclass
class TopK:
    """A backend's answer for one query: internal docids and f32 scores, best first."""

    docids: np.ndarray  # int64
    scores: np.ndarray  # float32

    def same_as(self, other: "TopK") -> bool:
        """The same docids and the same score bits: the parity every backend is held to."""
        return (np.array_equal(self.docids, other.docids)
                and np.array_equal(self.scores.view(np.uint32), other.scores.view(np.uint32)))


class Backend(ABC):
    """A retrieval engine over one index layout, registered by name in ``ragserve.kernels.registry``.

    ``thread_safe`` says whether two threads may call ``search_terms`` at once. Backends that keep per-call
    device state (GPU buffers and graphs, the FPGA's on-chip accumulator) are not, and their callers go
    through one queue per backend (``ragserve.retrieval.queue``).
    """

    name: ClassVar[str]
    thread_safe: ClassVar[bool] = False
    max_k: ClassVar[int] = MAX_K  # the largest k ``search_terms`` answers (the FPGA kernel's top-k holds 1024)

    def __init__(self, index: IndexReader, **options) -> None:
        self.index = index

    @classmethod
    def is_available(cls) -> tuple[bool, str]:
        """(usable here, reason if not)."""
        return True, ""

    @abstractmethod
    def search_terms(self, queries: list[QueryTerms], k: int, k1: float, b: float,
                     times: StageTimes | None = None, avgdl: float | None = None) -> list[TopK]:
        """Exact BM25 top-k of each analysed query, scores as ``indexer/FORMAT.md`` defines them.

        ``times``, when given, gains this call's ``relevancy`` and ``retrieval`` seconds (see the module's
        docstring for where the line falls); timing must never change the path a query takes. ``avgdl`` (an f32
        value) replaces the index's own average length in the norm cache: a segment of a live index is scored
        with the whole live collection's (``indexer/segments.py``), as the weights already carry its idf.
        """

    def describe(self) -> dict:
        return {"backend": self.name}

    def close(self) -> None:
        """Release device memory or handles."""


# -- the attention kernels' results (``kernels/<device>/attention.py``) ---------------------------------------
class AttentionError(ValueError):
    """Bad attention settings or inputs: callers turn it into exit 2 / a 4xx."""


@dataclass
class Relevancy:
    """Unit scores [B, Gs, U] (Gs = G, or 1 when one selection serves every group), and the top units of the
    middle range when the device fused the selection into scoring (the FPGA kernel), else None."""

    scores: Any
    top: Any = None
    scale: float = 1.0  # what turns a score into a logit (a gate's softmax uses it)


@dataclass
class Selection:
    """Tokens attended per (sequence, selection group): ``tokens`` [B, Gs, S] ascending, ``valid`` [B, Gs, S]
    (False on padding: past the end of the cache, or a block under the threshold); ``top`` [B, Gs, k] the units
    chosen by score, best first (sink and local units excluded). The Triton path leaves both unordered."""

    tokens: Any
    valid: Any
    top: Any

    def counts(self):
        """Tokens attended per [B, Gs]."""
        return self.valid.sum(-1)
