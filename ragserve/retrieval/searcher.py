"""``Searcher``: BM25 retrieval from one index over any registered backend of the kernel library.

A search is the memory pipeline's first three stages:
prepare (analyse the query into weighted terms) -> compute relevancy (BM25 scoring, backend kernel)
-> retrieval (exact top-k, then the hits' external ids). The fourth stage, apply, belongs to the caller
(the RAG loop builds a prompt from the hits); a hit reads its stored passage when the caller first asks for it.

Every search reaches the backend through the searcher's queue (``ragserve.retrieval.queue``), so all callers of
one ``Searcher`` (server threads, RAG loops, the CLI) share it: a device backend never sees two at once, and
requests that arrive together share a launch.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from indexer import bm25
from indexer.bm25 import QueryTerms
from indexer.reader import IndexReader
from ragserve.kernels.contract import SearchError, StageTimes, TopK
from ragserve.kernels.registry import get_backend_class, resolve_backend_name
from ragserve.retrieval.prepare import QueryPreparer
from ragserve.retrieval.queue import QueueSettings, queue_for

MAX_K = 10_000


class Hit:
    """One search result. ``title`` and ``text`` of a hit from ``Searcher.search`` are read from the index on
    first use: a caller that never looks at a passage (ids and scores only, a rerank depth cut) never pays for it."""

    __slots__ = ("docid", "id", "score", "_title", "_text", "_store")

    def __init__(self, docid: int, id: str, score: float, title: str = "", text: str = "") -> None:
        self.docid = docid  # internal docid
        self.id = id  # external id from the corpus
        self.score = score  # the f32 BM25 score
        self._title = title
        self._text = text
        self._store: IndexReader | None = None  # set: title and text are still in the index

    def _fetch(self) -> None:
        store = self._store
        if store is not None:  # two threads may both fetch: the same values, set before the mark is cleared
            self._title, self._text = store.document(self.docid)
            self._store = None

    @property
    def title(self) -> str:
        self._fetch()
        return self._title

    @title.setter
    def title(self, value: str) -> None:
        self._fetch()
        self._title = value

    @property
    def text(self) -> str:
        self._fetch()
        return self._text

    @text.setter
    def text(self, value: str) -> None:
        self._fetch()
        self._text = value

    def _fields(self) -> tuple:
        return self.docid, self.id, self.score, self.title, self.text

    def __eq__(self, other: object) -> bool:
        return self._fields() == other._fields() if isinstance(other, Hit) else NotImplemented

    __hash__ = None  # mutable, as the dataclass it replaces

    def __repr__(self) -> str:
        return (f"Hit(docid={self.docid!r}, id={self.id!r}, score={self.score!r}, title={self.title!r}, "
                f"text={self.text!r})")

    def __reduce__(self) -> tuple:  # pickled (Ray, multiprocessing) with its passage, not the index it was read from
        return Hit, self._fields()

    def to_dict(self) -> dict:
        return {"id": self.id, "docid": self.docid, "score": self.score, "title": self.title, "text": self.text}


def hits_of(index: IndexReader, top: TopK, with_text: bool = True) -> list[Hit]:
    """``top`` as hits with their external ids; passages left in the index until a hit's ``title`` or ``text`` is
    read (``with_text``; else both are "")."""
    out = [Hit(d, i, s) for d, i, s in zip(top.docids.tolist(), index.external_ids(top.docids), top.scores.tolist())]
    if with_text:
        for h in out:
            h._store = index
    return out


class Searcher:
    """Analyse, score, rank and fetch passages from one index with the chosen backend."""

    def __init__(self, index: str | Path | IndexReader, backend: str = "cpu", queue: QueueSettings | None = None,
                 **backend_options) -> None:
        self.index = index if isinstance(index, IndexReader) else IndexReader(index)
        self.backend_name = resolve_backend_name(backend)
        cls = get_backend_class(self.backend_name)
        self.backend = cls(self.index, **backend_options)
        self.queue = queue_for(self.backend, queue)
        self.analyzer = self.index.analyzer
        self._prepare = QueryPreparer(self.index)
        try:  # the index's own k1 and b, checked once (None: checked, and refused, at every search)
            bm25.check_params(self.index.k1, self.index.b)
            self._params: tuple[float, float] | None = (self.index.k1, self.index.b)
        except ValueError:
            self._params = None

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
    def _check(self, k: int, k1: float | None, b: float | None) -> tuple[float, float]:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
            raise SearchError("k must be an integer")
        if not 1 <= k <= MAX_K:
            raise SearchError(f"k must be between 1 and {MAX_K}, got {k}")
        if k1 is None and b is None and self._params is not None:
            return self._params
        k1 = self.index.k1 if k1 is None else float(k1)
        b = self.index.b if b is None else float(b)
        try:
            bm25.check_params(k1, b)
        except ValueError as e:
            raise SearchError(str(e)) from e
        return k1, b

    def search_batch(self, queries: list[str], k: int = 10, k1: float | None = None, b: float | None = None,
                     with_text: bool = True, times: StageTimes | None = None,
                     deadline: float | None = None) -> list[list[Hit]]:
        """Top-k hits of each query, best first; the batch goes to the backend in one launch (shared with
        concurrent callers'). ``deadline`` (``time.monotonic``): ``QueueTimeout`` if the launch has not started
        by then. ``times`` gains the stages' seconds (the backend times its own only when asked)."""
        k1, b = self._check(k, k1, b)
        for q in queries:
            if not isinstance(q, str) or not q.strip():
                raise SearchError("queries must be non-empty strings")
        t0 = time.perf_counter_ns()
        analysed = [self._prepare(q) for q in queries]
        t1 = time.perf_counter_ns()
        results = self.queue.run(analysed, int(k), k1, b, times, deadline)
        t2 = time.perf_counter_ns()
        index = self.index
        hits = [hits_of(index, r, with_text) for r in results]
        if times is not None:
            times.prepare += (t1 - t0) * 1e-9
            times.retrieval += (time.perf_counter_ns() - t2) * 1e-9
        return hits

    def search(self, query: str, k: int = 10, k1: float | None = None, b: float | None = None,
               with_text: bool = True, times: StageTimes | None = None, deadline: float | None = None) -> list[Hit]:
        return self.search_batch([query], k, k1, b, with_text, times, deadline)[0]

    def hits(self, top: TopK, with_text: bool = True) -> list[Hit]:
        return hits_of(self.index, top, with_text)

    def close(self) -> None:
        """Finish the queued searches, refuse new ones, release the backend."""
        self.queue.close()
        self.backend.close()
