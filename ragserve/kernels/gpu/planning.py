"""Planning of the GPU backend's work, on the host and for the device: what each launch scores, in which order.

- Work items, one per (query, query term, shard) with postings (``ItemPlanner.items``, ordered by shard): a contiguous
  run of a shard's postings (``postings[a : a + n]``, entries ``e0 .. e0 + ne - 1``), the accumulator row it adds into
  and the term weight. The dense path's kernels only need these numbers, never ``term_ptr``.
- The tile plan (``plan_tiles``, ``plan_queries``): the items' block entries sorted by (row, doc block, term id) and
  grouped into (row, block) pairs, the units of the tile scorer (``relevancy``), with each row's ``flat_shift``.
- ``QueryTables``: what the device needs to plan a single query itself (``cuda/planning.cu``'s ``plan_single``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np
import torch
from numba import njit

from indexer import bm25
from indexer.bm25 import QueryTerms
from ragserve.kernels.gpu.cuda.kernels import QMAX


def tile_size(block_size: int, tile_max: int) -> int:
    """Tiles never straddle a doc block: the largest power of two <= ``tile_max`` dividing the block size."""
    return min(block_size, tile_max)


@dataclass
class Items:
    a: np.ndarray  # int64: first posting, shard-local
    n: np.ndarray  # int64: number of postings
    e0: np.ndarray  # int64: first block entry, shard-local
    ne: np.ndarray  # int64: number of block entries
    shard: np.ndarray  # int64: shard index
    term: np.ndarray  # int64: term id
    row: np.ndarray  # int64: accumulator row (query position in the batch)
    slot: np.ndarray  # int64: position of the term in its query (ascending term id)
    w: np.ndarray  # float32: term weight (boost * idf)

    def __len__(self) -> int:
        return int(self.a.size)

    def take(self, sel: np.ndarray) -> "Items":
        return Items(**{f.name: getattr(self, f.name)[sel] for f in fields(self)})

    @property
    def postings(self) -> int:
        return int(self.n.sum())


class ItemPlanner:
    """Host copies of every shard's ``term_ptr`` (side by side: row t holds every shard's pointer of term t, so a
    query term's lookups share a cache line), ``blk_start`` and ``blk_id`` (concatenated, the latter padded to the
    former's length so one offset per shard serves both), so planning a batch is a few vectorised lookups whatever
    the number of shards."""

    def __init__(self, term_ptrs: list[np.ndarray], blk_starts: list[np.ndarray], blk_ids: list[np.ndarray]) -> None:
        self.term_ptr = (np.stack([np.asarray(t) for t in term_ptrs], axis=1) if term_ptrs
                         else np.zeros((1, 0), np.uint32))  # [terms + 1, shards]
        self.blk_start = np.concatenate([np.asarray(b) for b in blk_starts]) if blk_starts else np.zeros(0, np.uint32)
        self.blk_id = (np.concatenate([np.append(np.asarray(b), np.uint32(0)) for b in blk_ids]) if blk_ids
                       else np.zeros(0, np.uint32))
        self.offsets = np.cumsum([0] + [b.size for b in blk_starts])[:-1].astype(np.int64)

    def items(self, queries: list[QueryTerms]) -> Items:
        """Items of a batch of analysed queries over all shards (row = position in ``queries``)."""
        if queries:
            terms = np.concatenate([q.term_ids.astype(np.int64) for q in queries])
            weights = np.concatenate([q.weights.astype(np.float32) for q in queries])
        else:
            terms, weights = np.zeros(0, np.int64), np.zeros(0, np.float32)
        lens = np.array([len(q) for q in queries], dtype=np.int64)
        rows = np.repeat(np.arange(len(queries), dtype=np.int64), lens)
        slots = np.arange(terms.size, dtype=np.int64) - np.repeat(np.cumsum(lens) - lens, lens)
        e0 = self.term_ptr[terms].T.astype(np.int64)  # [shards, terms]
        e1 = self.term_ptr[terms + 1].T.astype(np.int64)
        shard, k = np.nonzero(e1 > e0)
        e0, e1 = e0[shard, k], e1[shard, k]
        a = self.blk_start[self.offsets[shard] + e0].astype(np.int64)
        n = self.blk_start[self.offsets[shard] + e1].astype(np.int64) - a
        return Items(a=a, n=n, e0=e0, ne=e1 - e0, shard=shard.astype(np.int64), term=terms[k], row=rows[k],
                     slot=slots[k], w=weights[k])


@dataclass
class TilePlan:
    """One launch's work, on the host: entries sorted by (row, block, term id), grouped into (row, block) pairs."""

    table: np.ndarray  # int64: start, count, weight bits (n_ent each), [pad], row, blk, i0, i1, shift (n_pairs each)
    n_ent: int
    n_pairs: int
    pairs_at: int  # index of the pair columns in ``table`` (16-byte aligned)
    max_count: int  # postings of the longest entry

    @property
    def rows(self) -> int:
        """Rows of the batch: pairs are sorted by row."""
        return int(self.table[self.pairs_at + self.n_pairs - 1]) + 1 if self.n_pairs else 0

    @staticmethod
    def of(planned: tuple) -> "TilePlan":
        """From ``_plan``'s (table, n_ent, n_pairs, pairs_at, max_count)."""
        table, n_ent, n_pairs, at, max_count = planned
        return TilePlan(table=table, n_ent=int(n_ent), n_pairs=int(n_pairs), pairs_at=int(at), max_count=int(max_count))


