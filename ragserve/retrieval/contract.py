"""The retrieval contract: one interface that every retriever answers, whatever scores underneath.

As every ``faiss::Index`` answers ``search(x, k)`` and its composites (shards, refinement) wrap the same interface,
every retriever here is a ``Retriever``: ``search_batch(queries, k, k1, b, with_text, times)`` returns, for each
query, its hits best first. BM25 over any registered backend (``Searcher``), over a live index's segments
(``LiveSearcher``), shards on Ray, dense, and the wrappers (hybrid fusion, two-stage reranking, memory, the
server's set) take retrievers and are retrievers.

``Retriever.search_batch`` checks the arguments once for all of them, with typed errors (``SearchError``: a 4xx, or
exit 2): k an integer in 1..``max_k``, the retriever's declared limit (``MAX_K``, or less where a backend's
kernel holds fewer: the FPGA kernel's 1024); queries non-empty strings; k1 and b refused where the retriever has
no BM25 (``takes_bm25_params``), else checked by ``bm25_params``. A retriever whose ``exact`` is true promises
the ids, ranks and score bits of the cpu ``Searcher`` over the same index, on every backend.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from indexer import bm25
from indexer.reader import IndexReader
from ragserve.kernels.contract import MAX_K, SearchError, StageTimes, TopK

if TYPE_CHECKING:
    from indexer.segments import Snapshot

__all__ = ["Hit", "MAX_K", "Retriever", "bm25_params", "check_k", "check_queries", "hits_of"]


class Hit:
    """One search result. ``title`` and ``text`` of a hit from ``hits_of`` are read from the index on first use:
    a caller that never looks at a passage (ids and scores only, a rerank depth cut) never pays for it."""

    __slots__ = ("docid", "id", "score", "_title", "_text", "_store")

    def __init__(self, docid: int, id: str, score: float, title: str = "", text: str = "") -> None:
        self.docid = docid  # internal docid
        self.id = id  # external id from the corpus
        self.score = score  # the retriever's score (BM25: the f32 score)
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


def check_k(k: object, limit: int = MAX_K, where: str = "") -> int:
    """``k`` as an int in 1..``limit``; ``where`` names what sets a lower limit (e.g. "on the fpga backend")."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise SearchError("k must be an integer")
    if not 1 <= k <= limit:
        raise SearchError(f"k must be between 1 and {limit}{' ' + where if where else ''}, got {k}")
    return int(k)


def check_queries(queries: object) -> list[str]:
    if isinstance(queries, str) or not isinstance(queries, (list, tuple)):
        raise SearchError("queries must be a list of strings")
    for q in queries:
        if not isinstance(q, str) or not q.strip():
            raise SearchError("queries must be non-empty strings")
    return list(queries)


def bm25_params(index: IndexReader | Snapshot, k1: float | None, b: float | None) -> tuple[float, float]:
    """(k1, b) of a BM25 search: the index's own (a live index's: its snapshot's) where not given, checked either
    way."""
    try:
        k1 = index.k1 if k1 is None else float(k1)
        b = index.b if b is None else float(b)
        bm25.check_params(k1, b)
    except (TypeError, ValueError) as e:
        raise SearchError(str(e)) from e
    return k1, b


class Retriever(ABC):
    """What every retriever answers (see the module's docstring). Subclasses implement ``_search_batch``, which
    receives checked arguments; keyword ``options`` are a retriever's own (a queue ``deadline``, the ``missing``
    shards of a sharded searcher, the server set's ``retriever`` name)."""

    kind: ClassVar[str]  # bm25, dense, hybrid, rerank, memory, set
    exact: ClassVar[bool] = False  # the cpu Searcher's ids, ranks and score bits over the same index
    takes_bm25_params: ClassVar[bool] = False
    index: IndexReader | None
    backend_name: str

    @property
    def max_k(self) -> int:
        """The largest k this retriever answers."""
        return MAX_K

    @property
    def limit_note(self) -> str:
        """What sets ``max_k`` when it is below MAX_K (for the error message)."""
        return f"on the {self.backend_name} backend" if self.max_k < MAX_K else ""

    def search_batch(self, queries: list[str], k: int = 10, k1: float | None = None, b: float | None = None,
                     with_text: bool = True, times: StageTimes | None = None, **options) -> list[list[Hit]]:
        """Top-k hits of each query, best first. ``times`` gains the stages' seconds; ``with_text`` False leaves
        the hits' title and text empty."""
        k = check_k(k, self.max_k, self.limit_note)
        queries = check_queries(queries)
        if not self.takes_bm25_params and (k1 is not None or b is not None):
            raise SearchError(f"k1 and b are BM25 parameters; the {self.kind} retriever has none")
        if not queries:
            return []
        return self._search_batch(queries, k, k1, b, with_text, times, **options)

    @abstractmethod
    def _search_batch(self, queries: list[str], k: int, k1: float | None, b: float | None, with_text: bool,
                      times: StageTimes | None, **options) -> list[list[Hit]]:
        """``search_batch`` after its checks."""

    def search(self, query: str, k: int = 10, k1: float | None = None, b: float | None = None,
               with_text: bool = True, times: StageTimes | None = None, **options) -> list[Hit]:
        if not isinstance(query, str):
            raise SearchError("query must be a string")
        return self.search_batch([query], k, k1, b, with_text, times, **options)[0]

    def hits(self, top: TopK, with_text: bool = True) -> list[Hit]:
        """A ranked ``TopK`` of this retriever's index as hits."""
        return hits_of(self.index, top, with_text)

    def describe(self) -> dict:
        return {"retriever": self.kind, "backend": self.backend_name}

    def close(self) -> None:
        """Release what the retriever holds (a wrapper closes what it wraps)."""
