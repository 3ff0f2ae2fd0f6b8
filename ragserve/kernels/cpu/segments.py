"""Several cpu backends' indexes searched as one, in one kernel call a query (``search.search_segments``): a live
index's segments (``retrieval/live.py``), scored with the live collection's statistics into one top-k.

A call per segment costs its numba dispatch (which unboxes every array of the segment), a top-k and a merge of
the lists in Python: about 20 us each, measured 2.5x the merged index's latency with 10 small delta segments on
1M passages. Here the segments' arrays sit in a numba typed List built once per snapshot (passing it costs the
same whatever the segment count, and its type never changes, so there is no compilation per count either), the
query's term ids in every segment are one int64 matrix, and one top-k takes the docs of all segments in a
shared docid space. Block-max pruning then skips a delta's blocks against the k-th score the larger segments set.
"""
from __future__ import annotations

import queue
import time

import numpy as np
from numba.typed import List

from ragserve.kernels.contract import StageTimes, TopK
from ragserve.kernels.cpu import search as S
from ragserve.kernels.cpu.backend import CpuBackend, _Buffers
from ragserve.kernels.cpu.selection import SMALL_TOPK, topk_sorted


class SegmentSet:
    """Indexes (each a ``CpuBackend``) in docid order, each with its deleted docs, searched with one norm cache
    (k1, b, avgdl of the whole collection) as one index. Each gets a range of a shared docid space (``firsts``):
    one after another, in order, so the space orders documents as the indexes' order does."""

    def __init__(self, parts: list[tuple[CpuBackend, np.ndarray]], k1: float, b: float, avgdl: float,
                 seed_part: int = 0, fold: tuple[int, list[np.ndarray], int] | None = None) -> None:
        """``parts``: (backend, deleted marks: u8 per doc or an empty array); ``seed_part`` the part whose postings
        seed each query's threshold (the largest: its k-th score prunes the others the most). ``fold``: (i, each
        of parts[i:]'s term id -> row of a vocabulary they share, its size): those parts (small ones: a live
        index's delta segments) are searched as ONE index (``search.fold_layouts``), their query term ids being
        that vocabulary's rows, where they are alike enough (else each on its own). ``rows`` is then the number
        of rows ``search`` takes a query's term ids in: one per part before i, one for the folded ones."""
        if not parts:
            raise ValueError("no indexes to search")
        first = parts[0][0]
        self.cache, _, _ = first._params(k1, b, avgdl)
        self.min_q = first._min_q[id(self.cache)]
        n_head = len(parts)
        if fold is not None:  # the longest run of the given ones that folds
            i = fold[0]
            while len(parts) - i >= 2 and not self._foldable([be for be, _ in parts[i:]], k1, b, avgdl):
                i += 1
            if len(parts) - i >= 2:
                n_head, fold = i, (i, fold[1][i - fold[0]:], fold[2])
        segs = List()
        firsts = np.zeros(len(parts), np.int64)
        raw = 0
        window = 1
        for j, (be, deleted) in enumerate(parts[:n_head]):
            _, default, args = be._params(k1, b, avgdl)
            firsts[j] = raw
            window = max(window, be._window)
            for shard in args:
                segs.append(tuple(S.Segment(shard, be._layout, deleted, np.int64(raw), np.int64(j), bool(default),
                                            np.int64(be._window), j == seed_part)))
            raw += be.index.num_docs
        self.rows = n_head
        if n_head < len(parts):
            window = max(window, self._fold(parts[n_head:], fold[1], fold[2], k1, b, avgdl, raw, firsts, n_head,
                                            seed_part >= n_head, segs))
            self.rows += 1
        self.firsts = firsts
        self._segs = segs
        self._window = window
        self._tuning = first._kernel_tuning
        self._executor = first._executor
        self._pool: queue.SimpleQueue[_Buffers] = queue.SimpleQueue()

    @staticmethod
    def _foldable(bes: list[CpuBackend], k1: float, b: float, avgdl: float) -> bool:
        """Whether these indexes can be searched as one (``search.fold_layouts``): one shard each, one block
        size, tf bits, fine block, norm fusion and bound kind."""
        if len(bes) < 2:
            return False
        kinds = {(len(be._shard_args), be.index.block_size, be.index.tf_bits, be._fine_block, be._fused,
                  be._params(k1, b, avgdl)[1]) for be in bes}
        return (len(kinds) == 1 and next(iter(kinds))[0] == 1
                and all(S.Shard._make(be._shard_args[0]).block_lo == 0 for be in bes))

    def _fold(self, parts: list[tuple[CpuBackend, np.ndarray]], rowmaps: list[np.ndarray], n_rows: int, k1: float,
              b: float, avgdl: float, raw: int, firsts: np.ndarray, row: int, seed: bool, segs: List) -> int:
        """Append the folded entry of ``parts`` (docids from ``raw``: each part at its first block there) to
        ``segs``; fills their ``firsts``; returns its window."""
        be0 = parts[0][0]
        bs = be0.index.block_size
        layouts, maps = List(), List()
        offs = np.zeros(len(parts), np.int64)
        nb = 0
        for j, (be, _) in enumerate(parts):
            shard = S.Shard._make(be._params(k1, b, avgdl)[2][0])
            layouts.append(shard.arrays)
            maps.append(np.ascontiguousarray(rowmaps[j], dtype=np.int64))
            offs[j] = nb
            firsts[row + j] = raw + nb * bs
            nb += shard.block_hi - shard.block_lo
        folded = S.fold_layouts(layouts, maps, np.int64(n_rows), offs)
        norms = np.zeros(0, np.uint8)
        if not be0._fused:  # the norms side by side as the blocks are (fused postings carry their own)
            norms = np.zeros(nb * bs, np.uint8)
            for (be, _), o in zip(parts, offs.tolist()):
                norms[o * bs:o * bs + be._norms.size] = be._norms
        deleted = np.zeros(0, np.uint8)
        if any(d.size for _, d in parts):
            deleted = np.zeros(nb * bs, np.uint8)
            for (_, d), o in zip(parts, offs.tolist()):
                deleted[o * bs:o * bs + d.size] = d
        window = max(be._window for be, _ in parts)
        layout = S.Layout(norms, np.int64(be0._fine_block), np.int64(bs), np.int64(be0.index.tf_bits), bool(be0._fused))
        segs.append(tuple(S.Segment(tuple(S.Shard(tuple(folded), np.int64(0), np.int64(nb))), tuple(layout), deleted,
                                    np.int64(raw), np.int64(row), bool(be0._params(k1, b, avgdl)[1]),
                                    np.int64(window), seed)))
        return window

    @staticmethod
    def can_search(be: CpuBackend) -> bool:
        """Whether a backend's arrays can join a set: copies in memory (the typed List holds one array type; file
        maps are read-only arrays, another type)."""
        return (all(a.flags.writeable for shard in map(S.Shard._make, be._shard_args) for a in shard.arrays)
                and be._norms.flags.writeable)

    def search(self, terms: list[np.ndarray], weights: list[np.ndarray], k: int,
               times: StageTimes | None = None) -> list[TopK]:
        """Each query's top-k over all parts: ``terms[i]`` its term ids (int64 [``rows``, n], -1: not there),
        ``weights[i]`` its f32 term weights (n, the order of the columns). Docids in the shared space."""
        t0 = time.perf_counter() if times is not None else 0.0
        if self._executor is not None and len(terms) > 1:
            out = list(self._executor.map(lambda tw: self._one(tw[0], tw[1], k), zip(terms, weights)))
        else:
            out = [self._one(t, w, k) for t, w in zip(terms, weights)]
        if times is not None:
            times.relevancy += time.perf_counter() - t0
        return out

    def _one(self, terms: np.ndarray, weights: np.ndarray, k: int) -> TopK:
        try:
            buf = self._pool.get_nowait()
        except queue.Empty:
            buf = _Buffers(self._window)
        try:
            docs, scores = S.search_segments(self._segs, terms, weights, self.cache, self.min_q, k, self._tuning,
                                             buf.scratch(k))
            if not docs.size and buf.st[0] > SMALL_TOPK:
                docs, scores = topk_sorted(buf.top, buf.st, k)
            return TopK(docs, scores)
        finally:
            self._pool.put(buf)
