"""Runs validated search requests on the ``Searcher`` and records their stage times."""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Iterator

from ragserve.distributed.errors import ShardsUnavailable
from ragserve.kernels.contract import SearchError, StageTimes
from ragserve.retrieval.searcher import Hit, Searcher
from ragserve.server.errors import ApiError, invalid
from ragserve.server.metrics import ServerMetrics
from ragserve.server.validation import SearchRequest


class SearchService:
    """One shared ``Searcher`` called by at most ``slots`` requests at once: the CPU backend is thread-safe
    (per-call scratch buffers) but CPU-bound, so more callers than cores only add memory; a device backend
    gets one slot. A request that cannot get a slot before its deadline gets 504."""

    def __init__(self, searcher: Searcher, metrics: ServerMetrics, slots: int) -> None:
        if slots < 1:
            raise ValueError("slots must be at least 1")
        self.searcher = searcher
        self.metrics = metrics
        self._slots = threading.BoundedSemaphore(slots)

    @contextmanager
    def _backend(self, deadline: float) -> Iterator[None]:
        if not self._slots.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise ApiError(504, "timeout", "the search backend stayed busy past the request timeout")
        try:
            yield
        finally:
            self._slots.release()

    def search(self, req: SearchRequest, deadline: float,
               missing: set[int] | None = None) -> tuple[list[list[Hit]], StageTimes]:
        """``missing`` (with ``req.partial``): the shards a sharded searcher could not reach are added to it."""
        times = StageTimes()
        # Only a sharded searcher can miss shards; a local one always searches them all.
        extra = {"missing": missing} if req.partial and getattr(self.searcher, "can_miss_shards", False) else {}
        with self._backend(deadline):
            try:
                hits = self.searcher.search_batch(req.queries, k=req.k, k1=req.k1, b=req.b, times=times, **extra)
            except SearchError as e:  # the request checks cover these; kept so a backend's own limit is a 400
                raise invalid("query", str(e)) from None
            except ShardsUnavailable as e:
                raise ApiError(503, "shards_unavailable", f'{e} ("partial": true)', headers={"Retry-After": "5"}
                               ) from None
        self.record(times, len(req.queries))
        return hits, times

    def record(self, times: StageTimes, n_queries: int) -> None:
        m = self.metrics
        m.queries.inc(n_queries)
        for stage in ("prepare", "relevancy", "retrieval"):
            m.search_stage.inc(getattr(times, stage), stage=stage)
        m.retrieval.observe(times.prepare + times.relevancy + times.retrieval)
