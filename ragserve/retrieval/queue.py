"""One execution queue per backend: every caller of a ``Searcher`` (the server's searches and answers, the RAG
loops, the CLI) reaches the backend through it.

A backend that keeps per-call device state (``Backend.thread_safe`` is False: GPU buffers and graphs, the FPGA's
on-chip accumulator) gets a ``DeviceQueue``: one launcher at a time owns the backend, and requests that arrive
while it is busy are batched into its next launch (dynamic batching), one ``search_terms`` call per group of
requests with the same ``(k, k1, b)``; each caller gets its own results and its share of the stage times.

The launcher is a caller's own thread, not a dedicated worker: an idle queue runs a lone request at once on the
thread that submitted it, so a single query pays no thread hand-off (~10 us each way in CPython, as much as
the GPU's whole single-query graph launch). When a launcher's own request is done it hands the role to the
oldest waiting caller, so no caller serves others for longer than its own launch takes.

A thread-safe backend (the CPU's per-call scratch) gets ``ParallelCalls``: each caller runs its own call, at
most ``parallel`` at once. Batching would buy it nothing: a CPU batch is its queries' work spread over a
thread pool, with no per-launch cost to share, and CPU-bound calls beyond the core count only add scratch
memory and stretch every call.
"""
from __future__ import annotations

import os
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from indexer.bm25 import QueryTerms
from ragserve.kernels.contract import Backend, StageTimes, TopK


class QueueTimeout(TimeoutError):
    """The caller's deadline passed before its request reached the backend."""


class QueueClosed(RuntimeError):
    """The searcher is shutting down: no new requests."""


@dataclass(frozen=True)
class QueueSettings:
    """How requests reach a backend (the server's ``--queue-*`` flags)."""

    # A launcher that has seen concurrent callers holds its launch open this long after the oldest waiting
    # request arrived, for more to join; a lone request on an idle queue never waits.
    max_wait_ms: float = 1.0
    # Most queries one launch takes (a larger single request still goes whole, alone); the backend chunks a
    # launch into its own device batches.
    max_batch: int = 64
    # Thread-safe backends: calls running at once (0: one per core).
    parallel: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.max_wait_ms <= 1000:
            raise ValueError(f"max_wait_ms must be between 0 and 1000, got {self.max_wait_ms}")
        if self.max_batch < 1 or self.parallel < 0:
            raise ValueError("max_batch must be at least 1 and parallel not negative")


@dataclass
class Launch:
    """One ``search_terms`` call, as listeners (the server's metrics) see it."""

    requests: int
    queries: int
    waits: list[float]  # seconds each request waited between submission and this launch


@dataclass(eq=False)
class _Request:
    queries: list[QueryTerms]
    key: tuple[int, float, float]  # (k, k1, b): requests batch together only when all three agree
    deadline: float | None  # time.monotonic()
    submitted: float
    state: str = "pending"  # -> "running" (in a launch) -> "done"
    lead: bool = False  # this caller is (or is to become) the launcher
    results: list[TopK] | None = None
    times: StageTimes | None = None
    error: BaseException | None = None
    wake: threading.Event = field(default_factory=threading.Event)


Listener = Callable[[Launch], None]


