"""The execution queue (``ragserve.retrieval.queue``) in front of real backends: dynamic batching under
concurrency, grouping by (k, k1, b), results and stage times back to their own callers, errors isolated to
the request that caused them, deadlines, shutdown, and parallel calls for the thread-safe CPU backend.

The device backend is ``fpga-sim`` (not thread-safe) behind ``Gate``, a pass-through that records each launch,
counts overlapping calls, can hold a launch until released (so that later requests pile up behind it) and can
fail the launches that contain a chosen term (a fault for the error paths)."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from ragserve.kernels.contract import Backend, SearchError, StageTimes
from ragserve.retrieval.queue import (DeviceQueue, Launch, ParallelCalls, QueueClosed, QueueSettings, QueueTimeout,
                                      queue_for)
from ragserve.retrieval.searcher import Searcher
from tests.rag_support import hotpot_examples
from tests.serverproc import wait_until

K_VALUES = (3, 7)


class Gate(Backend):
    name = "gate"

    def __init__(self, inner: Backend, thread_safe: bool = False) -> None:
        super().__init__(inner.index)
        self.inner = inner
        self.thread_safe = thread_safe
        self.launches: list[tuple[int, int]] = []  # (k, queries) of each call, in order
        self.overlaps = 0  # calls that found another call inside
        self.max_inside = 0
        self.poison: int | None = None  # a term id whose launches fail
        self.hold: threading.Event | None = None  # launches wait for it while it is set here
        self.entered = threading.Event()
        self._inside = 0
        self._lock = threading.Lock()

    def search_terms(self, queries, k, k1, b, times=None):
        with self._lock:
            self._inside += 1
            self.overlaps += self._inside > 1
            self.max_inside = max(self.max_inside, self._inside)
            self.launches.append((k, len(queries)))
            hold = self.hold
        try:
            self.entered.set()
            if hold is not None:
                assert hold.wait(60)
            if self.poison is not None and any(self.poison in q.term_ids for q in queries):
                raise SearchError("poisoned query")
            return self.inner.search_terms(queries, k, k1, b, times)
        finally:
            with self._lock:
                self._inside -= 1


@pytest.fixture(scope="module")
def sim(hotpot_index):
    s = Searcher(hotpot_index, backend="fpga-sim")
    yield s
    s.close()


@pytest.fixture(scope="module")
def questions(sim):
    texts = [e.question for e in hotpot_examples()[:40]]
    return [sim.analyze(t) for t in texts]


def expected(sim, queries, k):
    """The backend's own answer, one call per query."""
    ix = sim.index
    return [sim.backend.search_terms([q], k, ix.k1, ix.b)[0] for q in queries]


def start_held(q: DeviceQueue, gate: Gate, query, k=K_VALUES[0]):
    """A request whose launch is held inside the backend until ``release`` is set."""
    release = threading.Event()
    gate.hold, gate.entered = release, threading.Event()
    ix = gate.index
    t = threading.Thread(target=q.run, args=([query], k, ix.k1, ix.b), daemon=True)
    t.start()
    assert gate.entered.wait(60)
    return release, t


def test_searcher_picks_the_queue_by_thread_safety(sim, hotpot_index):
    assert isinstance(sim.queue, DeviceQueue)
    cpu = Searcher(hotpot_index, backend="cpu")
    try:
        assert isinstance(cpu.queue, ParallelCalls)
    finally:
        cpu.close()


def test_requests_that_arrive_together_share_one_launch_per_k(sim, questions):
    gate = Gate(sim.backend)
    q = DeviceQueue(gate, QueueSettings(max_wait_ms=0, max_batch=64))
    launches: list[Launch] = []
    q.add_listener(launches.append)
    ix = sim.index
    release, first = start_held(q, gate, questions[0])
    # 12 callers, alternating k, two or three queries each: they queue behind the held launch.
    asks = [(questions[1 + 3 * i:1 + 3 * i + (2 + i % 2)], K_VALUES[i % 2]) for i in range(12)]
    times = [StageTimes() for _ in asks]
    with ThreadPoolExecutor(len(asks)) as pool:
        futs = [pool.submit(q.run, qs, k, ix.k1, ix.b, t) for (qs, k), t in zip(asks, times)]
        assert wait_until(lambda: q.pending == len(asks), 30)
        release.set()
        got = [f.result(60) for f in futs]
    first.join(60)
    assert gate.overlaps == 0
    # The held launch, then one launch per k with every caller of that k in it.
    assert gate.launches[0] == (K_VALUES[0], 1)
    assert sorted(gate.launches[1:]) == sorted((k, sum(len(qs) for qs, kk in asks if kk == k)) for k in K_VALUES)
    assert sorted(l.requests for l in launches[1:]) == [6, 6]
    for (qs, k), res, t in zip(asks, got, times):
        want = expected(sim, qs, k)
        assert len(res) == len(qs) and all(a.same_as(b) for a, b in zip(res, want))
        assert t.relevancy > 0 and t.prepare == 0  # a share of its launch's scoring time


