"""The CPU backend's block traversal (numba): block-at-a-time BM25 scoring with safe MaxScore pruning and exact top-k.

A query walks the shard's doc blocks in order. Per block, each query term's block entry gives its postings
and a block-max bound; terms are scored into a block-sized f64 accumulator (it stays in L2 cache), and the
block's results go into one running top-k heap. Because later blocks hold larger docids, a later document
must score strictly above the heap's k-th score to enter it, which lets whole blocks, and the low-bound
terms of a block, be skipped once the heap is full.

The stages it strings together live in ``relevancy`` (term scores into the accumulator) and ``selection``
(the heap, a block's k-th score, candidate pruning); every kernel releases the GIL.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ragserve.kernels.cpu.relevancy import F1, probe_entry, scan_entry, score_entry
from ragserve.kernels.cpu.selection import count_above, flush_block, kth_largest, prune_candidates

SLACK = 1.0 + 1e-12  # on f64 sums of bounds: far below one f32 ulp, covers any summation-order rounding


@njit(nogil=True, cache=True)
def search_shard(postings, term_ptr, blk_id, blk_start, blk_maxq, blk_maxtf, blk_minnorm, norms, cache,
                 term_ids, weights, default_params, exact_sum, prune, k, block_size, tf_bits, block_lo, block_hi,
                 acc, touched, cands, hs, hd, hn):
    """Add one shard's matches to the top-k heap (hs, hd, size hn); returns the new heap size.

    Blocks are visited in docid order. With ``exact_sum`` (the f64 sum of the query's term scores is
    order-free) and ``prune``, terms of a block are visited in decreasing block-max bound (MaxScore):
    once the unseen terms' bounds cannot lift an unseen document into the top-k, the remaining terms only
    update the surviving candidates. Otherwise every term is added in ascending term-id order, the
    canonical order of FORMAT.md.
    """
    nq = term_ids.size
    shift = np.uint32(tf_bits)
    mask = np.uint32((1 << tf_bits) - 1)
    cur = np.empty(nq, dtype=np.int64)
    end = np.empty(nq, dtype=np.int64)
    for i in range(nq):
        cur[i] = term_ptr[term_ids[i]]
        end[i] = term_ptr[term_ids[i] + 1]
    ent = np.empty(nq, dtype=np.int64)
    bounds = np.empty(nq, dtype=np.float64)
    remaining = np.empty(nq, dtype=np.float64)
    for b in range(block_lo, block_hi):
        base = np.int64(b) * block_size
        total = 0.0
        present = 0
        for i in range(nq):
            while cur[i] < end[i] and blk_id[cur[i]] < b:
                cur[i] += 1
            if cur[i] < end[i] and blk_id[cur[i]] == b:
                e = cur[i]
                ent[i] = e
                if default_params:
                    q = blk_maxq[e]
                else:
                    q = np.float32(blk_maxtf[e]) * cache[blk_minnorm[e]]
                w = weights[i]
                bounds[i] = np.float64(w - w / (F1 + q))
                total += bounds[i]
                present += 1
            else:
                ent[i] = -1
                bounds[i] = 0.0
        if present == 0:
            continue
        heap_full = hn == k
        heap_theta = hs[0] if heap_full else np.float32(0.0)
        if prune and heap_full and np.float32(total * SLACK) <= heap_theta:
            continue  # no document of this block can beat the k-th score so far
        n_t = 0
        if not prune or not exact_sum or present == 1:
            for i in range(nq):
                if ent[i] >= 0:
                    n_t = score_entry(postings, blk_start[ent[i]], blk_start[ent[i] + 1], weights[i], cache, norms,
                                       base, acc, touched, n_t, shift, mask)
            hn = flush_block(acc, touched, n_t, base, hs, hd, hn, k)
            continue
        order = np.argsort(-bounds)
        remaining[nq - 1] = 0.0
        for i in range(nq - 2, -1, -1):
            remaining[i] = remaining[i + 1] + bounds[order[i + 1]]
        seen = 0.0
        i = 0
        switched = False
        while i < present:
            j = order[i]
            n_t = score_entry(postings, blk_start[ent[j]], blk_start[ent[j] + 1], weights[j], cache, norms, base,
                               acc, touched, n_t, shift, mask)
            seen += bounds[j]
            i += 1
            if i == present:
                break
            rest = remaining[i - 1] * SLACK
            # An unseen document scores at most `rest`: it cannot enter if that is not above the heap's k-th
            # score, nor if k documents of this block already score above it.
            if heap_full and np.float32(rest) <= heap_theta:
                switched = True
                break
            if n_t >= k and rest < seen and count_above(acc, touched, n_t, rest, k):
                switched = True
                break
        if not switched:
            hn = flush_block(acc, touched, n_t, base, hs, hd, hn, k)
            continue
        n_c = n_t
        src = touched
        is_sorted = False
        while i < present:
            local_theta = kth_largest(acc, src, n_c, k)
            n_c = prune_candidates(acc, src, n_c, remaining[i - 1] * SLACK, local_theta, heap_full, heap_theta, cands)
            src = cands
            j = order[i]
            lo = blk_start[ent[j]]
            hi = blk_start[ent[j] + 1]
            if n_c * 24 < hi - lo:
                if not is_sorted:  # pruning keeps the order, so one sort serves every later term
                    cands[:n_c].sort()
                    is_sorted = True
                probe_entry(postings, np.int64(lo), np.int64(hi), weights[j], cache, norms, base, acc, cands, n_c,
                             shift, mask)
            else:
                scan_entry(postings, lo, hi, weights[j], cache, norms, base, acc, shift, mask)
            i += 1
        hn = flush_block(acc, src, n_c, base, hs, hd, hn, k)
    return hn
