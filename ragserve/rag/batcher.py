"""Continuous batching: one thread owns the decode engines and advances every generation in flight by one token
per engine step, whichever thread asked for it.

A request's RAG loop stays ordinary code in its own thread; each ``Generator.generate`` hands a ``Decode`` (the
generation's state machine) to the batcher and waits. Between steps the batcher runs the exclusive calls (an
attention-map pass, installing an attention function), admits new generations (a request's session keeps its slot, so
only the prompt past the prefix it already holds is prefilled) and drops finished ones; it prefills at most
``BatchSettings.prefill_tokens`` prompt positions (whole engine chunks, first come first served; positions the
engine copies from its prefix cache are free), so a long prompt does not stall the answers already decoding; then
all generations decoding on an engine go through ONE ``engine.step``. A row does not depend on which others share the
step, so an answer is the same however requests interleave. A generation that carries its own ``contextvars``
context (sparse attention's session) steps alone, inside that context. With ``BatchSettings.prefill_lanes`` above
one, prompts prefill side by side on lane threads while the answers already decoding keep stepping.
"""
from __future__ import annotations

import contextvars
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, TypeVar

import torch

from ragserve.rag.decoding import Decode, Generation, GeneratorError, Sampling
from ragserve.rag.engine import DecodeEngine

T = TypeVar("T")


@dataclass(frozen=True)
class BatchSettings:
    """``prefill_tokens``: prompt positions computed between two decode steps (rounded to whole chunks of the
    engine's ``prefill_chunk``; 0, or an engine that prefills in one pass: whole prompts). Smaller bounds how long a
    decoding answer waits for a step; larger spends less per-call overhead. ``prefill_lanes``: prompts prefilled
    at once, each on a thread of its own with an equal share of torch's threads (1: one at a time on the batcher
    thread). On a CPU, one prefill uses a core at about half its matmul rate however many threads it has; prompts
    side by side use every core. With lanes, a prompt alone runs in a lane too, on the same share of threads, so
    its bits do not depend on what else is prefilling."""
    prefill_tokens: int = 128
    prefill_lanes: int = 1


class DecodeSession:
    """A request's decode state kept across its generations: a slot whose cache holds ``cached`` (so a prompt that
    repeats the previous prompt's prefix is prefilled from where they differ), its sampling choices and its random
    stream. Only the batcher thread touches ``slot`` and ``cached``."""

    def __init__(self, sampling: Sampling | None = None) -> None:
        self.sampling = sampling
        self.rng: torch.Generator | None = None
        self.engine: DecodeEngine | None = None
        self.slot: int | None = None
        self.cached: list[int] = []