def test_max_batch_caps_a_launch(sim, questions):
    gate = Gate(sim.backend)
    q = DeviceQueue(gate, QueueSettings(max_wait_ms=0, max_batch=4))
    ix = sim.index
    release, first = start_held(q, gate, questions[0])
    with ThreadPoolExecutor(6) as pool:
        futs = [pool.submit(q.run, questions[2 * i + 1:2 * i + 3], 5, ix.k1, ix.b) for i in range(6)]
        assert wait_until(lambda: q.pending == 6, 30)
        release.set()
        for f in futs:
            f.result(60)
    first.join(60)
    assert [n for _, n in gate.launches[1:]] == [4, 4, 4]


def test_an_error_reaches_only_the_request_that_caused_it(sim, questions):
    gate = Gate(sim.backend)
    q = DeviceQueue(gate, QueueSettings(max_wait_ms=0))
    ix = sim.index
    bad = 3
    gate.poison = int(questions[bad].term_ids[0])
    clean = [i for i in range(1, len(questions)) if gate.poison not in questions[i].term_ids]
    release, first = start_held(q, gate, questions[clean[0]])
    with ThreadPoolExecutor(6) as pool:
        futs = {i: pool.submit(q.run, [questions[i]], 5, ix.k1, ix.b) for i in [bad] + clean[1:6]}
        assert wait_until(lambda: q.pending == 6, 30)
        release.set()
        with pytest.raises(SearchError, match="poisoned"):
            futs[bad].result(60)
        for i in clean[1:6]:
            assert futs[i].result(60)[0].same_as(expected(sim, [questions[i]], 5)[0])
    first.join(60)
    # The failed batch of six, then each of its requests alone.
    assert [n for _, n in gate.launches[1:]] == [6] + [1] * 6
    gate.poison = None
    assert q.run([questions[bad]], 5, ix.k1, ix.b)[0].same_as(expected(sim, [questions[bad]], 5)[0])


def test_a_lone_request_never_waits_for_the_window(sim, questions):
    q = DeviceQueue(sim.backend, QueueSettings(max_wait_ms=1000))
    launches: list[Launch] = []
    q.add_listener(launches.append)
    ix = sim.index
    t0 = time.monotonic()
    for i in range(3):
        q.run([questions[i]], 5, ix.k1, ix.b)
    assert time.monotonic() - t0 < 0.5 and all(l.waits[0] < 0.1 for l in launches)


def test_under_load_the_window_gathers_later_arrivals(sim, questions):
    gate = Gate(sim.backend)
    q = DeviceQueue(gate, QueueSettings(max_wait_ms=1000, max_batch=2))
    ix = sim.index
    release, first = start_held(q, gate, questions[0])
    with ThreadPoolExecutor(4) as pool:  # a launch of two callers: the queue is under load now
        futs = [pool.submit(q.run, [questions[i]], 5, ix.k1, ix.b) for i in (1, 2)]
        assert wait_until(lambda: q.pending == 2, 30)
        release.set()
        [f.result(60) for f in futs]
        first.join(60)
        n = len(gate.launches)
        a = pool.submit(q.run, [questions[3]], 5, ix.k1, ix.b)
        time.sleep(0.05)  # well inside the 1 s window; the second arrival fills the batch of 2
        b = pool.submit(q.run, [questions[4]], 5, ix.k1, ix.b)
        a.result(60), b.result(60)
    assert gate.launches[n:] == [(5, 2)]