class DeviceQueue:
    """Dynamic batching in front of a backend that must never see two callers at once."""

    def __init__(self, backend: Backend, settings: QueueSettings | None = None) -> None:
        self.backend = backend
        self.settings = settings or QueueSettings()
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)  # a launcher holding its window waits on it
        self._pending: deque[_Request] = deque()
        self._leading = False  # a launcher exists (running, gathering, or woken to take over)
        self._closed = False
        self._idle = threading.Condition(self._lock)  # close() waits on it for the last launcher
        self._last_callers = 1  # callers in the previous launch: more than one means load
        self._listeners: list[Listener] = []

    def add_listener(self, fn: Listener) -> None:
        """``fn(launch)`` after every launch, on the launcher's thread; it must be quick and must not raise."""
        self._listeners.append(fn)

    @property
    def pending(self) -> int:
        """Requests waiting for a launch."""
        return len(self._pending)

    @property
    def closed(self) -> bool:
        return self._closed

    def describe(self) -> dict:
        s = self.settings
        return {"kind": "device", "max_wait_ms": s.max_wait_ms, "max_batch": s.max_batch}

    # -- callers ----------------------------------------------------------------------------------
    def run(self, queries: list[QueryTerms], k: int, k1: float, b: float, times: StageTimes | None = None,
            deadline: float | None = None) -> list[TopK]:
        """The backend's ``search_terms(queries, k, k1, b)``, in a launch shared with concurrent callers.

        ``times`` gains this request's share of the launch's stage times (by its number of queries). Raises
        ``QueueTimeout`` if ``deadline`` (``time.monotonic``) passes before the launch starts (a started one is
        waited for), ``QueueClosed`` after ``close``, and whatever the backend raised for this request.
        """
        if not queries:
            return []
        submitted = time.monotonic()
        with self._lock:
            if self._closed:
                raise QueueClosed("the search queue is closed")
            # Idle (nobody launching, so nothing queued) and no recent sign of load: launch at once, alone.
            alone = not self._leading and (self._last_callers == 1 or self.settings.max_wait_ms == 0)
            if alone:
                self._leading = True
            else:
                req = _Request(list(queries), (int(k), float(k1), float(b)), deadline, submitted)
                self._pending.append(req)
                if not self._leading:
                    self._leading = req.lead = True
                else:
                    self._arrived.notify()
        if alone:
            return self._run_alone(list(queries), int(k), float(k1), float(b), times, submitted)
        try:
            if not req.lead:
                self._wait(req)
            if req.lead:
                self._lead(req)
        except BaseException:  # interrupted (KeyboardInterrupt): leave the queue as if it never came
            self._abandon(req)
            raise
        if req.error is not None:
            raise req.error
        if times is not None and req.times is not None:
            times.add(req.times)
        return req.results

    def _run_alone(self, queries: list[QueryTerms], k: int, k1: float, b: float, times: StageTimes | None,
                   submitted: float) -> list[TopK]:
        """A lone request on an idle queue: the launch with none of a batch's bookkeeping."""
        start = time.monotonic()
        try:
            results = self.backend.search_terms(queries, k, k1, b, times)
            self._check_count(results, queries)
            return results
        finally:
            with self._lock:
                self._last_callers = 1
                self._release()
            if self._listeners:
                launch = Launch(1, len(queries), [start - submitted])
                for fn in self._listeners:
                    fn(launch)

    def _check_count(self, results: list[TopK], queries: list[QueryTerms]) -> None:
        if len(results) != len(queries):
            raise RuntimeError(f"backend {self.backend.name} returned {len(results)} results for "
                               f"{len(queries)} queries")

    def _wait(self, req: _Request) -> None:
        """Until ``req`` is done or this caller has to lead."""
        while True:
            left = None if req.deadline is None else max(0.0, req.deadline - time.monotonic())
            signalled = req.wake.wait(left)
            with self._lock:
                req.wake.clear()
                if req.state == "done" or req.lead:
                    return
                if not signalled and req.deadline is not None and time.monotonic() >= req.deadline:
                    if req.state == "pending":
                        self._pending.remove(req)
                        self._expire(req)
                        return
                    req.deadline = None  # its launch is under way: wait for it

    def _abandon(self, req: _Request) -> None:
        with self._lock:
            if req.state == "pending":
                self._pending.remove(req)
                req.state = "done"
            if req.lead:
                self._hand_over(req)

    def _hand_over(self, own: _Request) -> None:
        own.lead = False
        self._release()

    def _release(self) -> None:
        """Give the launcher's role to the oldest waiting caller, if any (lock held)."""
        if self._pending:
            nxt = self._pending[0]
            nxt.lead = True
            nxt.wake.set()
        else:
            self._leading = False
            if self._closed:  # only close() waits for an idle queue (a notify costs ~1 us of Python code)
                self._idle.notify_all()

    @staticmethod
    def _expire(req: _Request) -> None:
        req.state = "done"
        req.error = QueueTimeout("the search backend stayed busy past the request's deadline")

    # -- the launcher -------------------------------------------------------------------------------
    def _lead(self, own: _Request) -> None:
        """Launch batches until ``own`` is done, then hand the role to the oldest waiting caller."""
        batch: list[_Request] = []
        try:
            while own.state != "done":
                batch = self._gather()
                self._launch_all(batch)
                batch = []
        finally:
            with self._lock:
                for r in batch:  # interrupted mid-launch (KeyboardInterrupt): nobody may wait forever
                    if r.state != "done":
                        r.state, r.error = "done", RuntimeError("the search launch was interrupted")
                        r.wake.set()
                self._hand_over(own)

    def _gather(self) -> list[_Request]:
        """Take the next launch's requests from the queue: under load, after the wait window."""
        s = self.settings
        with self._lock:
            if s.max_wait_ms > 0 and (len(self._pending) > 1 or self._last_callers > 1):
                until = self._pending[0].submitted + s.max_wait_ms / 1e3
                while not self._closed and sum(len(r.queries) for r in self._pending) < s.max_batch:
                    left = until - time.monotonic()
                    if left <= 0:
                        break
                    self._arrived.wait(left)
            now = time.monotonic()
            batch, n = [], 0
            while self._pending:
                r = self._pending[0]
                if r.deadline is not None and now >= r.deadline:
                    self._pending.popleft()
                    self._expire(r)
                    r.wake.set()
                    continue
                if batch and n + len(r.queries) > s.max_batch:
                    break
                self._pending.popleft()
                r.state = "running"
                batch.append(r)
                n += len(r.queries)
            self._last_callers = max(1, len(batch))
        return batch

    def _launch_all(self, batch: list[_Request]) -> None:
        groups: dict[tuple[int, float, float], list[_Request]] = {}
        for r in batch:
            groups.setdefault(r.key, []).append(r)
        for key, reqs in groups.items():
            if not self._launch(key, reqs) and len(reqs) > 1:
                for r in reqs:  # the batch failed: each request alone, so an error reaches only its cause
                    self._launch(key, [r])
            for r in reqs:
                r.wake.set()

    def _launch(self, key: tuple[int, float, float], reqs: list[_Request]) -> bool:
        """One ``search_terms`` call for ``reqs``; False if it raised (the error is kept on each request)."""
        k, k1, b = key
        queries = [q for r in reqs for q in r.queries]
        start = time.monotonic()
        times = StageTimes()
        try:
            results = self.backend.search_terms(queries, k, k1, b, times)
            self._check_count(results, queries)
            ok = True
        except Exception as e:
            ok = False
            for r in reqs:
                r.error = e
        if ok:
            i = 0
            for r in reqs:
                n = len(r.queries)
                share = n / len(queries)
                r.results, r.error = results[i:i + n], None
                r.times = StageTimes(relevancy=times.relevancy * share, retrieval=times.retrieval * share)
                i += n
        if ok or len(reqs) == 1:  # a failed batch stays running: its requests are retried one by one
            with self._lock:
                for r in reqs:
                    r.state = "done"
        launch = Launch(len(reqs), len(queries), [start - r.submitted for r in reqs])
        for fn in self._listeners:
            fn(launch)
        return ok

    # -- shutdown ---------------------------------------------------------------------------------
    def close(self, timeout: float | None = None) -> bool:
        """Refuse new requests and wait for the queued ones to finish; True if they did within ``timeout``."""
        with self._lock:
            self._closed = True
            self._arrived.notify_all()
            end = None if timeout is None else time.monotonic() + timeout
            while self._leading:
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._idle.wait(left)
        return True


