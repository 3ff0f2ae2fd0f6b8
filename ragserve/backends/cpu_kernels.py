"""numba kernels of the CPU backend: block-at-a-time BM25 scoring with safe MaxScore pruning and exact top-k.

A query walks the shard's doc blocks in order. Per block, each query term's block entry gives its postings
and a block-max bound; terms are scored into a block-sized f64 accumulator (it stays in L2 cache), and the
block's results go into one running top-k heap. Because later blocks hold larger docids, a later document
must score strictly above the heap's k-th score to enter it, which lets whole blocks, and the low-bound
terms of a block, be skipped once the heap is full.

All kernels release the GIL so a batch runs one query per thread. f32 arithmetic is kept f32 by casting
every constant (numba would otherwise promote to f64 and change the bits).
"""
from __future__ import annotations

import numpy as np
from numba import njit

F1 = np.float32(1.0)
SLACK = 1.0 + 1e-12  # on f64 sums of bounds: far below one f32 ulp, covers any summation-order rounding


@njit(nogil=True, cache=True, inline="always")
def _term_score(w, tf, c):
    q = np.float32(tf) * c
    return w - w / (F1 + q)


@njit(nogil=True, cache=True)
def _score_entry(postings, lo, hi, w, cache, norms, base, acc, touched, n_t, shift, mask):
    """Add one block entry's postings into ``acc`` (indexed by offset in the block); returns the touched count."""
    for j in range(lo, hi):
        p = postings[j]
        off = np.int64(p >> shift)
        s = _term_score(w, p & mask, cache[norms[base + off]])
        a = acc[off]
        # Branch-free first-touch bookkeeping: whether a doc was seen before is unpredictable.
        touched[n_t] = off
        n_t += a == 0.0
        acc[off] = a + np.float64(s)
    return n_t


@njit(nogil=True, cache=True)
def _scan_entry(postings, lo, hi, w, cache, norms, base, acc, shift, mask):
    """Add one entry's scores to the docs that are still candidates (acc != 0), by a linear scan."""
    for j in range(lo, hi):
        p = postings[j]
        off = np.int64(p >> shift)
        a = acc[off]
        if a != 0.0:
            acc[off] = a + np.float64(_term_score(w, p & mask, cache[norms[base + off]]))


@njit(nogil=True, cache=True)
def _probe_entry(postings, lo, hi, w, cache, norms, base, acc, cands, n_c, shift, mask):
    """Add one entry's scores to the candidates (sorted offsets) by binary search: for few candidates."""
    for ci in range(n_c):
        target = np.uint32(cands[ci])
        a, b = lo, hi
        while a < b:
            mid = (a + b) >> 1
            if (postings[mid] >> shift) < target:
                a = mid + 1
            else:
                b = mid
        if a == hi:
            break
        lo = a
        if (postings[a] >> shift) == target:
            off = np.int64(target)
            acc[off] += np.float64(_term_score(w, postings[a] & mask, cache[norms[base + off]]))


@njit(nogil=True, cache=True)
def _sift_down(hs, hd, n, i):
    # Min-heap on (score asc, docid desc): the root is the worst of the kept top-k.
    while True:
        left = 2 * i + 1
        if left >= n:
            return
        r = left + 1
        m = left
        if r < n and (hs[r] < hs[left] or (hs[r] == hs[left] and hd[r] > hd[left])):
            m = r
        if hs[m] < hs[i] or (hs[m] == hs[i] and hd[m] > hd[i]):
            hs[i], hs[m] = hs[m], hs[i]
            hd[i], hd[m] = hd[m], hd[i]
            i = m
        else:
            return


@njit(nogil=True, cache=True)
def _heap_push(hs, hd, n, k, s, d):
    """Offer (score s, docid d) to the top-k heap of size n; returns the new size."""
    if n < k:
        j = n
        hs[j] = s
        hd[j] = d
        n += 1
        while j > 0:
            p = (j - 1) >> 1
            if hs[j] < hs[p] or (hs[j] == hs[p] and hd[j] > hd[p]):
                hs[j], hs[p] = hs[p], hs[j]
                hd[j], hd[p] = hd[p], hd[j]
                j = p
            else:
                break
    elif s > hs[0] or (s == hs[0] and d < hd[0]):
        hs[0] = s
        hd[0] = d
        _sift_down(hs, hd, n, 0)
    return n