def test_a_request_past_its_deadline_never_launches(sim, questions):
    gate = Gate(sim.backend)
    q = DeviceQueue(gate, QueueSettings(max_wait_ms=0))
    ix = sim.index
    release, first = start_held(q, gate, questions[0])
    with pytest.raises(QueueTimeout):
        q.run([questions[1]], 5, ix.k1, ix.b, deadline=time.monotonic() + 0.05)
    assert q.pending == 0
    release.set()
    first.join(60)
    assert gate.launches == [(K_VALUES[0], 1)]
    assert q.run([questions[1]], 5, ix.k1, ix.b, deadline=time.monotonic() + 30)[0].same_as(
        expected(sim, [questions[1]], 5)[0])


def test_close_finishes_queued_requests_and_refuses_new_ones(sim, questions):
    gate = Gate(sim.backend)
    q = DeviceQueue(gate, QueueSettings(max_wait_ms=0))
    ix = sim.index
    release, first = start_held(q, gate, questions[0])
    with ThreadPoolExecutor(4) as pool:
        futs = [pool.submit(q.run, [questions[i]], 5, ix.k1, ix.b) for i in (1, 2, 3)]
        assert wait_until(lambda: q.pending == 3, 30)
        closing = pool.submit(q.close, 60)
        assert wait_until(lambda: q.closed, 30)
        with pytest.raises(QueueClosed):
            q.run([questions[4]], 5, ix.k1, ix.b)
        assert not closing.done()  # it waits for the held launch and the queued requests
        release.set()
        assert closing.result(60) is True
        for i, f in zip((1, 2, 3), futs):
            assert f.result(60)[0].same_as(expected(sim, [questions[i]], 5)[0])
    first.join(60)
    assert gate.overlaps == 0


def test_searcher_close_closes_its_queue(hotpot_index):
    s = Searcher(hotpot_index, backend="fpga-sim")
    assert s.search("Kiss and Tell", k=3)
    s.close()
    with pytest.raises(QueueClosed):
        s.search("Kiss and Tell", k=3)


def test_cpu_backend_calls_run_in_parallel_up_to_the_limit(hotpot_index, questions):
    cpu = Searcher(hotpot_index, backend="cpu")
    try:
        gate = Gate(cpu.backend, thread_safe=True)
        q = queue_for(gate, QueueSettings(parallel=2))
        assert isinstance(q, ParallelCalls)
        ix = cpu.index
        gate.hold = threading.Event()
        with ThreadPoolExecutor(6) as pool:
            futs = [pool.submit(q.run, [questions[i]], 5, ix.k1, ix.b) for i in range(6)]
            assert wait_until(lambda: len(gate.launches) == 2, 30)  # two calls inside at once, the rest wait
            with pytest.raises(QueueTimeout):
                q.run([questions[6]], 5, ix.k1, ix.b, deadline=time.monotonic() + 0.05)
            assert len(gate.launches) == 2
            gate.hold.set()
            got = [f.result(60) for f in futs]
        assert gate.max_inside == 2 and len(gate.launches) == 6
        for i, r in enumerate(got):
            assert r[0].same_as(cpu.backend.search_terms([questions[i]], 5, ix.k1, ix.b)[0])
    finally:
        cpu.close()


def test_gpu_backend_behind_the_queue_equals_sequential(hotpot_index):
    """The gpu backend (on torch's CPU device here): concurrent callers batched, every result as if alone."""
    g = Searcher(hotpot_index, backend="gpu", device="cpu", queue=QueueSettings(max_wait_ms=2))
    try:
        assert isinstance(g.queue, DeviceQueue)
        launches: list[Launch] = []
        g.queue.add_listener(launches.append)
        texts = [e.question for e in hotpot_examples()[:24]]
        ask = [(t, K_VALUES[i % 2]) for i, t in enumerate(texts)]
        alone = [g.search(t, k=k, with_text=False) for t, k in ask]
        launches.clear()
        with ThreadPoolExecutor(12) as pool:
            together = list(pool.map(lambda a: g.search(a[0], k=a[1], with_text=False), ask))
        assert [[(h.docid, h.score) for h in hs] for hs in together] == \
               [[(h.docid, h.score) for h in hs] for hs in alone]
        assert sum(l.queries for l in launches) == len(ask) and len(launches) < len(ask)
    finally:
        g.close()
