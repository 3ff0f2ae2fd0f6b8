"""Runs validated search requests on the server's retriever; records their stage times and the launches they share."""
from __future__ import annotations

import threading
import time

from ragserve.kernels.contract import SearchError, ShardsUnavailable, StageTimes
from ragserve.retrieval.contract import Hit, Retriever
from ragserve.retrieval.queue import Launch, QueueClosed, QueueTimeout
from ragserve.server.errors import ApiError, invalid
from ragserve.server.metrics import ServerMetrics
from ragserve.server.validation import SearchRequest


class SearchService:
    """``/v1/search`` on the shared searcher. A local ``Searcher``'s queue (which ``/v1/answer`` retrievals use
    too) decides how calls reach the backend: a device backend batches concurrent requests into one launch, the
    CPU backend runs up to one call per core. A searcher without a queue (the Ray ``DistributedSearcher``, whose
    shard-group actors take one call at a time) is called by at most ``slots`` requests at once. A request whose
    search has not started by its deadline gets 504."""

    def __init__(self, searcher: Retriever, metrics: ServerMetrics, slots: int = 1) -> None:
        if slots < 1:
            raise ValueError("slots must be at least 1")
        self.searcher = searcher
        self.metrics = metrics
        queue = getattr(searcher, "queue", None)
        self._slots = threading.BoundedSemaphore(slots) if queue is None else None
        if queue is not None:
            queue.add_listener(self._launched)

    def search(self, req: SearchRequest, deadline: float,
               missing: set[int] | None = None) -> tuple[list[list[Hit]], StageTimes]:
        """``missing`` (with ``req.partial``): the shards a sharded searcher could not reach are added to it."""
        times = StageTimes()
        # Only a sharded searcher can miss shards; a local one always searches them all.
        extra = {"missing": missing} if req.partial and getattr(self.searcher, "can_miss_shards", False) else {}
        if req.retriever is not None:  # the server's RetrieverSet picks it; None: its default
            extra["retriever"] = req.retriever
        if self._slots is None:
            extra["deadline"] = deadline
        elif not self._slots.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise ApiError(504, "timeout", "the search backend stayed busy past the request timeout")
        try:
            hits = self.searcher.search_batch(req.queries, k=req.k, k1=req.k1, b=req.b, times=times, **extra)
        except SearchError as e:  # the request checks cover these; kept so a backend's own limit is a 400
            raise invalid("query", str(e)) from None
        except ShardsUnavailable as e:
            raise ApiError(503, "shards_unavailable", f'{e} ("partial": true)', headers={"Retry-After": "5"}
                           ) from None
        except QueueTimeout:
            raise ApiError(504, "timeout", "the search backend stayed busy past the request timeout") from None
        except QueueClosed:
            raise ApiError(503, "shutting_down", "the server is shutting down") from None
        finally:
            if self._slots is not None:
                self._slots.release()
        self.record(times, len(req.queries))
        return hits, times

    def record(self, times: StageTimes, n_queries: int) -> None:
        m = self.metrics
        m.queries.inc(n_queries)
        for stage in ("prepare", "relevancy", "retrieval"):
            m.search_stage.inc(getattr(times, stage), stage=stage)
        m.retrieval.observe(times.prepare + times.relevancy + times.retrieval)

    def _launched(self, launch: Launch) -> None:
        m = self.metrics
        m.launch_queries.observe(launch.queries)
        m.launch_requests.observe(launch.requests)
        for w in launch.waits:
            m.queue_wait.observe(w)
