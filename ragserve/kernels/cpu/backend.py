"""The CPU backend (default): exact BM25 top-k with numba kernels, block-max MaxScore over windows of docs.

See ``search.search_shard``: each doc block is walked in windows; the fine bounds of the layout (max q per run
of 128 postings) bound each term in a window, so windows that cannot beat the running k-th score are skipped,
and within a window only the essential terms are scored into a window-sized accumulator, the others updating
the surviving candidates. Reordering terms is used only when the f64 sum of the query's
term scores is provably order-free (``bm25.sum_is_exact``, nearly always); otherwise terms are added in
ascending term-id order, the canonical order of ``indexer/FORMAT.md``. Either way the result is exact.

At open the layout's arrays are copied into memory on huge pages, the postings with each doc's length byte fused
in (``relevancy.fuse_norms``; the files keep the layout's format, which the GPU and FPGA read). Each query's
threshold starts at a score k documents are known to reach (``search.initial_threshold``). A query is one numba
call (``search.search_query``) on per-thread scratch: the fixed costs of several calls and allocations are a few
percent of a short query.
"""
from __future__ import annotations

import math
import mmap
import os
import queue
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from indexer.reader import IndexReader
from indexer import bm25
from indexer import layout as L
from indexer.bounds import fine_bounds
from ragserve.kernels.cpu import relevancy as R
from ragserve.kernels.cpu import search as S
from ragserve.kernels.cpu.selection import SMALL_TOPK, topk_sorted
from indexer.bm25 import QueryTerms
from ragserve.kernels.contract import Backend, StageTimes, TopK

@dataclass(frozen=True)
class CpuTuning:
    """Tuning settings of the traversal (``search.search_shard``)."""

    window: int = 32768  # docs per window (a power of two): its f64 accumulator (256 KiB) stays in L2; with the
    # norms fused into the postings, measured 3-9% faster than 16384 on 1M passages (65536: no faster)
    # Binary-search candidates in a term's window when candidates * ratio < its postings, else scan them (measured:
    # on 1M passages a probe costs about as much as scanning 64 postings).
    probe_ratio: int = 64
    # Without fused norms, fetch a window's norms as one stream before scoring it (measured: 3-6% off a query
    # after other work; a prefetch of the postings ranges as well gained nothing).
    prefetch_norms: bool = True
    # Start each query's threshold at a score k documents are known to reach (``search.initial_threshold``):
    # exact scores of a term's postings, all of them up to ``seed_exact``, else of its best fine blocks.
    seed: bool = True
    seed_exact: int = 1024
    # Copy the layout's search arrays into memory on huge pages at open (else read them through the file maps).
    resident: bool = True
    # Back those copies with 2 MiB pages. Off for a small index (a live index's delta segment): a huge page an
    # array would cost more memory than the whole index, for no fewer TLB misses.
    huge_pages: bool = True
    # In that copy, put each doc's length byte into its postings (``relevancy.fuse_norms``), where the bits allow:
    # scoring then reads no norms at random (the file's postings are left as they are).
    fuse_norms: bool = True


HUGE_PAGE = 2 << 20


def resident_copy(a: np.ndarray, huge: bool = True) -> np.ndarray:
    """A copy of ``a`` in anonymous memory that the kernel is asked to back with 2 MiB pages (Linux transparent
    huge pages): a query touches postings, norms and bounds all over the index, and with 4 KiB pages of a file
    map most of those touches also miss the TLB (costly under virtualisation: measured 20% of a query that
    follows other work, 1M passages). Falls back to an ordinary copy where huge pages cannot be asked for (or
    without ``huge``)."""
    a = np.asarray(a)
    out = resident_empty(a.size, a.dtype, huge)
    out[:] = a
    return out