@dataclass
class _Job:
    engine: DecodeEngine
    decode: Decode
    session: DecodeSession
    ephemeral: bool  # the session lives for this generation only
    ctx: contextvars.Context | None
    future: Future = field(default_factory=Future)
    todo: list[int] = field(default_factory=list)  # prompt ids still to prefill
    next: int | None = None  # the token to feed at the next step


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Batcher:
    """``idle_s``: the thread ends after this long with nothing to do (and starts again on the next request);
    ``settings``: how prefills interleave with decode steps."""

    def __init__(self, idle_s: float = 2.0, settings: BatchSettings | None = None) -> None:
        self.idle_s = idle_s
        self.settings = settings or BatchSettings()
        if self.settings.prefill_tokens < 0:
            raise GeneratorError("prefill_tokens must be >= 0")
        if not isinstance(self.settings.prefill_lanes, int) or self.settings.prefill_lanes < 1:
            raise GeneratorError("prefill_lanes must be an integer >= 1")
        self._lanes: ThreadPoolExecutor | None = None  # the prefill lanes' threads, started at first use
        self._cond = threading.Condition()
        self._new: deque[_Job] = deque()
        self._calls: deque[tuple[Callable[[], object], Future]] = deque()
        self._thread: threading.Thread | None = None
        self._open: dict[int, int] = {}  # id(engine) -> slots open
        self._freed = False  # a slot was closed since the waiting generations last tried to get one
        self.steps = 0  # engine steps run
        self.stepped = 0  # generation steps they advanced (stepped / steps: the mean batch)
        self.engine_s = 0.0  # seconds in the engines' prefill and step calls
        self.prefill_s = 0.0  # of which prefill calls
        self.prefill_tokens = 0  # prompt positions prefilled
        self.prefill_reused = 0  # of which copied from an engine's prefix cache
        self.host_s = 0.0  # seconds picking tokens and checking stops (the rows' log-softmax, the detokenizing)

    # -- the requests' side ---------------------------------------------------------------------
    def generate(self, engine: DecodeEngine, decode: Decode, session: DecodeSession | None = None,
                 ctx: contextvars.Context | None = None) -> Generation:
        """Run ``decode`` to its end with the others in flight (``session``: the request's slot, else a slot of its
        own for this generation; ``ctx``: step alone inside this context)."""
        if session is not None and session.engine not in (None, engine):
            raise GeneratorError("a decode session stays on one engine")
        job = _Job(engine, decode, session or DecodeSession(), session is None, ctx)
        with self._cond:
            self._new.append(job)
            self._wake()
        return job.future.result()

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the batcher thread between two steps (nothing else touches the model meanwhile)."""
        if threading.current_thread() is self._thread:
            return fn()
        fut: Future = Future()
        with self._cond:
            self._calls.append((fn, fut))
            self._wake()
        return fut.result()

    def release(self, session: DecodeSession) -> None:
        """Free the session's slot (its request is done)."""
        if session.slot is not None:
            self.call(lambda: self._close(session))

    def _wake(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="ragserve-batcher", daemon=True)
            self._thread.start()
        self._cond.notify()

    # -- the batcher thread ---------------------------------------------------------------------
    def _run(self) -> None:
        active: list[_Job] = []
        prefilling: list[_Job] = []  # admitted, their prompts partly prefilled (first come first served)
        waiting: list[_Job] = []  # admitted once a slot of their engine frees up
        try:
            with torch.inference_mode():
                self._loop(active, prefilling, waiting)
        except BaseException as e:  # a bug here must not leave callers waiting forever
            with self._cond:
                self._thread = None
                jobs = active + prefilling + waiting + list(self._new)
                calls, self._new, self._calls = list(self._calls), deque(), deque()
            for job in jobs:
                if not job.future.done():
                    job.future.set_exception(e)
            for _, fut in calls:
                fut.set_exception(e)
            raise

    def _loop(self, active: list[_Job], prefilling: list[_Job], waiting: list[_Job]) -> None:
        while True:
            with self._cond:
                while not (self._new or self._calls or active or prefilling or (waiting and self._freed)):
                    if not self._cond.wait(self.idle_s) and not (self._new or self._calls):
                        if not waiting:
                            self._thread = None
                            return
                new, self._new = list(self._new), deque()
                calls, self._calls = list(self._calls), deque()
            for fn, fut in calls:
                self._settle(fut, fn)
            waiting += new
            self._freed = False
            still = []
            for job in list(waiting):
                if job.session.slot is None and self._open.get(id(job.engine), 0) >= job.engine.max_slots:
                    still.append(job)
                    continue
                try:
                    self._admit(job)
                except Exception as e:  # this generation fails; the others go on
                    self._fail(job, e)
                    continue
                prefilling.append(job)
            waiting[:] = still
            lanes = self._start_lanes(prefilling) if self._in_lanes(prefilling) else None
            if prefilling and lanes is None:
                self._prefill(prefilling, active)
            if active:
                active[:] = self._step(active)
            if lanes is not None:
                # the answers decoding step on while the lanes prefill other slots (no row depends on those)
                while active and not all(isinstance(f, Exception) or f.done() for _, f, _, _ in lanes):
                    active[:] = self._step(active)
                self._finish_lanes(lanes, prefilling, active)

    def _admit(self, job: _Job) -> None:
        """Open (or reuse) the slot and keep the prefix of the prompt the slot already holds."""
        s, engine, ids = job.session, job.engine, job.decode.ids
        if s.slot is None:
            s.slot, s.engine, s.cached = engine.open(), engine, []
            self._open[id(engine)] = self._open.get(id(engine), 0) + 1
        keep = min(common_prefix(s.cached, ids), len(ids) - 1)
        engine.truncate(s.slot, keep)
        s.cached = s.cached[:keep]
        job.todo = list(ids[keep:])

    def _in_lanes(self, prefilling: list[_Job]) -> bool:
        """Whether the next prompts prefill in lanes: there are lanes, and none of those prompts carries its own
        context (such a generation prefills on this thread, inside its context)."""
        lanes = self.settings.prefill_lanes
        return lanes > 1 and bool(prefilling) and all(j.ctx is None for j in prefilling[:lanes])

    def _prefill(self, prefilling: list[_Job], active: list[_Job]) -> None:
        """Prefill up to the settings' budget of positions, the earliest admitted first; a prompt done joins
        ``active`` (or finishes)."""
        unlimited, budget = not self.settings.prefill_tokens, self.settings.prefill_tokens
        while prefilling and (unlimited or budget > 0):
            job = prefilling[0]
            s, engine = job.session, job.engine
            t0 = time.perf_counter()
            try:
                n, reused = self._piece(job, budget)
                if n == len(job.todo):  # the prompt's last piece: its logits
                    row = self._in(job, engine.prefill, s.slot, job.todo)
                else:
                    row = self._in(job, lambda ids: engine.prefill(s.slot, ids, logits=False), job.todo[:n])
            except Exception as e:
                prefilling.pop(0)
                self._fail(job, e)
                continue
            t1 = time.perf_counter()
            self.engine_s += t1 - t0
            self.prefill_s += t1 - t0
            budget -= n - reused
            self._advance(job, n, reused, row, prefilling, active)
            self.host_s += time.perf_counter() - t1

    def _start_lanes(self, prefilling: list[_Job]) -> list[tuple]:
        """A piece of each of the first ``prefill_lanes`` prompts (the budget each), submitted to the lanes'
        threads with torch's threads shared among them: (job, its future or the error of choosing the piece, its
        positions, those copied from the prefix cache)."""
        lanes = self.settings.prefill_lanes
        if self._lanes is None:
            self._lanes = ThreadPoolExecutor(lanes, thread_name_prefix="ragserve-prefill")
        share = max(1, torch.get_num_threads() // lanes)
        pieces = []
        for job in prefilling[:lanes]:
            try:
                n, reused = self._piece(job, self.settings.prefill_tokens)
            except Exception as e:
                pieces.append((job, e, 0, 0))
                continue
            fut = self._lanes.submit(_lane, share, job.engine.prefill, job.session.slot, job.todo[:n],
                                     n == len(job.todo))
            pieces.append((job, fut, n, reused))
        return pieces

    def _finish_lanes(self, pieces: list[tuple], prefilling: list[_Job], active: list[_Job]) -> None:
        """The lanes' pieces, in admission order: a prompt done joins ``active`` (or finishes); one that failed
        fails its generation."""
        lane_s = 0.0
        for job, fut, n, reused in pieces:
            try:
                if isinstance(fut, Exception):
                    raise fut
                row, seconds = fut.result()
            except Exception as e:
                prefilling.remove(job)
                self._fail(job, e)
                continue
            lane_s = max(lane_s, seconds)
            t = time.perf_counter()
            self._advance(job, n, reused, row, prefilling, active)
            self.host_s += time.perf_counter() - t
        self.engine_s += lane_s  # the lanes' wall: they ran side by side (and beside the step)
        self.prefill_s += lane_s

    def _advance(self, job: _Job, n: int, reused: int, row: torch.Tensor | None, prefilling: list[_Job],
                 active: list[_Job]) -> None:
        """``n`` more positions of the job's prompt are in its slot (``reused`` of them copied from the prefix
        cache); its prompt done, it leaves ``prefilling`` and starts decoding from ``row``."""
        self.prefill_tokens += n
        self.prefill_reused += reused
        job.session.cached += job.todo[:n]
        job.todo = job.todo[n:]
        if not job.todo:
            prefilling.remove(job)
            self._started(job, row, active)

    def _started(self, job: _Job, row: torch.Tensor, active: list[_Job]) -> None:
        """A row of logits is in (the prompt's, or a step's): the next token, then the job goes on decoding in
        ``active`` (or is done, or failed)."""
        try:
            job.next = job.decode.feed(row)
        except Exception as e:
            self._fail(job, e)
            return
        if job.next is None:
            self._finish(job)
        else:
            active.append(job)

    def _piece(self, job: _Job, budget: int) -> tuple[int, int]:
        """How many of the job's remaining prompt ids to prefill now, ending on a chunk boundary unless they are
        the last (at least one chunk's worth); and how many of those the engine copies from its prefix cache."""
        engine, todo = job.engine, job.todo
        chunk = engine.prefill_chunk
        if not chunk or not self.settings.prefill_tokens:
            return len(todo), 0
        reused = self._in(job, engine.reusable, job.session.slot, todo)
        start = engine.length(job.session.slot)
        stop = (start + reused + max(budget, 1)) // chunk * chunk
        if stop <= start + reused:
            stop = ((start + reused) // chunk + 1) * chunk
        return min(len(todo), stop - start), reused

    def _step(self, active: list[_Job]) -> list[_Job]:
        """One token for every active generation: one ``engine.step`` per engine (a generation with its own
        context alone); the unfinished ones."""
        groups: dict[int, list[_Job]] = {}
        for job in active:
            groups.setdefault(id(job) if job.ctx is not None else id(job.engine), []).append(job)
        still = []
        for jobs in groups.values():
            engine = jobs[0].engine
            t0 = time.perf_counter()
            try:
                rows = self._in(jobs[0], engine.step, [j.session.slot for j in jobs], [j.next for j in jobs])
            except Exception as e:
                for j in jobs:
                    self._fail(j, e)
                continue
            t1 = time.perf_counter()
            self.engine_s += t1 - t0
            self.steps += 1
            self.stepped += len(jobs)
            for j, row in zip(jobs, rows):
                j.session.cached.append(j.next)
                self._started(j, row, still)  # the same hand-over as the prompt's logits: feed, fail or finish
            self.host_s += time.perf_counter() - t1
        return still

    @staticmethod
    def _in(job: _Job, fn: Callable, *args):
        return job.ctx.run(fn, *args) if job.ctx is not None else fn(*args)

    def _finish(self, job: _Job) -> None:
        if job.ephemeral:
            self._close(job.session)
        self._settle(job.future, job.decode.result)

    def _fail(self, job: _Job, error: Exception) -> None:
        self._close(job.session)  # its cache may be half-written: a session starts over in a fresh slot
        job.future.set_exception(error)

    def _close(self, s: DecodeSession) -> None:
        if s.slot is not None:
            s.engine.close(s.slot)
            self._open[id(s.engine)] -= 1
            self._freed = True
        s.slot, s.cached = None, []

    @staticmethod
    def _settle(fut: Future, fn: Callable[[], object]) -> None:
        try:
            fut.set_result(fn())
        except Exception as e:
            fut.set_exception(e)


def _lane(threads: int, prefill: Callable, slot: int, ids: list[int], logits: bool) -> tuple:
    """A piece of a prompt on a prefill lane's thread, on ``threads`` of torch's threads (a thread's own count):
    its logits (or None) and the seconds it took."""
    torch.set_num_threads(threads)
    t = time.perf_counter()
    with torch.inference_mode():
        row = prefill(slot, ids, logits=logits)
    return row, time.perf_counter() - t
