"""One ``Searcher`` interface over interchangeable retrieval backends (a registry, as vLLM does for attention).

A search is the memory pipeline's first three stages:
prepare (analyse the query into weighted terms) -> compute relevancy (BM25 scoring, backend kernel)
-> retrieval (exact top-k, then fetching stored text). The fourth stage, apply, belongs to the caller
(the RAG loop builds a prompt from the hits).
"""
from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, ClassVar

import numpy as np

from indexer.reader import IndexReader
from ragserve import bm25
from ragserve.bm25 import QueryTerms

MAX_K = 10_000


class SearchError(ValueError):
    """Bad search input (empty query, k out of range, bad k1/b): callers turn it into a 4xx / exit 2."""


@dataclass
class Hit:
    docid: int  # internal docid
    id: str  # external id from the corpus
    score: float  # the f32 BM25 score
    title: str = ""
    text: str = ""

    def to_dict(self) -> dict:
        return {"id": self.id, "docid": self.docid, "score": self.score, "title": self.title, "text": self.text}


@dataclass
class StageTimes:
    """Seconds spent in each stage of the memory pipeline (summed over calls when reused)."""

    prepare: float = 0.0
    relevancy: float = 0.0
    retrieval: float = 0.0
    apply: float = 0.0

    def add(self, other: "StageTimes") -> None:
        self.prepare += other.prepare
        self.relevancy += other.relevancy
        self.retrieval += other.retrieval
        self.apply += other.apply

    def to_dict(self) -> dict:
        return {"prepare": self.prepare, "relevancy": self.relevancy, "retrieval": self.retrieval, "apply": self.apply}


@dataclass
class TopK:
    """A backend's answer for one query: internal docids and f32 scores, best first."""

    docids: np.ndarray  # int64
    scores: np.ndarray  # float32

    def same_as(self, other: "TopK") -> bool:
        """The same docids and the same score bits: the parity every backend is held to."""
        return (np.array_equal(self.docids, other.docids)
                and np.array_equal(self.scores.view(np.uint32), other.scores.view(np.uint32)))


@dataclass
class KernelTimes:
    relevancy: float = 0.0
    topk: float = 0.0


class Backend(ABC):
    """A retrieval engine over one index layout. Subclasses register with ``@register_backend``."""

    name: ClassVar[str]

    def __init__(self, index: IndexReader, **options) -> None:
        self.index = index

    @classmethod
    def is_available(cls) -> tuple[bool, str]:
        """(usable here, reason if not)."""
        return True, ""

    @abstractmethod
    def search_terms(self, queries: list[QueryTerms], k: int, k1: float, b: float,
                     times: KernelTimes | None = None) -> list[TopK]:
        """Exact BM25 top-k of each analysed query, scores as ``indexer/FORMAT.md`` defines them."""

    def describe(self) -> dict:
        return {"backend": self.name}

    def close(self) -> None:
        """Release device memory or handles."""


_REGISTRY: dict[str, Callable[[], type[Backend]]] = {}


def register_backend(name: str, loader: Callable[[], type[Backend]]) -> None:
    """Register a backend lazily: ``loader`` imports its module only when the backend is used."""
    _REGISTRY[name] = loader


def backend_names() -> list[str]:
    return sorted(_REGISTRY)


def get_backend_class(name: str) -> type[Backend]:
    if name not in _REGISTRY:
        raise SearchError(f"unknown backend {name!r}; choose one of: {', '.join(backend_names())}, auto")
    return _REGISTRY[name]()


def resolve_backend_name(name: str) -> str:
    """``auto`` picks the GPU backend when a GPU is usable, else the CPU backend."""
    if name != "auto":
        return name
    if "gpu" in _REGISTRY:
        ok, _ = get_backend_class("gpu").is_available()
        if ok:
            return "gpu"
    return "cpu"


def _load_cpu() -> type[Backend]:
    from ragserve.backends.cpu import CpuBackend
    return CpuBackend


register_backend("cpu", _load_cpu)


def _load_gpu() -> type[Backend]:
    from ragserve.backends.gpu import GpuBackend
    return GpuBackend


register_backend("gpu", _load_gpu)


def _load_fpga() -> type[Backend]:
    from ragserve.backends.fpga import FpgaBackend
    return FpgaBackend


def _load_fpga_sim() -> type[Backend]:
    from ragserve.backends.fpga_sim import FpgaSimBackend
    return FpgaSimBackend


register_backend("fpga", _load_fpga)
register_backend("fpga-sim", _load_fpga_sim)


class Searcher:
    """Analyse, score, rank and fetch passages from one index with the chosen backend."""

    def __init__(self, index: str | Path | IndexReader, backend: str = "cpu", **backend_options) -> None:
        self.index = index if isinstance(index, IndexReader) else IndexReader(index)
        self.backend_name = resolve_backend_name(backend)
        cls = get_backend_class(self.backend_name)
        self.backend = cls(self.index, **backend_options)
        self.analyzer = self.index.analyzer

    @property
    def manifest(self) -> dict:
        return self.index.manifest

    # -- prepare ----------------------------------------------------------------------------
    def analyze(self, query: str) -> QueryTerms:
        """Distinct query terms ascending by id, boosted by their count in the query (pyserini's rule)."""
        if not isinstance(query, str):
            raise SearchError("query must be a string")
        counts, _ = self.analyzer.term_counts(query)
        ids, boosts, unknown = [], [], []
        vocab = self.index.term_ids
        for term, c in counts.items():
            t = vocab.get(term)
            if t is None:
                unknown.append(term)
            else:
                ids.append(t)
                boosts.append(c)
        order = np.argsort(np.asarray(ids, dtype=np.int64), kind="stable")
        term_ids = np.asarray(ids, dtype=np.uint32)[order]
        boosts_f = np.asarray(boosts, dtype=np.float32)[order]
        idf = bm25.idf_f32(self.index.df[term_ids.astype(np.int64)], self.index.doc_count) if term_ids.size else np.zeros(0, np.float32)
        weights = (boosts_f * idf).astype(np.float32)
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
                     with_text: bool = True, times: StageTimes | None = None) -> list[list[Hit]]:
        """Top-k hits of each query, best first; one backend call for the whole batch."""
        k1, b = self._check(k, k1, b)
        for q in queries:
            if not isinstance(q, str) or not q.strip():
                raise SearchError("queries must be non-empty strings")
        t0 = time.perf_counter()
        analysed = [self.analyze(q) for q in queries]
        t1 = time.perf_counter()
        kt = KernelTimes()
        results = self.backend.search_terms(analysed, int(k), k1, b, kt)
        t2 = time.perf_counter()
        hits = [self.hits(r, with_text) for r in results]
        t3 = time.perf_counter()
        if times is not None:
            times.add(StageTimes(prepare=t1 - t0, relevancy=kt.relevancy or (t2 - t1 - kt.topk),
                                 retrieval=kt.topk + (t3 - t2)))
        return hits

    def search(self, query: str, k: int = 10, k1: float | None = None, b: float | None = None,
               with_text: bool = True, times: StageTimes | None = None) -> list[Hit]:
        return self.search_batch([query], k, k1, b, with_text, times)[0]

    def hits(self, top: TopK, with_text: bool = True) -> list[Hit]:
        out = []
        for d, s in zip(top.docids.tolist(), top.scores.tolist()):
            title, text = self.index.document(d) if with_text else ("", "")
            out.append(Hit(docid=d, id=self.index.external_id(d), score=s, title=title, text=text))
        return out

    def close(self) -> None:
        self.backend.close()