@njit(cache=True, nogil=True)
def _plan(e0, ne, shard, row, wbits, pbase, offsets, blk_start, blk_id, n_rows, n_blocks, row_shift):
    """Counting sort of the items' block entries by (row, block). Within a bucket they keep the items' order,
    which is ascending term id: a block lies in one shard, and a shard's items of a row come in term order."""
    counts = np.zeros(n_rows * n_blocks + 1, np.int64)
    total = 0
    for i in range(e0.size):
        g0 = offsets[shard[i]] + e0[i]
        for g in range(g0, g0 + ne[i]):
            counts[row[i] * n_blocks + np.int64(blk_id[g]) + 1] += 1
        total += ne[i]
    n_pairs = 0
    for b in range(1, counts.size):
        if counts[b]:
            n_pairs += 1
        counts[b] += counts[b - 1]
    at = 3 * total + ((3 * total) & 1)
    table = np.zeros(at + 5 * n_pairs, np.int64)
    max_count = 0
    fill = counts[:-1].copy()
    for i in range(e0.size):
        g0 = offsets[shard[i]] + e0[i]
        for g in range(g0, g0 + ne[i]):
            j = fill[row[i] * n_blocks + np.int64(blk_id[g])]
            fill[row[i] * n_blocks + np.int64(blk_id[g])] = j + 1
            f = np.int64(blk_start[g])
            c = np.int64(blk_start[g + 1]) - f
            table[j] = pbase[i] + f
            table[total + j] = c
            table[2 * total + j] = wbits[i]
            max_count = max(max_count, c)
    p = 0
    for b in range(counts.size - 1):
        if counts[b + 1] > counts[b]:
            table[at + p] = b // n_blocks
            table[at + n_pairs + p] = b % n_blocks
            table[at + 2 * n_pairs + p] = counts[b]
            table[at + 3 * n_pairs + p] = counts[b + 1]
            table[at + 4 * n_pairs + p] = row_shift[b // n_blocks]
            p += 1
    return table, total, n_pairs, at, max_count


def plan_tiles(planner: ItemPlanner, items: Items, pbase: np.ndarray, n_blocks: int,
               shifts: np.ndarray | None = None) -> TilePlan:
    """Expand work items (query, term, shard; in ``ItemPlanner.items`` order) into their block entries and
    order them for the tile kernel. ``pbase`` is each item's arena offset of its shard's posting 0 (resident or
    staged); ``n_blocks`` the index's number of doc blocks; ``shifts`` per row: the CUDA kernel's ``flat_shift``
    (0: its terms are added one after the other; default)."""
    n_rows = int(items.row.max()) + 1 if len(items) else 0
    wbits = items.w.astype(np.float32).view(np.int32).astype(np.int64)
    row_shift = np.zeros(n_rows, np.int64)
    if shifts is not None:
        row_shift[:] = shifts[:n_rows]
    return TilePlan.of(_plan(items.e0, items.ne, items.shard, items.row, wbits, pbase.astype(np.int64),
                             planner.offsets, planner.blk_start, planner.blk_id, n_rows, n_blocks, row_shift))


sum_is_exact = njit(cache=True, nogil=True)(bm25.sum_is_exact)


@njit(cache=True, nogil=True)
def flat_shift(weights: np.ndarray, min_q: float) -> int:
    """The CUDA scorer's flat path for a query (compiled: a single query waits on it): 0 where its f64 sums are not
    exact in any order (``bm25.sum_is_exact``, with ``min_q`` its bound of q), or it has one term; else the shift S of
    the 64-bit fixed-point sums it adds them as: the largest with n * max(w) * 2^S < 2^63. Every term score s lies in
    [min_s, max(w)], and ``sum_is_exact`` holds n * max(w) under 2^53 ulp(min_s), so 2^S ulp(min_s) >= 2^10: s * 2^S
    is an integer, no sum reaches 2^63, the integer sums are exact, and their f32 rounding, scaled back, is the f64
    sum's. (With one term ``sum_is_exact`` bounds nothing; the ordered path adds it alike.)"""
    n = weights.size
    if n < 2 or not sum_is_exact(weights, min_q):
        return 0
    shift = 63 - math.frexp(n * np.float64(weights.max()))[1]  # n * max(w) < 2^(63 - shift)
    return shift if 1 <= shift <= 126 else 0  # 2^-shift a normal f32


@njit(cache=True, nogil=True)
def _plan_queries(terms, weights, lens, auto, min_q, term_ptr, offsets, blk_start, blk_id, pbase_shard,
                  n_blocks):
    """``ItemPlanner.items`` (per row, term and shard instead of per shard: the same order within a (row, block)
    bucket), the rows' ``flat_shift``, then ``_plan``."""
    n_rows = lens.size
    n_shards = term_ptr.shape[1]
    cap = terms.size * n_shards
    e0, ne, shard = np.empty(cap, np.int64), np.empty(cap, np.int64), np.empty(cap, np.int64)
    row, wb, pbase = np.empty(cap, np.int64), np.empty(cap, np.int64), np.empty(cap, np.int64)
    shift = np.zeros(n_rows, np.int64)
    wbits = weights.view(np.int32)
    m = 0
    at = 0
    for r in range(n_rows):
        if auto:
            shift[r] = flat_shift(weights[at:at + lens[r]], min_q)
        for j in range(at, at + lens[r]):
            t = terms[j]
            for sh in range(n_shards):
                a, b = np.int64(term_ptr[t, sh]), np.int64(term_ptr[t + 1, sh])
                if b > a:
                    e0[m], ne[m], shard[m], row[m], wb[m], pbase[m] = a, b - a, sh, r, wbits[j], pbase_shard[sh]
                    m += 1
        at += lens[r]
    return _plan(e0[:m], ne[:m], shard[:m], row[:m], wb[:m], pbase[:m], offsets, blk_start, blk_id, n_rows, n_blocks,
                 shift)


def plan_queries(planner: ItemPlanner, queries: list[QueryTerms], pbase: np.ndarray, n_blocks: int,
                 auto: bool, min_q: float) -> TilePlan:
    """``plan_tiles`` of a batch's items over all shards, straight from the analysed queries in one compiled call
    (the single-query latency is mostly host work). ``pbase`` is each shard's arena offset of its posting 0;
    a row takes the flat path when ``auto``, by its ``flat_shift(weights, min_q)``."""
    if len(queries) == 1:  # no concatenation (a single query waits on every microsecond here)
        terms, weights = queries[0].term_ids.astype(np.int64), queries[0].weights.astype(np.float32, copy=False)
    else:
        terms = np.concatenate([q.term_ids for q in queries]).astype(np.int64)
        weights = np.concatenate([q.weights for q in queries]).astype(np.float32, copy=False)
    lens = np.array([len(q) for q in queries], dtype=np.int64)
    return TilePlan.of(_plan_queries(terms, weights, lens, auto, float(min_q), planner.term_ptr, planner.offsets,
                                     planner.blk_start, planner.blk_id, pbase.astype(np.int64, copy=False), n_blocks))


@dataclass
class QueryTables:
    """Device tables ``plan_single`` plans a query from (addresses): every shard's ``term_ptr`` side by side (u32,
    [terms + 1, shards]: row t holds every shard's pointer of term t), each doc block's shard (i32), and per shard its
    entry base in the arena, posting base, first block and number of blocks (i64, [4, shards]); the arena's
    ``blk_id`` and ``blk_start``. ``keep`` holds the tensors."""

    term_ptr: int
    n_shards: int
    blk_shard: int
    shards: int
    blk_id: int
    blk_start: int
    keep: tuple

    @staticmethod
    def nbytes(planner: ItemPlanner, n_blocks: int, tpb: int) -> int:
        """Device bytes of the tables (the arena's are counted with the shards) and of the plan made from them
        (``TileScorer.set_query_tables``), ``tpb`` tiles a doc block."""
        plan = n_blocks * QMAX * (24 + 4 * tpb) + 40 * n_blocks
        return 4 * planner.term_ptr.size + 4 * n_blocks + 32 * planner.term_ptr.shape[1] + plan

    @staticmethod
    def build(planner: ItemPlanner, ebase: np.ndarray, pbase: np.ndarray, blocks: list[tuple[int, int]],
              blk_id: torch.Tensor, blk_start: torch.Tensor, device: torch.device) -> "QueryTables":
        """From the planner's ``term_ptr``, every shard's arena bases (``ebase``, ``pbase``: all resident) and block
        range ``[start, end)``."""
        n_blocks = max((e for _, e in blocks), default=0)
        blk_shard = np.zeros(n_blocks, np.int32)
        for i, (b0, b1) in enumerate(blocks):
            blk_shard[b0:b1] = i
        shards = np.array([ebase, pbase, [b for b, _ in blocks], [e - b for b, e in blocks]], np.int64)
        term_ptr = torch.from_numpy(np.ascontiguousarray(planner.term_ptr).view(np.int32)).to(device)
        blk_shard_t, shards_t = torch.from_numpy(blk_shard).to(device), torch.from_numpy(shards).to(device)
        return QueryTables(term_ptr.data_ptr(), len(blocks), blk_shard_t.data_ptr(), shards_t.data_ptr(),
                           blk_id.data_ptr(), blk_start.data_ptr(),
                           (term_ptr, blk_shard_t, shards_t, blk_id, blk_start))
