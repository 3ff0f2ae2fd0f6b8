"""``/v1/answer``: RAG methods (``ragserve.rag``) run on the generation queue's worker threads, several at once; the
generator's batcher runs their decode steps together (``ragserve.rag.batcher``).

The model loads on a worker thread in the background (``/readyz`` is 503 until it is ready). Each request gets
its own method object and decode session (its KV cache kept across its generations); ``StepWatch`` sees every step
of its trace as it completes (to stream it as a server-sent event) and stops the run at the next step once the
request is abandoned (timeout or the client went away), so an abandoned answer frees its worker early.
"""
from __future__ import annotations

import contextlib
import inspect
import logging
import queue
import threading
import time
from concurrent.futures import Future
from typing import Callable, Iterator

from ragserve.kernels.contract import SearchError
from ragserve.rag.base import MethodError, RagMethod
from ragserve.rag.generator import Generator, GeneratorError
from ragserve.rag.methods import METHOD_NAMES, METHODS, build_method
from ragserve.rag.prompts import PromptBuilder, PromptError, load_exemplars
from ragserve.rag.trace import Step, Trace
from ragserve.retrieval.contract import Hit
from ragserve.retrieval.searcher import Searcher
from ragserve.server import sse
from ragserve.server.config import ServerConfig
from ragserve.server.errors import ApiError, invalid
from ragserve.server.generation_queue import GenerationQueue, timeout_error
from ragserve.server.metrics import ServerMetrics
from ragserve.server.validation import DEFAULT_METHOD, AnswerRequest, check_fields, float_field, int_field

log = logging.getLogger("ragserve.server")
COMMON_OPTIONS = ("k", "max_new_tokens", "query_max_tokens", "answer_max_tokens")


class Abandoned(Exception):
    """The request gave up on this answer; stop generating."""


class StepWatch:
    """Wraps one method object's ``retrieve`` and ``generate`` (every trace step goes through one of them):
    a step is reported once the next one starts or the answer is done, so it is complete (trigger included)."""

    def __init__(self, method: RagMethod, on_step: Callable[[int, Step], None], cancel: threading.Event) -> None:
        self.on_step = on_step
        self.cancel = cancel
        self.trace: Trace | None = None
        self.reported = 0
        self.passages: list[Hit] = []  # the last retrieval's hits, with their text
        retrieve, generate = method.retrieve, method.generate

        def watched_retrieve(trace: Trace, *args, **kwargs) -> list[Hit]:
            self._before(trace)
            self.passages = retrieve(trace, *args, **kwargs)
            return self.passages

        def watched_generate(trace: Trace, *args, **kwargs):
            self._before(trace)
            return generate(trace, *args, **kwargs)

        method.retrieve, method.generate = watched_retrieve, watched_generate

    def _before(self, trace: Trace) -> None:
        if self.cancel.is_set():
            raise Abandoned()
        self.trace = trace
        self.flush(len(trace.steps))

    def flush(self, upto: int) -> None:
        while self.trace is not None and self.reported < upto:
            self.on_step(self.reported, self.trace.steps[self.reported])
            self.reported += 1


def _option_kinds() -> dict[str, dict[str, type]]:
    """Each method's accepted options and their types, read from the constructors' defaults."""
    common = inspect.signature(RagMethod.__init__).parameters
    kinds = {}
    for name, cls in METHODS.items():
        params = inspect.signature(cls.__init__).parameters
        kinds[name] = {o: type((params[o] if o in params else common[o]).default)
                       for o in COMMON_OPTIONS + tuple(cls.options)}
    return kinds


