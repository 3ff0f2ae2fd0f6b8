"""Work items of the GPU backend, planned on the host: one per (query, query term, shard) with postings.

Items are ordered by shard. An item names a contiguous run of a shard's postings (``postings[a : a + n]``, entries ``e0 .. e0 + ne - 1``),
the accumulator row it adds into and the term weight. Kernels only need these numbers, never ``term_ptr``.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from indexer.bm25 import QueryTerms


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