class ParallelCalls:
    """A thread-safe backend: each caller runs its own call on its own thread, at most ``parallel`` at once.

    The slots are tokens in a ``SimpleQueue`` (C code: taking a free one costs ~0.1 us, where a
    ``threading.Semaphore``, written in Python over a condition variable, costs microseconds a call); a caller
    that finds one runs at once, the others block in ``get`` until one is returned."""

    def __init__(self, backend: Backend, settings: QueueSettings | None = None) -> None:
        self.backend = backend
        self.settings = settings or QueueSettings()
        self.parallel = self.settings.parallel or os.cpu_count() or 1
        self._slots: queue.SimpleQueue[None] = queue.SimpleQueue()
        for _ in range(self.parallel):
            self._slots.put(None)
        self._closed = False
        self._listeners: list[Listener] = []

    def add_listener(self, fn: Listener) -> None:
        self._listeners.append(fn)

    def describe(self) -> dict:
        return {"kind": "parallel", "parallel": self.parallel}

    def _take(self, deadline: float | None) -> None:
        try:
            self._slots.get_nowait()
        except queue.Empty:
            try:
                self._slots.get(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise QueueTimeout("every search slot stayed busy past the request's deadline") from None

    def run(self, queries: list[QueryTerms], k: int, k1: float, b: float, times: StageTimes | None = None,
            deadline: float | None = None) -> list[TopK]:
        """As ``DeviceQueue.run``."""
        if self._closed:
            raise QueueClosed("the search queue is closed")
        if not queries:
            return []
        submitted = time.monotonic()
        self._take(deadline)
        start = time.monotonic()
        try:
            return self.backend.search_terms(list(queries), int(k), float(k1), float(b), times)
        finally:
            self._slots.put(None)
            if self._listeners:
                launch = Launch(1, len(queries), [start - submitted])
                for fn in self._listeners:
                    fn(launch)

    def close(self, timeout: float | None = None) -> bool:
        """Refuse new calls and wait for the running ones."""
        self._closed = True
        end = None if timeout is None else time.monotonic() + timeout
        taken = 0
        try:
            while taken < self.parallel:
                try:
                    self._slots.get(timeout=None if end is None else max(0.0, end - time.monotonic()))
                except queue.Empty:
                    return False
                taken += 1
            return True
        finally:
            for _ in range(taken):
                self._slots.put(None)


def queue_for(backend: Backend, settings: QueueSettings | None = None) -> DeviceQueue | ParallelCalls:
    """The backend's queue: parallel calls if it is thread-safe, else a device queue."""
    return ParallelCalls(backend, settings) if backend.thread_safe else DeviceQueue(backend, settings)