class AnswerService:
    """Loads the generator (and the reranker for ``two-stage``) and answers questions, up to
    ``config.concurrent_answers`` at once."""

    def __init__(self, model: str, searcher: Searcher, config: ServerConfig, metrics: ServerMetrics, *,
                 device: str = "auto", exemplars: str = "multihop.txt", reranker: str | None = None,
                 rerank_depth: int = 100, max_new_tokens: int = 256,
                 load_generator: Callable[..., Generator] = Generator, attention: str | None = None,
                 attention_budget: int | None = None, memory_model: str | None = None,
                 memory_options=None, engine_options: dict | None = None, batch=None) -> None:
        """``load_generator(model, device=...)`` makes the generator (another one: e.g. a client of a generator
        that runs elsewhere, as on Ray Serve). ``attention``/``attention_budget``: the decode steps' sparse
        attention by default (a request may choose its own). ``memory_model``: the sentence encoder a request's
        long ``context`` is read into memory with (``memory_options`` its ``MemoryOptions``). ``engine_options``: to
        the generator's fast engine; ``batch``: the generator's ``BatchSettings`` (each passed to ``load_generator``
        only when given)."""
        try:
            self.prompts = PromptBuilder(load_exemplars(exemplars))
        except PromptError as e:
            raise ValueError(str(e)) from e
        self.model_name = model
        self.searcher = searcher
        self.config = config
        self.metrics = metrics
        self.device = device
        self.max_new_tokens = max_new_tokens
        self.methods = [m for m in METHOD_NAMES if m != "two-stage" or reranker]
        self.default_method = DEFAULT_METHOD
        self.option_kinds = _option_kinds()
        self.queue = GenerationQueue(config.max_pending_answers, metrics,
                                     min(config.concurrent_answers, config.max_pending_answers))
        self.generator: Generator | None = None
        self.reranking = None  # the two-stage method's retriever; every other method uses the searcher
        self._reranker = (reranker, rerank_depth)
        self._load_generator = load_generator
        self.attention = (attention, attention_budget)  # the decode default; a request may choose its own
        self.memory_model, self.memory_options = memory_model, memory_options
        self.engine_options = engine_options
        self.batch = batch
        self.memory_embedder = None  # the sentence encoder a request's long context is read with
        self._loading: Future = self.queue.submit(self._load, bounded=False)  # on a worker thread

    # -- loading --------------------------------------------------------------------------------
    def _load(self) -> None:
        t0 = time.perf_counter()
        try:
            name, budget = self.attention
            extra = {} if name is None else {"attention": name, "budget": budget}
            if self.engine_options:
                extra["engine_options"] = self.engine_options
            if self.batch is not None:
                extra["batch"] = self.batch
            generator = self._load_generator(self.model_name, device=self.device, **extra)
            path, depth = self._reranker
            if path:
                from ragserve.retrieval.rerank import RerankingSearcher, load_reranker
                self.reranking = RerankingSearcher(self.searcher, load_reranker(path, device=self.device,
                                                                                index=self.searcher.index), depth)
            if self.memory_model:
                from ragserve.retrieval.embedder import Embedder
                self.memory_embedder = Embedder(self.memory_model, device=self.device)
        except Exception as e:  # one line: the server stops on it (serve's warm-up), /readyz shows it meanwhile
            log.error("cannot load the model %s: %s: %s", self.model_name, type(e).__name__, " ".join(str(e).split()))
            raise
        self.generator = generator
        log.info("model %s loaded on %s in %.1f s", self.model_name, generator.device, time.perf_counter() - t0)

    def wait_loaded(self) -> bool:
        """Block until the model has loaded (True) or failed to (False)."""
        return self._loading.exception() is None

    def status(self) -> dict:
        if not self._loading.done():
            return {"state": "loading", "model": self.model_name}
        err = self._loading.exception()
        if err is not None:
            return {"state": "error", "model": self.model_name, "error": f"{type(err).__name__}: {err}"}
        return {"state": "ready", "model": self.model_name}

    def describe(self) -> dict:
        g = self.generator
        return {"name": self.model_name, **self.status(), "device": g.device if g else None,
                "dtype": str(g.dtype).removeprefix("torch.") if g else None,
                "default_method": self.default_method, "max_new_tokens_limit": self.max_new_tokens,
                "options": {m: {o: t.__name__ for o, t in self.option_kinds[m].items()} for m in self.methods}}

    def batching(self) -> dict | None:
        """The generator's decode batching so far (``Generator.batching``); None before it loads or where the
        generator runs elsewhere."""
        return getattr(self.generator, "batching", None)

    @property
    def pending(self) -> int:
        return self.queue.pending

    # -- one answer -------------------------------------------------------------------------------
    def _method(self, req: AnswerRequest) -> tuple[RagMethod, object]:
        """Check the options and build the method (and the request's sparse attention, or None) on the request's
        thread, so bad input fails before queueing."""
        if req.method not in self.methods:
            raise invalid("method", f"method {req.method!r} needs a reranker; this server was started without "
                                    "--reranker")
        if req.context is not None and not self.memory_model:
            raise invalid("context", "this server cannot read a context: start it with --memory-model DIR "
                                     "(a sentence encoder)")
        if req.context is not None and (req.method == "two-stage" or not METHODS[req.method].uses_retrieval):
            raise invalid("method", f"method {req.method!r} cannot answer from a context; use a method that "
                                    "retrieves from the index's place (single, fixed-sentence, flare, ...)")
        kinds = self.option_kinds[req.method]
        check_fields(req.options, set(kinds), where="options.")
        opts = {}
        for name, value in req.options.items():
            field = f"options.{name}"
            if kinds[name] is int:
                hi = self.config.max_k if name == "k" else self.max_new_tokens
                opts[name] = int_field(value, field, 1, hi)
            else:
                opts[name] = float_field(value, field, -1e6, 1e6)
        state = self.status()
        if state["state"] != "ready":
            raise ApiError(503, "model_" + state["state"], f"the generator is not ready ({state['state']}"
                           + (f": {state['error']})" if "error" in state else "); retry shortly"),
                           headers={"Retry-After": "5"})
        try:
            if req.context is not None:  # a fresh memory per request, read on the generator's thread
                from ragserve.memory.reader import MemoryContext
                retriever = MemoryContext(self.memory_embedder, self.memory_options)
            elif req.method == "two-stage":
                retriever = self.reranking
            else:
                retriever = self.searcher.get(req.retriever) if hasattr(self.searcher, "get") else self.searcher
        except SearchError as e:
            raise invalid("retriever", str(e)) from None
        try:
            method = build_method(req.method, self.generator, self.prompts, retriever, **opts)
        except MethodError as e:
            raise invalid("options", str(e)) from None
        if req.attention is None:
            return method, None
        budget = req.attention.get("budget", self.attention[1])
        if not hasattr(self.generator, "sparse_method"):  # e.g. a client of a generator served elsewhere
            raise invalid("attention", "this server's generator does not take a sparse attention method")
        try:
            return method, self.generator.sparse_method(req.attention["method"], budget)
        except GeneratorError as e:
            raise invalid("attention", str(e)) from None

    def _run(self, built: tuple[RagMethod, object], req: AnswerRequest, on_step: Callable[[int, Step], None],
             cancel: threading.Event, queued_at: float) -> dict:
        """The job on a worker thread."""
        method, attention = built
        started = time.perf_counter()
        watch = StepWatch(method, on_step, cancel)
        if cancel.is_set():
            raise Abandoned()
        session = getattr(self.generator, "session", None)  # a remote generator has none
        try:
            with self.generator.attention_scope(attention) if attention else contextlib.nullcontext(), \
                    session(req.sampling) if session is not None else contextlib.nullcontext():
                answer, trace = method.answer(req.question, None if req.context is None else [("", req.context)])
        except (MethodError, GeneratorError) as e:  # e.g. max_new_tokens beyond the model's context
            raise invalid("options", str(e)) from None
        watch.flush(len(trace.steps))
        done = time.perf_counter()
        self._record(req.method, trace, done - started)
        times = trace.times.to_dict()
        out = {
            "question": req.question, "method": req.method, "answer": answer, "output": trace.output,
            "passages": [dict(rank=i + 1, **h.to_dict()) for i, h in enumerate(watch.passages)],
            "trace": [s.to_dict() for s in trace.steps], "retrievals": trace.retrievals, "tokens": trace.tokens,
            "timing": {"queue": started - queued_at, **times, "total": done - queued_at},
            "model": self.model_name,
            **({"attention": {"method": attention.name, "budget": attention.config.budget}} if attention else {}),
        }
        read = [s.memory for s in trace.steps if s.kind == "read"]
        if read:
            out["memory"] = read[0]
        return out

    def _record(self, method: str, trace: Trace, seconds: float) -> None:
        m = self.metrics
        m.generation.observe(seconds, method=method)
        for stage, v in trace.times.to_dict().items():
            m.answer_stage.inc(v, stage=stage, method=method)
        for s in trace.steps:
            if s.kind == "retrieve":
                m.retrieval.observe(s.times.relevancy + s.times.retrieval + s.times.prepare)

    def answer(self, req: AnswerRequest, deadline: float) -> dict:
        method = self._method(req)
        cancel = threading.Event()
        queued_at = time.perf_counter()
        try:
            return self.queue.run(lambda: self._run(method, req, lambda i, s: None, cancel, queued_at), deadline)
        except ApiError:
            cancel.set()
            raise

    def stream(self, req: AnswerRequest, deadline: float) -> Iterator[bytes]:
        """Server-sent events: ``queued``, ``started``, one ``step`` per trace step, then ``answer`` (the same
        object the non-streaming call returns) or ``error``. Bad input and a full queue fail before the stream
        starts, with a normal JSON error."""
        method = self._method(req)
        events: queue.Queue = queue.Queue()
        cancel = threading.Event()
        queued_at = time.perf_counter()

        def job() -> None:
            events.put(("started", {"queue_seconds": time.perf_counter() - queued_at}))
            try:
                result = self._run(method, req, lambda i, s: events.put(("step", {"index": i, **s.to_dict()})),
                                   cancel, queued_at)
                events.put(("answer", result))
            except Abandoned:
                pass
            except ApiError as e:
                events.put(("error", e.to_dict()))
            except Exception as e:  # reported in the stream: the 200 status line has already gone out
                log.exception("answer failed")
                events.put(("error", ApiError(500, "internal_error", f"internal error: {type(e).__name__}").to_dict()))

        fut = self.queue.submit(job)
        return self._events(events, fut, cancel, deadline, pending=self.queue.pending)

    def _events(self, events: queue.Queue, fut: Future, cancel: threading.Event, deadline: float,
                pending: int) -> Iterator[bytes]:
        try:
            yield sse.event("queued", {"pending": pending})
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    yield sse.event("error", timeout_error(fut).to_dict())
                    return
                try:
                    name, data = events.get(timeout=min(left, self.config.sse_keepalive_s))
                except queue.Empty:
                    yield sse.KEEPALIVE
                    continue
                yield sse.event(name, data)
                if name in ("answer", "error"):
                    return
        finally:  # finished, timed out, or the client disconnected (the server closes this generator)
            cancel.set()
            fut.cancel()

    def close(self) -> None:
        self.queue.shutdown()