def resident_empty(n: int, dtype: np.dtype, huge: bool = True) -> np.ndarray:
    """An uninitialised 1-D array of ``n`` items on 2 MiB pages where the kernel grants them (``resident_copy``)."""
    dtype = np.dtype(dtype)
    if not huge:
        return np.empty(n, dtype=dtype)
    size = -(-max(n * dtype.itemsize, 1) // HUGE_PAGE) * HUGE_PAGE
    try:
        m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        m.madvise(mmap.MADV_HUGEPAGE)
    except (AttributeError, OSError, ValueError):
        return np.empty(n, dtype=dtype)
    return np.frombuffer(m, dtype=dtype, count=n)


STAT_NAMES = ("scored", "scanned", "probes", "candidates", "windows", "skipped_windows", "skipped_postings",
              "flushed", "pushes", "dead_postings")


class _Buffers:
    """Per-thread scratch: one window's accumulator and offset lists, the top-k buffer and state, the counters."""

    def __init__(self, window: int) -> None:
        self.acc = np.zeros(window, dtype=np.float64)
        self.live = np.zeros(window, dtype=np.uint8)
        self.touched = np.empty(window, dtype=np.int64)
        self.cands = np.empty(window, dtype=np.int64)
        self.st = np.zeros(3, dtype=np.uint64)
        self.stats = np.zeros(S.N_STATS, dtype=np.int64)  # counts accumulate here unless a caller asks for them
        self.k = 0
        self.top = np.empty(0, dtype=np.uint64)
        self._scratch: tuple = ()

    def scratch(self, k: int, stats: np.ndarray | None = None) -> tuple:
        """The kernels' ``search.Scratch`` for top-k (2k keys: ``selection.flush_block`` reads k from their
        number), as the plain tuple they take; ``stats`` counts the work instead of the buffers' own counters."""
        if k != self.k:
            self.k = k
            self.top = np.empty(2 * k, dtype=np.uint64)
            self._scratch = ()
        if stats is not None:
            return tuple(S.Scratch(self.acc, self.live, self.touched, self.cands, self.top, self.st, stats))
        if not self._scratch:
            self._scratch = tuple(S.Scratch(self.acc, self.live, self.touched, self.cands, self.top, self.st,
                                            self.stats))
        return self._scratch


class CpuBackend(Backend):
    name = "cpu"
    thread_safe = True  # every call takes its own scratch from the pool

    def __init__(self, index: IndexReader, threads: int = 0, prune: bool = True, tuning: CpuTuning | None = None,
                 **options) -> None:
        super().__init__(index)
        self.threads = threads or os.cpu_count() or 1
        self.prune = prune
        self.tuning = tuning or CpuTuning()
        w = self.tuning.window
        if w < 1 or w & (w - 1):
            raise ValueError(f"window must be a power of two, got {w}")
        self._window = min(w, index.block_size)
        if index.num_docs >= 1 << 32:
            raise ValueError("the cpu backend's heap keys hold docids below 2^32")
        self._norms = self._load(index.norms)
        offset_bits = (index.block_size - 1).bit_length()
        self._fused = bool(self.tuning.resident and self.tuning.fuse_norms
                           and offset_bits + index.tf_bits + R.NORM_BITS <= 32)
        self._pool: queue.SimpleQueue[_Buffers] = queue.SimpleQueue()
        self._executor = ThreadPoolExecutor(self.threads) if self.threads > 1 else None
        # Materialise the memory maps once: numba kernels take plain arrays.
        self._shards = [(s, self._arrays(s)) for s in index.shards]
        # The kernels' arguments (``search.Shard``, ``search.Layout``, ``search.Tuning``) as the plain tuples they
        # take: built once.
        self._shard_args = tuple(tuple(S.Shard(tuple(S.ShardArrays(**a)), int(s.block_start), int(s.block_end)))
                                 for s, a in self._shards)
        self._fine_block = index.fine_block or L.DEFAULT_FINE_BLOCK
        self._layout = tuple(S.Layout(self._norms, self._fine_block, index.block_size, index.tf_bits, self._fused))
        t = self.tuning
        self._kernel_tuning = tuple(S.Tuning(prune, t.seed, t.seed_exact, t.probe_ratio, t.prefetch_norms))
        self._caches: dict[tuple, tuple[np.ndarray, bool, tuple]] = {}
        # Smallest value of each cache, by its id (for search.sum_is_exact). Never cleared, so a search holding a
        # cache dropped from ``_caches`` still finds it; a float per avgdl a live index ever had.
        self._min_q: dict[int, float] = {}
        self._scaled: dict[float, tuple] = {}  # scaled shard arguments by their ratio (``_scaled_bounds``)

    def _load(self, a: np.ndarray) -> np.ndarray:
        """A layout array as the kernels read it: copied into memory backed by huge pages when ``resident``, else
        the memory map itself (numba kernels take plain arrays)."""
        return resident_copy(a, self.tuning.huge_pages) if self.tuning.resident else np.asarray(a)

    def _arrays(self, s) -> dict:
        a = {n: self._load(getattr(s, n)) for n in
             ("term_ptr", "blk_id", "blk_start", "blk_maxq", "blk_maxtf", "blk_minnorm")}
        a["postings"] = np.asarray(s.postings) if self._fused else self._load(s.postings)
        if s.fine_ptr is not None:
            a.update(fine_ptr=self._load(s.fine_ptr), fine_maxq=self._load(s.fine_maxq),
                     fine_last=self._load(s.fine_last))
        else:  # an index written without fine bounds: derive them (one pass over the postings)
            cache = bm25.norm_cache(self.index.k1, self.index.b, self.index.avgdl)
            a["fine_ptr"], a["fine_maxq"], a["fine_last"] = fine_bounds(
                a["postings"], a["blk_id"], a["blk_start"], self._norms, cache, self.index.tf_bits,
                self.index.block_size, L.DEFAULT_FINE_BLOCK)
        if self._fused:
            fused = resident_empty(a["postings"].size, np.uint32, self.tuning.huge_pages)
            R.fuse_norms(a["postings"], a["blk_id"], a["blk_start"], self._norms, self.index.tf_bits,
                         self.index.block_size, fused)
            a["postings"] = fused
        return a

    def describe(self) -> dict:
        return {"backend": self.name, "threads": self.threads, "pruning": self.prune, "window": self._window,
                "fused_norms": self._fused}

    def _params(self, k1: float, b: float, avgdl: float | None = None) -> tuple[np.ndarray, bool, tuple]:
        """The norm cache of (k1, b) and ``avgdl`` (default the index's), whether the layout's bounds apply (the
        layout's k1 and b), and the shard arguments to search with: the layout's, or for another avgdl, copies
        whose bounds are scaled to hold under it (``_scaled_bounds``)."""
        got = self._caches.get((k1, b, avgdl))
        if got is None:
            default = (np.float32(k1) == np.float32(self.index.k1)) and (np.float32(b) == np.float32(self.index.b))
            a = self.index.avgdl if avgdl is None else np.float32(avgdl)
            cache = bm25.norm_cache(k1, b, a)
            args = self._shard_args
            if default and a != self.index.avgdl:
                args = self._scaled_bounds(cache)
                default = args is not None
                args = args or self._shard_args
            if len(self._caches) > 16:  # a live index's avgdl changes at every refresh: keep a bounded few
                self._caches.clear()
            self._min_q[id(cache)] = float(cache.min())  # before the cache is handed out: ``_one`` reads it
            got = self._caches[(k1, b, avgdl)] = (cache, bool(default), args)
        return got

    def _scaled_bounds(self, cache: np.ndarray) -> tuple | None:
        """The shard arguments with ``blk_maxq`` and ``fine_maxq`` scaled to bound q under ``cache`` (a live
        collection's avgdl) instead of the layout's: with r = max over norms of cache / layout cache,
        ``q' = f32(tf * cache[n]) <= f32 rounded up(maxq * r * (1 + 2^-22))`` (maxq is within 2^-24 of the real
        ``tf * layout cache[n]``, and rounding is monotone), so pruning stays exact. None where no finite r exists.
        r is rounded up to a grid of 2^(1/128) (0.5% steps), so the copies serve every avgdl whose r rounds alike:
        a live index's avgdl moves a little at each refresh, and scaling a 1M-passage index's bounds again each
        time cost ~0.1 s (under the index's write lock, as its searcher readies itself for the new snapshot)."""
        own = bm25.norm_cache(self.index.k1, self.index.b, self.index.avgdl).astype(np.float64)
        new = cache.astype(np.float64)
        if not (np.all(np.isfinite(own)) and np.all(np.isfinite(new)) and np.all(own > 0)):
            return None
        exact = float((new / own).max()) * (1.0 + 2.0**-22)
        r = 2.0 ** (math.ceil(math.log2(exact) * 128) / 128)
        while r < exact:  # the grid point as computed may round below
            r *= 1.0 + 2.0**-40
        got = self._scaled.get(r)
        if got is not None:
            return got

        def scaled(a: np.ndarray) -> np.ndarray:
            x = np.asarray(a, dtype=np.float64) * r
            return np.nextafter(x.astype(np.float32), np.float32(np.inf))  # rounded up, whatever f32 rounding did

        out = []
        for shard in map(S.Shard._make, self._shard_args):
            a = S.ShardArrays(*shard.arrays)
            a = a._replace(blk_maxq=scaled(a.blk_maxq), fine_maxq=scaled(a.fine_maxq))
            out.append(tuple(shard._replace(arrays=tuple(a))))
        if len(self._scaled) > 8:
            self._scaled.clear()
        got = self._scaled[r] = tuple(out)
        return got

    def search_terms(self, queries: list[QueryTerms], k: int, k1: float, b: float,
                     times: StageTimes | None = None, avgdl: float | None = None) -> list[TopK]:
        t0 = time.perf_counter() if times is not None else 0.0
        cache, default_params, args = self._params(k1, b, avgdl)
        if self._executor is not None and len(queries) > 1:
            results = list(self._executor.map(lambda q: self._one(q, k, cache, default_params, args=args), queries))
        else:
            results = [self._one(q, k, cache, default_params, args=args) for q in queries]
        if times is None:
            return [top for top, _ in results]
        # The call's wall time, split as its queries' scoring (a few kept keys ranked in the same call) and
        # ranking (NumPy's sort of many kept keys) seconds are.
        wall = time.perf_counter() - t0
        rank = sum(r[1] for r in results)
        share = min(rank / wall, 1.0) if wall > 0 else 0.0
        times.relevancy += wall * (1.0 - share)
        times.retrieval += wall * share
        return [top for top, _ in results]

    def search_with_stats(self, q: QueryTerms, k: int, k1: float, b: float) -> tuple[TopK, dict[str, int]]:
        """One query's top-k and the counts of its work (``STAT_NAMES``: postings scored, scanned, ...)."""
        cache, default_params, _ = self._params(k1, b)
        stats = np.zeros(S.N_STATS, dtype=np.int64)
        top, _ = self._one(q, k, cache, default_params, stats)
        return top, dict(zip(STAT_NAMES, stats.tolist()))

    def _one(self, q: QueryTerms, k: int, cache: np.ndarray, default_params: bool,
             stats: np.ndarray | None = None, args: tuple | None = None) -> tuple[TopK, float]:
        """One query's top-k (``search.search_query``), with the seconds of its ranking by NumPy (0 when the
        kernel ranked the kept keys itself)."""
        if q.term_ids.size == 0:
            return TopK(np.zeros(0, np.int64), np.zeros(0, np.float32)), 0.0
        try:
            buf = self._pool.get_nowait()
        except queue.Empty:
            buf = _Buffers(self._window)
        try:
            docs, scores = S.search_query(args or self._shard_args, self._layout, self._window, cache,
                                          self._min_q[id(cache)], q.term_ids, q.weights, default_params, k,
                                          self._kernel_tuning, buf.scratch(k, stats))
            if docs.size or buf.st[0] <= SMALL_TOPK:
                return TopK(docs, scores), 0.0
            t1 = time.perf_counter()
            docs, scores = topk_sorted(buf.top, buf.st, k)
            return TopK(docs, scores), time.perf_counter() - t1
        finally:
            self._pool.put(buf)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False)
