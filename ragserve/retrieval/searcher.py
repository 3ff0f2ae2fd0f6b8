"""``Searcher``: BM25 retrieval from one index over any registered backend of the kernel library.

A search is the memory pipeline's first three stages:
prepare (analyse the query into weighted terms) -> compute relevancy (BM25 scoring, backend kernel)
-> retrieval (exact top-k, then the hits' external ids). The fourth stage, apply, belongs to the caller
(the RAG loop builds a prompt from the hits); a hit reads its stored passage when the caller first asks for it.

Every search reaches the backend through the searcher's queue (``ragserve.retrieval.queue``), so all callers of
one ``Searcher`` (server threads, RAG loops, the CLI) share it: a device backend never sees two at once, and
requests that arrive together share a launch.

``Hit`` and ``MAX_K`` are the retrieval contract's (``ragserve.retrieval.contract``), named here too for callers
that import them from the searcher.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from indexer.bm25 import QueryTerms
from indexer.reader import IndexReader
from ragserve.kernels.contract import SearchError, StageTimes
from ragserve.kernels.registry import get_backend_class, resolve_backend_name
from ragserve.retrieval.contract import MAX_K, Hit, Retriever, bm25_params, hits_of
from ragserve.retrieval.prepare import QueryPreparer
from ragserve.retrieval.queue import QueueSettings, queue_for

__all__ = ["Hit", "MAX_K", "Searcher", "hits_of"]


class Searcher(Retriever):
    """Analyse, score, rank and fetch passages from one index with the chosen backend (exact on every one)."""

    kind = "bm25"
    exact = True
    takes_bm25_params = True

    def __init__(self, index: str | Path | IndexReader, backend: str = "cpu", queue: QueueSettings | None = None,
                 **backend_options) -> None:
        self.index = index if isinstance(index, IndexReader) else IndexReader(index)
        self.backend_name = resolve_backend_name(backend)
        cls = get_backend_class(self.backend_name)
        self.backend = cls(self.index, **backend_options)
        self.queue = queue_for(self.backend, queue)
        self.analyzer = self.index.analyzer
        self._prepare = QueryPreparer(self.index)

    @property
    def max_k(self) -> int:
        return min(MAX_K, self.backend.max_k)

    @property
    def manifest(self) -> dict:
        return self.index.manifest

    @property
    def _idf(self) -> np.ndarray:
        return self._prepare.idf

    # -- prepare ----------------------------------------------------------------------------
    def analyze(self, query: str) -> QueryTerms:
        """Distinct query terms ascending by id, boosted by their count in the query (pyserini's rule)."""
        if not isinstance(query, str):
            raise SearchError("query must be a string")
        return self._prepare(query)

    # -- search -----------------------------------------------------------------------------
    def _search_batch(self, queries: list[str], k: int, k1: float | None, b: float | None, with_text: bool,
                      times: StageTimes | None, deadline: float | None = None) -> list[list[Hit]]:
        """The batch goes to the backend in one launch (shared with concurrent callers'). ``deadline``
        (``time.monotonic``): ``QueueTimeout`` if the launch has not started by then. The backend times its own
        stages only when asked."""
        k1, b = bm25_params(self.index, k1, b)
        t0 = time.perf_counter_ns()
        analysed = [self._prepare(q) for q in queries]
        t1 = time.perf_counter_ns()
        results = self.queue.run(analysed, k, k1, b, times, deadline)
        t2 = time.perf_counter_ns()
        index = self.index
        hits = [hits_of(index, r, with_text) for r in results]
        if times is not None:
            times.prepare += (t1 - t0) * 1e-9
            times.retrieval += (time.perf_counter_ns() - t2) * 1e-9
        return hits

    def close(self) -> None:
        """Finish the queued searches, refuse new ones, release the backend."""
        self.queue.close()
        self.backend.close()