@njit(nogil=True, cache=True)
def heap_sorted(hs, hd, n, out_docs, out_scores):
    """Empty the heap into ``out_*`` best first (score desc, docid asc); returns n."""
    for j in range(n - 1, -1, -1):
        out_scores[j] = hs[0]
        out_docs[j] = hd[0]
        hs[0] = hs[j]
        hd[0] = hd[j]
        _sift_down(hs, hd, j, 0)
    return n


@njit(nogil=True, cache=True)
def _flush_block(acc, idx, n, base, hs, hd, hn, k):
    """Move a block's accumulated docs into the heap (f32 scores) and zero the accumulator."""
    for i in range(n):
        off = idx[i]
        s = np.float32(acc[off])
        acc[off] = 0.0
        # Most docs lose to the heap's root: test here, as a call per doc costs more than the test.
        if hn < k or s > hs[0] or (s == hs[0] and base + off < hd[0]):
            hn = _heap_push(hs, hd, hn, k, s, base + off)
    return hn


@njit(nogil=True, cache=True)
def _count_above(acc, idx, n, bound, k):
    """True when at least k of the docs have an f32 partial score strictly above f32(bound)."""
    b = np.float32(bound)
    c = 0
    for i in range(n):
        if np.float32(acc[idx[i]]) > b:
            c += 1
            if c >= k:
                return True
    return False


@njit(nogil=True, cache=True, inline="always")
def _sift_min(h, n, i):
    while True:
        m = 2 * i + 1
        if m >= n:
            return
        if m + 1 < n and h[m + 1] < h[m]:
            m += 1
        if h[m] < h[i]:
            h[i], h[m] = h[m], h[i]
            i = m
        else:
            return


@njit(nogil=True, cache=True)
def _kth_largest(acc, idx, n, k):
    """k-th largest of ``acc[idx[:n]]`` (0 when n < k), by one pass with a k-sized min-heap: most values
    lose to the root at once, so this is about one comparison a doc (a partition would copy all n)."""
    if n < k:
        return 0.0
    h = np.empty(k, dtype=np.float64)
    for i in range(k):
        h[i] = acc[idx[i]]
    for i in range(k // 2 - 1, -1, -1):
        _sift_min(h, k, i)
    for i in range(k, n):
        v = acc[idx[i]]
        if v > h[0]:
            h[0] = v
            _sift_min(h, k, 0)
    return h[0]


@njit(nogil=True, cache=True)
def _prune(acc, src, n_src, remaining, local_theta, heap_full, heap_theta, cands):
    """Keep the docs of ``src`` that can still enter the top-k (order kept); zero the others.

    Compared after rounding to f32, as final scores are. Against the block's own k-th partial score a tie
    may still win on docid, so it stays; against the heap (smaller docids) a doc must be strictly above.
    """
    th = np.float32(local_theta)
    n = 0
    for i in range(n_src):
        off = src[i]
        ub = np.float32(acc[off] + remaining)
        if ub >= th and (not heap_full or ub > heap_theta):
            cands[n] = off
            n += 1
        else:
            acc[off] = 0.0
    return n


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
                    n_t = _score_entry(postings, blk_start[ent[i]], blk_start[ent[i] + 1], weights[i], cache, norms,
                                       base, acc, touched, n_t, shift, mask)
            hn = _flush_block(acc, touched, n_t, base, hs, hd, hn, k)
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
            n_t = _score_entry(postings, blk_start[ent[j]], blk_start[ent[j] + 1], weights[j], cache, norms, base,
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
            if n_t >= k and rest < seen and _count_above(acc, touched, n_t, rest, k):
                switched = True
                break
        if not switched:
            hn = _flush_block(acc, touched, n_t, base, hs, hd, hn, k)
            continue
        n_c = n_t
        src = touched
        is_sorted = False
        while i < present:
            local_theta = _kth_largest(acc, src, n_c, k)
            n_c = _prune(acc, src, n_c, remaining[i - 1] * SLACK, local_theta, heap_full, heap_theta, cands)
            src = cands
            j = order[i]
            lo = blk_start[ent[j]]
            hi = blk_start[ent[j] + 1]
            if n_c * 24 < hi - lo:
                if not is_sorted:  # pruning keeps the order, so one sort serves every later term
                    cands[:n_c].sort()
                    is_sorted = True
                _probe_entry(postings, np.int64(lo), np.int64(hi), weights[j], cache, norms, base, acc, cands, n_c,
                             shift, mask)
            else:
                _scan_entry(postings, lo, hi, weights[j], cache, norms, base, acc, shift, mask)
            i += 1
        hn = _flush_block(acc, src, n_c, base, hs, hd, hn, k)
    return hn
