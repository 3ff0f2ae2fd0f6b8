"""``Searcher``: BM25 retrieval from one index over any registered backend of the kernel library.

A search is the memory pipeline's first three stages:
prepare (analyse the query into weighted terms) -> compute relevancy (BM25 scoring, backend kernel)
-> retrieval (exact top-k, then fetching stored text). The fourth stage, apply, belongs to the caller
(the RAG loop builds a prompt from the hits).

Every search reaches the backend through the searcher's queue (``ragserve.retrieval.queue``), so all callers of
one ``Searcher`` (server threads, RAG loops, the CLI) share it: a device backend never sees two at once, and
requests that arrive together share a launch.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from indexer import bm25
from indexer.bm25 import QueryTerms
from indexer.reader import IndexReader
from ragserve.kernels.contract import SearchError, StageTimes, TopK
from ragserve.kernels.registry import get_backend_class, resolve_backend_name
from ragserve.retrieval.queue import QueueSettings, queue_for

MAX_K = 10_000


@dataclass
class Hit:
    docid: int  # internal docid
    id: str  # external id from the corpus
    score: float  # the f32 BM25 score
    title: str = ""
    text: str = ""

    def to_dict(self) -> dict:
        return {"id": self.id, "docid": self.docid, "score": self.score, "title": self.title, "text": self.text}


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

    @property
    def manifest(self) -> dict:
        return self.index.manifest

    @cached_property
    def _idf(self) -> np.ndarray:
        """Every term's f32 idf, computed once (element by element, as for a single query's terms)."""
        return bm25.idf_f32(np.asarray(self.index.df), self.index.doc_count)

    # -- prepare ----------------------------------------------------------------------------
    def analyze(self, query: str) -> QueryTerms:
        """Distinct query terms ascending by id, boosted by their count in the query (pyserini's rule)."""
        if not isinstance(query, str):
            raise SearchError("query must be a string")
        counts, _ = self.analyzer.term_counts(query)
        vocab = self.index.term_ids
        found, unknown = [], []
        for term, c in counts.items():
            t = vocab.get(term)
            if t is None:
                unknown.append(term)
            else:
                found.append((t, c))
        found.sort()
        term_ids = np.array([t for t, _ in found], dtype=np.uint32)
        boosts_f = np.array([c for _, c in found], dtype=np.float32)
        weights = boosts_f * self._idf[term_ids]  # f32 * f32: the product rounded once, as Lucene's boost * idf
        return QueryTerms(term_ids=term_ids, boosts=boosts_f, weights=weights, unknown=tuple(unknown))

    # -- search -----------------------------------------------------------------------------
    def _check(self, k: int, k1: float | None, b: float | None) -> tuple[float, float]:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
            raise SearchError("k must be an integer")
        if not 1 <= k <= MAX_K:
            raise SearchError(f"k must be between 1 and {MAX_K}, got {k}")
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
        by then."""
        k1, b = self._check(k, k1, b)
        for q in queries:
            if not isinstance(q, str) or not q.strip():
                raise SearchError("queries must be non-empty strings")
        t0 = time.perf_counter()
        analysed = [self.analyze(q) for q in queries]
        t1 = time.perf_counter()
        kt = StageTimes()
        results = self.queue.run(analysed, int(k), k1, b, kt, deadline)
        t2 = time.perf_counter()
        hits = [self.hits(r, with_text) for r in results]
        t3 = time.perf_counter()
        if times is not None:
            times.add(StageTimes(prepare=t1 - t0, relevancy=kt.relevancy, retrieval=kt.retrieval + (t3 - t2)))
        return hits

    def search(self, query: str, k: int = 10, k1: float | None = None, b: float | None = None,
               with_text: bool = True, times: StageTimes | None = None, deadline: float | None = None) -> list[Hit]:
        return self.search_batch([query], k, k1, b, with_text, times, deadline)[0]

    def hits(self, top: TopK, with_text: bool = True) -> list[Hit]:
        out = []
        for d, s in zip(top.docids.tolist(), top.scores.tolist()):
            title, text = self.index.document(d) if with_text else ("", "")
            out.append(Hit(docid=d, id=self.index.external_id(d), score=s, title=title, text=text))
        return out

    def close(self) -> None:
        """Finish the queued searches, refuse new ones, release the backend."""
        self.queue.close()
        self.backend.close()
