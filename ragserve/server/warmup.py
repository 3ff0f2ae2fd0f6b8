"""Getting a new server ready before ``/readyz`` says so.

The first search on a fresh process compiles (or loads from the kernel cache) the backend's kernels, and the
first answer pays the model's first forward pass: seconds that would otherwise land on the first user. So the
server runs, in the background, one real search through the ``Searcher`` and, with ``--model``, a tiny
generation on the generator's own thread once the model has loaded; then it is ready. A model that cannot be
loaded is fatal: ``on_failure`` is called (the server stops). After that, still in the background, it runs the
backend availability check that ``/v1/info`` reports (it imports torch and the device libraries: seconds that
need not delay readiness, but would delay the page's first /v1/info).
"""
from __future__ import annotations

import functools
import logging
import threading
import time
from typing import TYPE_CHECKING, Callable

from ragserve.kernels.registry import backend_names, get_backend_class
from ragserve.retrieval.searcher import Searcher

if TYPE_CHECKING:  # the answer service imports torch; a search-only server never loads it
    from ragserve.server.answering import AnswerService

log = logging.getLogger("ragserve.server")
QUERY_WORDS = 12  # words of a stored passage used as the warm-up query
DOCS_TRIED = 100  # passages looked at for one with text (some may be empty)


@functools.cache
def backend_status() -> tuple[dict, ...]:
    """Each registered backend, whether it can run here and why not (computed once: it imports the device
    libraries, which takes seconds)."""
    out = []
    for name in backend_names():
        try:
            ok, why = get_backend_class(name).is_available()
        except Exception as e:  # a backend whose module cannot even import here (no CUDA, no XRT)
            ok, why = False, f"{type(e).__name__}: {e}"
        out.append({"name": name, "available": ok, "reason": why})
    return tuple(out)


class WarmupError(RuntimeError):
    """The server cannot get ready (its model did not load)."""


def warmup_query(searcher: Searcher) -> str:
    """The first words of the first stored passage with text: a query whose terms are in the index, so the
    search runs every stage (a query of unknown terms stops before the scoring kernel)."""
    for docid in range(min(searcher.index.num_docs, DOCS_TRIED)):
        title, text = searcher.index.document(docid)
        words = f"{title} {text}".split()
        if any(searcher.analyze(w).term_ids.size for w in words[:QUERY_WORDS]):
            return " ".join(words[:QUERY_WORDS])
    return "the"


class Warmup:
    """Runs once in a background thread; ``status()`` is what ``/readyz`` reports, ``done`` is set when it
    has finished either way."""

    def __init__(self, searcher: Searcher, answers: AnswerService | None = None) -> None:
        self.searcher = searcher
        self.answers = answers
        self.done = threading.Event()
        self.error: str | None = None
        self.seconds: dict[str, float] = {}
        self._thread: threading.Thread | None = None
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        """The server is stopping: what the warm-up raises from now on (a closed queue) is not a failure."""
        self._cancelled.set()

    def start(self, on_failure: Callable[[str], None] | None = None,
              on_ready: Callable[[], None] | None = None) -> None:
        """``on_ready`` runs once the warm-up has succeeded (a worker of ``--workers`` tells the others)."""
        self._thread = threading.Thread(target=self._run, args=(on_failure, on_ready), name="warmup", daemon=True)
        self._thread.start()

    def status(self) -> dict:
        state = "failed" if self.error else "done" if self.done.is_set() else "running"
        return {"state": state, "seconds": dict(self.seconds), **({"error": self.error} if self.error else {})}

    def _run(self, on_failure: Callable[[str], None] | None, on_ready: Callable[[], None] | None) -> None:
        try:
            self._timed("search", self._search)
            if self.answers is not None:
                self._timed("generation", self._generate)
            log.info("warm-up done: %s", ", ".join(f"{k} {v:.1f} s" for k, v in self.seconds.items()))
        except Exception as e:  # reported by /readyz and fatal for the server: it cannot serve what it was asked
            if self._cancelled.is_set():  # a signal stopped the server mid warm-up: nothing to report
                log.info("warm-up stopped: the server is shutting down")
                return
            message = str(e) if isinstance(e, WarmupError) else f"{type(e).__name__}: {e}"
            self.error = " ".join(message.split())  # one line (transformers' messages span several)
            log.error("warm-up failed: %s", self.error)
        finally:
            self.done.set()
        if self.error:
            if on_failure is not None:
                on_failure(self.error)
            return
        if on_ready is not None and not self._cancelled.is_set():
            on_ready()
        self._timed("backends", backend_status)

    def _timed(self, what: str, fn: Callable[[], object]) -> None:
        t0 = time.perf_counter()
        fn()
        self.seconds[what] = round(time.perf_counter() - t0, 3)

    def _search(self) -> None:
        query = warmup_query(self.searcher)
        self.searcher.search_batch([query], k=10)
        self.searcher.search_batch([query, query], k=10)  # a batch takes the backend's multi-query path

    def _generate(self) -> None:
        answers = self.answers
        assert answers is not None
        # Right after the model load (on another worker thread of the queue).
        result = answers.queue.submit(lambda: answers.wait_loaded() and answers.generator.generate("Hello", 2),
                                      bounded=False).result()
        if not result:
            state = answers.status()
            raise WarmupError(f"cannot load the model {answers.model_name}: {state.get('error', state['state'])}")
