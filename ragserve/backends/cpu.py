"""The CPU backend (default): exact BM25 top-k with numba kernels and safe MaxScore pruning.

Per shard and query: terms are scored term-at-a-time into an f64 accumulator. When the f64 sum of the
query's term scores is provably exact (``bm25.sum_is_exact``, nearly always), terms go in decreasing
order of their upper bound and, once no unseen document can reach the current k-th score, the remaining
(common, low-weight) terms only update the surviving candidates. Otherwise every term is added in
ascending term-id order, the canonical order of ``indexer/FORMAT.md``. Either way the result is exact.
"""
from __future__ import annotations

import os
import queue
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from indexer.reader import IndexReader, Shard
from ragserve import bm25
from ragserve.backends import cpu_kernels as K
from ragserve.bm25 import QueryTerms
from ragserve.searcher import Backend, KernelTimes, TopK

class _Buffers:
    def __init__(self, size: int) -> None:
        self.acc = np.zeros(size, dtype=np.float64)
        self.touched = np.empty(size, dtype=np.int64)
        self.cands = np.empty(size, dtype=np.int64)


class CpuBackend(Backend):
    name = "cpu"

    def __init__(self, index: IndexReader, threads: int = 0, prune: bool = True, **options) -> None:
        super().__init__(index)
        self.threads = threads or os.cpu_count() or 1
        self.prune = prune
        self._norms = np.asarray(index.norms)
        self._max_docs = max((s.doc_end - s.doc_start for s in index.shards), default=0)
        self._pool: queue.SimpleQueue[_Buffers] = queue.SimpleQueue()
        self._executor = ThreadPoolExecutor(self.threads) if self.threads > 1 else None
        # Materialise the memory maps once: numba kernels take plain arrays.
        self._shards = [(s, {n: np.asarray(getattr(s, n)) for n in
                             ("postings", "term_ptr", "blk_id", "blk_start", "blk_maxq", "blk_maxtf", "blk_minnorm")})
                        for s in index.shards]
        for _, arr in self._shards:
            arr["term_maxq"] = K.term_max_q(arr["term_ptr"], arr["blk_maxq"])

    def describe(self) -> dict:
        return {"backend": self.name, "threads": self.threads, "pruning": self.prune}

    def _buffers(self) -> _Buffers:
        try:
            return self._pool.get_nowait()
        except queue.Empty:
            return _Buffers(self._max_docs)

    def search_terms(self, queries: list[QueryTerms], k: int, k1: float, b: float,
                     times: KernelTimes | None = None) -> list[TopK]:
        t0 = time.perf_counter()
        cache = bm25.norm_cache(k1, b, self.index.avgdl)
        default_params = (np.float32(k1) == np.float32(self.index.k1)) and (np.float32(b) == np.float32(self.index.b))
        if self._executor is not None and len(queries) > 1:
            results = list(self._executor.map(lambda q: self._one(q, k, cache, default_params), queries))
        else:
            results = [self._one(q, k, cache, default_params) for q in queries]
        if times is not None:
            times.relevancy += time.perf_counter() - t0
        return results

    def _one(self, q: QueryTerms, k: int, cache: np.ndarray, default_params: bool) -> TopK:
        if len(q) == 0:
            return TopK(np.zeros(0, np.int64), np.zeros(0, np.float32))
        buf = self._buffers()
        try:
            parts = [self._shard(sh, arr, q, k, cache, default_params, buf) for sh, arr in self._shards]
        finally:
            self._pool.put(buf)
        docs = np.concatenate([p[0] for p in parts])
        scores = np.concatenate([p[1] for p in parts])
        order = np.lexsort((docs, -scores.astype(np.float64)))[:k]
        return TopK(docs[order], scores[order])

    def _shard(self, sh: Shard, arr: dict, q: QueryTerms, k: int, cache: np.ndarray, default_params: bool,
               buf: _Buffers) -> tuple[np.ndarray, np.ndarray]:
        tids = q.term_ids.astype(np.int64)
        if default_params:
            maxq = arr["term_maxq"][tids]
        else:
            maxq = K.general_max_q(arr["term_ptr"], arr["blk_maxtf"], arr["blk_minnorm"], cache, tids)
        w = q.weights
        # Upper bound of each term's score in this shard (s is monotone in q); 0 for an absent term.
        bounds = np.where(maxq > 0, (w - w / (np.float32(1.0) + maxq)).astype(np.float32), np.float32(0.0))
        exact = bool(self.prune) and bm25.sum_is_exact(w, float(cache.min()))
        out_d = np.empty(k, dtype=np.int64)
        out_s = np.empty(k, dtype=np.float32)
        n = K.search_shard(arr["postings"], arr["term_ptr"], arr["blk_id"], arr["blk_start"], self._norms, cache,
                           tids, w, bounds.astype(np.float64), exact, k, self.index.block_size,
                           self.index.tf_bits, sh.doc_start, buf.acc, buf.touched, buf.cands, out_d, out_s)
        return out_d[:n], out_s[:n]

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False)
