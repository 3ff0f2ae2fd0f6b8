"""Hybrid retrieval: BM25 and dense rankings fused into one.

Each retriever ranks its top ``depth`` passages (``depth`` at least k); the fused score of a passage is
- ``rrf`` (default, reciprocal-rank fusion, Cormack et al. 2009): the sum over the rankings that hold it of
  ``1 / (rrf_k + rank)``, rank counted from 1, ``rrf_k`` = 60;
- ``linear``: ``alpha * dense' + (1 - alpha) * bm25'``, where each ranking's scores are min-max normalised over
  its own top ``depth`` (all equal: 1) and a passage absent from a ranking gets 0 from it.
Ties fall to the smaller internal docid. Fused scores are f64 (RRF sums of distinct reciprocals would tie in f32).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ragserve.kernels.contract import MAX_K, SearchError, StageTimes
from ragserve.retrieval.contract import Hit, Retriever

FUSIONS = ("rrf", "linear")


@dataclass(frozen=True)
class FusionOptions:
    method: str = "rrf"
    rrf_k: float = 60.0
    alpha: float = 0.5  # linear: weight of the dense scores
    depth: int = 100  # passages taken from each ranking (raised to k when smaller)

    def check(self) -> None:
        if self.method not in FUSIONS:
            raise SearchError(f"fusion must be one of {', '.join(FUSIONS)}, got {self.method!r}")
        if not self.rrf_k >= 0 or not 0.0 <= self.alpha <= 1.0:
            raise SearchError("rrf_k must be >= 0 and alpha in [0, 1]")
        if not 1 <= self.depth <= MAX_K:
            raise SearchError(f"fusion depth must be between 1 and {MAX_K}, got {self.depth}")


def _contributions(docids: np.ndarray, scores: np.ndarray, opts: FusionOptions, weight: float) -> np.ndarray:
    if opts.method == "rrf":
        return 1.0 / (opts.rrf_k + np.arange(1, docids.size + 1, dtype=np.float64))
    s = scores.astype(np.float64)
    lo, hi = (s.min(), s.max()) if s.size else (0.0, 0.0)
    norm = (s - lo) / (hi - lo) if hi > lo else np.ones_like(s)
    return weight * norm


def fuse(rankings: list[tuple[np.ndarray, np.ndarray]], weights: list[float], k: int,
         opts: FusionOptions) -> tuple[np.ndarray, np.ndarray]:
    """Fuse ranked lists (docids, scores), each best first, into the top k: (docids int64, f64 scores).
    ``weights`` are the linear fusion's per-ranking weights (unused by RRF)."""
    ids = [np.asarray(d, dtype=np.int64) for d, _ in rankings]
    contrib = [_contributions(d, np.asarray(s), opts, w) for d, (_, s), w in zip(ids, rankings, weights)]
    if not ids or sum(d.size for d in ids) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.float64)
    all_ids = np.concatenate(ids)
    uniq, inv = np.unique(all_ids, return_inverse=True)
    total = np.zeros(uniq.size, dtype=np.float64)
    # Add the rankings in a fixed order, so equal inputs give equal sums bit for bit.
    start = 0
    for c in contrib:
        np.add.at(total, inv[start:start + c.size], c)
        start += c.size
    order = np.lexsort((uniq, -total))[:k]
    return uniq[order], total[order]


class HybridSearcher(Retriever):
    """A BM25 retriever's and a dense retriever's top-``depth`` lists fused (k1 and b go to the BM25 side)."""

    kind = "hybrid"
    takes_bm25_params = True

    def __init__(self, bm25, dense, options: FusionOptions = FusionOptions()) -> None:
        options.check()
        self.bm25 = bm25
        self.dense = dense
        self.options = options
        self.index = bm25.index
        self.backend_name = bm25.backend_name

    @property
    def manifest(self) -> dict:
        return self.index.manifest

    @property
    def backend(self):
        return self.bm25.backend

    def describe(self) -> dict:
        return {"retriever": "hybrid", "fusion": self.options.method, "bm25": self.bm25.backend.describe(),
                "dense": self.dense.describe()}

    @property
    def max_k(self) -> int:
        return min(self.bm25.max_k, self.dense.max_k)

    def _search_batch(self, queries: list[str], k: int, k1: float | None, b: float | None, with_text: bool,
                      times: StageTimes | None) -> list[list[Hit]]:
        depth = min(max(k, self.options.depth), self.max_k)  # a backend's lower limit bounds the depth too
        sparse = self.bm25.search_batch(queries, k=depth, k1=k1, b=b, with_text=False, times=times)
        dense = self.dense.search_batch(queries, k=depth, with_text=False, times=times)
        t0 = time.perf_counter()
        w = [1.0 - self.options.alpha, self.options.alpha]
        out = []
        for hs, hd in zip(sparse, dense):
            rank = [(np.array([h.docid for h in hits], np.int64), np.array([h.score for h in hits], np.float64))
                    for hits in (hs, hd)]
            hits = []
            for d, s in zip(*fuse(rank, w, k, self.options)):
                title, text = self.index.document(int(d)) if with_text else ("", "")
                hits.append(Hit(docid=int(d), id=self.index.external_id(int(d)), score=float(s), title=title, text=text))
            out.append(hits)
        if times is not None:
            times.retrieval += time.perf_counter() - t0
        return out

    def close(self) -> None:
        self.bm25.close()
        self.dense.close()
