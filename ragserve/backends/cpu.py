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

_EPS = 1e-12  # slack on f64 bound sums, far below one f32 ulp


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

    def _bounds(self, arr: dict, q: QueryTerms, cache: np.ndarray, default_params: bool) -> np.ndarray:
        """Upper bound of each query term's score in this shard (0 for a term absent from it)."""
        bounds = np.zeros(len(q), dtype=np.float64)
        tp = arr["term_ptr"]
        for i, t in enumerate(q.term_ids.tolist()):
            e0, e1 = int(tp[t]), int(tp[t + 1])
            if e0 == e1:
                continue
            if default_params:
                maxq = np.float32(arr["blk_maxq"][e0:e1].max())
            else:
                maxq = (arr["blk_maxtf"][e0:e1].astype(np.float32) * cache[arr["blk_minnorm"][e0:e1]]).max()
            w = q.weights[i]
            bounds[i] = float(np.float32(w - w / (np.float32(1.0) + np.float32(maxq))))
        return bounds

    def _shard(self, sh: Shard, arr: dict, q: QueryTerms, k: int, cache: np.ndarray, default_params: bool,
               buf: _Buffers) -> tuple[np.ndarray, np.ndarray]:
        args = (arr["postings"], arr["term_ptr"], arr["blk_id"], arr["blk_start"], self._norms, cache)
        bs, tfb, ds = self.index.block_size, self.index.tf_bits, sh.doc_start
        acc, touched, cands = buf.acc, buf.touched, buf.cands
        out_d = np.empty(k, dtype=np.int64)
        out_s = np.empty(k, dtype=np.float32)
        min_q = float(cache.min())
        if not self.prune or len(q) == 1 or not bm25.sum_is_exact(q.weights, min_q):
            n_t = K.score_terms(*args, q.term_ids, q.weights, bs, tfb, ds, acc, touched, 0,
                                np.arange(len(q), dtype=np.int64))
            n = K.topk_and_reset(acc, touched, n_t, k, ds, out_d, out_s, np.float32(0.0))
            return out_d[:n], out_s[:n]

        bounds = self._bounds(arr, q, cache, default_params)
        order = np.argsort(-bounds, kind="stable")
        remaining = np.concatenate((np.cumsum(bounds[order][::-1])[::-1][1:], [0.0]))
        n_t = 0
        i = 0
        while i < order.size:
            if bounds[order[i]] == 0.0:
                break  # this and every later term are absent from the shard
            n_t = K.score_terms(*args, q.term_ids, q.weights, bs, tfb, ds, acc, touched, n_t, order[i:i + 1])
            rest = remaining[i] * (1 + _EPS)
            i += 1
            if i < order.size and n_t >= k:
                theta = K.kth_largest(acc, touched, n_t, k)
                if np.float32(rest) < np.float32(theta):
                    break
        else:
            n = K.topk_and_reset(acc, touched, n_t, k, ds, out_d, out_s, np.float32(0.0))
            return out_d[:n], out_s[:n]
        # Candidate mode: no unseen document can enter the top-k any more.
        n_c = n_t
        cands_view = touched
        while i < order.size and bounds[order[i]] > 0.0:
            theta = K.kth_largest(acc, cands_view, n_c, k)
            n_c = K.prune_candidates(acc, cands_view, n_c, remaining[i - 1] * (1 + _EPS), theta, cands)
            cands_view = cands
            j = order[i]
            t = int(q.term_ids[j])
            postings = int(arr["blk_start"][arr["term_ptr"][t + 1]] - arr["blk_start"][arr["term_ptr"][t]])
            if n_c * 24 < postings:
                K.rescore_candidates(*args, t, q.weights[j], bs, tfb, ds, acc, cands, n_c)
            else:
                K.scan_candidates(*args, t, q.weights[j], bs, tfb, ds, acc)
            i += 1
        n = K.topk_and_reset(acc, cands_view, n_c, k, ds, out_d, out_s, np.float32(0.0))
        return out_d[:n], out_s[:n]

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False)
