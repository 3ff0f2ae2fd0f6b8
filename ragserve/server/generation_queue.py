"""The answers in progress: up to ``concurrency`` run at once, each on its own worker thread (its RAG loop is ordinary
code; the generator's batcher steps all their decodes together), the rest wait in arrival order; ``max_pending``
queued or running is the limit past which a request gets 503."""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Callable, TypeVar

from ragserve.server.errors import ApiError
from ragserve.server.metrics import ServerMetrics

T = TypeVar("T")


class GenerationQueue:
    def __init__(self, max_pending: int, metrics: ServerMetrics, concurrency: int = 1) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="generator")
        self.concurrency = concurrency
        self._max_pending = max_pending
        self._pending = 0
        self._lock = threading.Lock()
        self._metrics = metrics

    @property
    def pending(self) -> int:
        return self._pending

    def submit(self, fn: Callable[[], T], bounded: bool = True) -> Future:
        """Queue ``fn``; 503 when ``max_pending`` jobs are already queued or running (``bounded``)."""
        with self._lock:
            if bounded and self._pending >= self._max_pending:
                raise ApiError(503, "busy", f"the generator queue is full ({self._max_pending} answers pending); "
                                            "retry later", headers={"Retry-After": "5"})
            self._pending += 1
            self._metrics.queue.set(self._pending)
        fut = self._pool.submit(fn)
        fut.add_done_callback(self._done)
        return fut

    def _done(self, _fut: Future) -> None:
        with self._lock:
            self._pending -= 1
            self._metrics.queue.set(self._pending)

    def run(self, fn: Callable[[], T], deadline: float) -> T:
        """Queue ``fn`` and wait for its result until ``deadline`` (``time.monotonic``), else 504."""
        fut = self.submit(fn)
        try:
            return fut.result(timeout=max(0.0, deadline - time.monotonic()))
        except FutureTimeout:
            raise timeout_error(fut) from None

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def timeout_error(fut: Future) -> ApiError:
    """Give up on ``fut``: a job still queued is dropped; a running one finishes and its result is discarded."""
    started = not fut.cancel()
    where = "while generating" if started else "while waiting in the generator queue"
    return ApiError(504, "timeout", f"the answer did not finish within the request timeout ({where})")
