"""Bounds the layout defines from a shard's postings, needed both when an index is written and when it is searched:
a backend derives the fine bounds of an index written without them. Query-time code imports this module, never the
writer (which pulls in the whole build: readers, analysis pool, progress bars)."""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def fine_bounds(postings, blk_id, blk_start, norms, cache, tf_bits, block_size, fine_block):
    """The fine bounds of one shard (FORMAT.md, "Fine bounds"): each block entry's postings cut into runs of
    ``fine_block``; per run the max of q = f32(tf) * cache[norm] and the block offset of its last posting.
    Returns (fine_ptr [E+1], fine_maxq [F], fine_last [F])."""
    E = blk_id.size
    fine_ptr = np.empty(E + 1, dtype=np.uint32)
    f = 0
    for e in range(E):
        fine_ptr[e] = f
        f += (blk_start[e + 1] - blk_start[e] + fine_block - 1) // fine_block
    fine_ptr[E] = f
    maxq = np.zeros(f, dtype=np.float32)
    last = np.empty(f, dtype=np.uint32)
    shift = np.uint32(tf_bits)
    mask = np.uint32((1 << tf_bits) - 1)
    for e in range(E):
        base = np.int64(blk_id[e]) * block_size
        lo = np.int64(blk_start[e])
        hi = np.int64(blk_start[e + 1])
        f = np.int64(fine_ptr[e])
        for a in range(lo, hi, fine_block):
            b = min(a + fine_block, hi)
            m = np.float32(0.0)
            for j in range(a, b):
                p = postings[j]
                q = np.float32(p & mask) * cache[norms[base + (p >> shift)]]
                m = max(m, q)
            maxq[f] = m
            last[f] = postings[b - 1] >> shift
            f += 1
    return fine_ptr, maxq, last
