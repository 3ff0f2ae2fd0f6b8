"""The CPU backend (default): exact BM25 top-k with numba kernels, block by block, with safe MaxScore pruning.

See ``search.search_shard``: doc blocks are scored one at a time into an L2-sized accumulator and fed
to one running top-k heap; block-max bounds skip whole blocks and, within a block, let the low-weight
(common) terms only update surviving candidates once no unseen document can enter the top-k. Pruning is
used only when the f64 sum of the query's term scores is provably order-free (``bm25.sum_is_exact``,
nearly always); otherwise terms are added in ascending term-id order, the canonical order of
``indexer/FORMAT.md``. Either way the result is exact.
"""
from __future__ import annotations

import os
import queue
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from indexer.reader import IndexReader
from indexer import bm25
from ragserve.kernels.cpu.search import search_shard
from ragserve.kernels.cpu.selection import heap_sorted
from indexer.bm25 import QueryTerms
from ragserve.kernels.contract import Backend, StageTimes, TopK

class _Buffers:
    """Per-thread scratch: one block's accumulator and docid lists."""

    def __init__(self, block_size: int) -> None:
        self.acc = np.zeros(block_size, dtype=np.float64)
        self.touched = np.empty(block_size, dtype=np.int64)
        self.cands = np.empty(block_size, dtype=np.int64)


class CpuBackend(Backend):
    name = "cpu"
    thread_safe = True  # every call takes its own scratch from the pool

    def __init__(self, index: IndexReader, threads: int = 0, prune: bool = True, **options) -> None:
        super().__init__(index)
        self.threads = threads or os.cpu_count() or 1
        self.prune = prune
        self._norms = np.asarray(index.norms)
        self._pool: queue.SimpleQueue[_Buffers] = queue.SimpleQueue()
        self._executor = ThreadPoolExecutor(self.threads) if self.threads > 1 else None
        # Materialise the memory maps once: numba kernels take plain arrays.
        self._shards = [(s, {n: np.asarray(getattr(s, n)) for n in
                             ("postings", "term_ptr", "blk_id", "blk_start", "blk_maxq", "blk_maxtf", "blk_minnorm")})
                        for s in index.shards]

    def describe(self) -> dict:
        return {"backend": self.name, "threads": self.threads, "pruning": self.prune}

    def _buffers(self) -> _Buffers:
        try:
            return self._pool.get_nowait()
        except queue.Empty:
            return _Buffers(self.index.block_size)

    def search_terms(self, queries: list[QueryTerms], k: int, k1: float, b: float,
                     times: StageTimes | None = None) -> list[TopK]:
        t0 = time.perf_counter()
        cache = bm25.norm_cache(k1, b, self.index.avgdl)
        default_params = (np.float32(k1) == np.float32(self.index.k1)) and (np.float32(b) == np.float32(self.index.b))
        if self._executor is not None and len(queries) > 1:
            results = list(self._executor.map(lambda q: self._one(q, k, cache, default_params), queries))
        else:
            results = [self._one(q, k, cache, default_params) for q in queries]
        if times is not None:  # the call's wall time, split as its queries' scoring and ranking seconds are
            wall = time.perf_counter() - t0
            score = sum(r[1] for r in results)
            rank = sum(r[2] for r in results)
            share = score / (score + rank) if score + rank > 0 else 1.0
            times.relevancy += wall * share
            times.retrieval += wall * (1.0 - share)
        return [top for top, _, _ in results]

    def _one(self, q: QueryTerms, k: int, cache: np.ndarray, default_params: bool) -> tuple[TopK, float, float]:
        """One query's top-k, with the seconds of its scoring pass (the block heap fused in) and of its ranking."""
        t0 = time.perf_counter()
        if len(q) == 0:
            return TopK(np.zeros(0, np.int64), np.zeros(0, np.float32)), 0.0, 0.0
        hs = np.empty(k, dtype=np.float32)
        hd = np.empty(k, dtype=np.int64)
        hn = 0
        tids = q.term_ids.astype(np.int64)
        exact = bm25.sum_is_exact(q.weights, float(cache.min()))
        buf = self._buffers()
        try:
            for sh, a in self._shards:  # in docid order: the heap carries the k-th score across shards
                hn = search_shard(a["postings"], a["term_ptr"], a["blk_id"], a["blk_start"], a["blk_maxq"],
                                    a["blk_maxtf"], a["blk_minnorm"], self._norms, cache, tids, q.weights,
                                    default_params, exact, self.prune, k, self.index.block_size,
                                    self.index.tf_bits, sh.block_start, sh.block_end, buf.acc, buf.touched,
                                    buf.cands, hs, hd, hn)
        finally:
            self._pool.put(buf)
        t1 = time.perf_counter()
        docs = np.empty(hn, dtype=np.int64)
        scores = np.empty(hn, dtype=np.float32)
        heap_sorted(hs, hd, hn, docs, scores)
        return TopK(docs, scores), t1 - t0, time.perf_counter() - t1

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False)
