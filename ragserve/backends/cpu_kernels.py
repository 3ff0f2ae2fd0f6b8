"""numba kernels of the CPU backend: BM25 scoring into an f64 accumulator and exact top-k.

All kernels release the GIL so a batch runs one query per thread. f32 arithmetic is kept f32 by
casting every constant (numba would otherwise promote to f64 and change the bits).
"""
from __future__ import annotations

import numpy as np
from numba import njit

F1 = np.float32(1.0)


@njit(nogil=True, cache=True, inline="always")
def _term_score(w, tf, c):
    q = np.float32(tf) * c
    return w - w / (F1 + q)


@njit(nogil=True, cache=True)
def score_terms(postings, term_ptr, blk_id, blk_start, norms, cache, term_ids, weights, block_size, tf_bits,
                doc_start, acc, touched, n_touched, order):
    """Add every posting of the terms ``term_ids[order]`` into ``acc`` (doc - doc_start), in that order.

    ``touched`` collects the local docids seen for the first time; returns the new count.
    """
    mask = np.uint32((1 << tf_bits) - 1)
    shift = np.uint32(tf_bits)
    for oi in range(order.size):
        i = order[oi]
        t = term_ids[i]
        w = weights[i]
        for e in range(term_ptr[t], term_ptr[t + 1]):
            base = np.int64(blk_id[e]) * block_size - doc_start
            for j in range(blk_start[e], blk_start[e + 1]):
                p = postings[j]
                local = base + np.int64(p >> shift)
                s = _term_score(w, p & mask, cache[norms[local + doc_start]])
                a = acc[local]
                if a == 0.0:
                    touched[n_touched] = local
                    n_touched += 1
                acc[local] = a + np.float64(s)
    return n_touched


@njit(nogil=True, cache=True)
def rescore_candidates(postings, term_ptr, blk_id, blk_start, norms, cache, term_id, w, block_size, tf_bits,
                       doc_start, acc, cands, n_cands):
    """Add term ``term_id``'s score to the candidate docs only (sorted ascending), by binary search."""
    mask = np.uint32((1 << tf_bits) - 1)
    shift = np.uint32(tf_bits)
    e = term_ptr[term_id]
    e_end = term_ptr[term_id + 1]
    for ci in range(n_cands):
        local = cands[ci]
        d = local + doc_start
        blk = d // block_size
        while e < e_end and blk_id[e] < blk:
            e += 1
        if e == e_end:
            break
        if blk_id[e] != blk:
            continue
        target = np.uint32(d - np.int64(blk) * block_size)
        lo = np.int64(blk_start[e])
        hi = np.int64(blk_start[e + 1])
        while lo < hi:
            mid = (lo + hi) >> 1
            if (postings[mid] >> shift) < target:
                lo = mid + 1
            else:
                hi = mid
        if lo < blk_start[e + 1] and (postings[lo] >> shift) == target:
            acc[local] += np.float64(_term_score(w, postings[lo] & mask, cache[norms[d]]))
    return 0


@njit(nogil=True, cache=True)
def _sift_down(hs, hd, n, i):
    # Min-heap on (score asc, docid desc): the root is the worst of the kept top-k.
    while True:
        l = 2 * i + 1
        if l >= n:
            return
        r = l + 1
        m = l
        if r < n and (hs[r] < hs[l] or (hs[r] == hs[l] and hd[r] > hd[l])):
            m = r
        if hs[m] < hs[i] or (hs[m] == hs[i] and hd[m] > hd[i]):
            hs[i], hs[m] = hs[m], hs[i]
            hd[i], hd[m] = hd[m], hd[i]
            i = m
        else:
            return


@njit(nogil=True, cache=True)
def topk_and_reset(acc, touched, n_touched, k, doc_start, out_docs, out_scores, min_score):
    """Exact top-k (score desc, docid asc) of the touched docs with f32 score >= min_score; zeroes ``acc``.

    Returns how many results were written (sorted best first).
    """
    hs = np.empty(k, dtype=np.float32)
    hd = np.empty(k, dtype=np.int64)
    n = 0
    for i in range(n_touched):
        local = touched[i]
        s = np.float32(acc[local])
        acc[local] = 0.0
        if s < min_score:
            continue
        d = local + doc_start
        if n < k:
            # sift up
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
    # Pop the heap from worst to best.
    for j in range(n - 1, -1, -1):
        out_scores[j] = hs[0]
        out_docs[j] = hd[0]
        hs[0] = hs[j]
        hd[0] = hd[j]
        _sift_down(hs, hd, j, 0)
    return n


@njit(nogil=True, cache=True)
def kth_largest(acc, touched, n_touched, k):
    """The k-th largest f64 partial score among the touched docs (0 if fewer than k)."""
    if n_touched < k:
        return 0.0
    vals = np.empty(n_touched, dtype=np.float64)
    for i in range(n_touched):
        vals[i] = acc[touched[i]]
    return np.partition(vals, n_touched - k)[n_touched - k]


@njit(nogil=True, cache=True)
def prune_candidates(acc, src, n_src, remaining_bound, threshold, cands):
    """Keep the docs of ``src`` that can still reach ``threshold`` (order kept); zero the others in ``acc``.

    Compared after rounding to f32, as final scores are: a doc whose f32 bound equals the threshold
    could still tie the k-th score and win on docid, so it stays.
    """
    th = np.float32(threshold)
    n = 0
    for i in range(n_src):
        local = src[i]
        if np.float32(acc[local] + remaining_bound) >= th:
            cands[n] = local
            n += 1
        else:
            acc[local] = 0.0
    return n


@njit(nogil=True, cache=True)
def count_above(acc, touched, n_touched, bound, k):
    """True when at least k touched docs have an f32 partial score strictly above f32(bound)."""
    b = np.float32(bound)
    c = 0
    for i in range(n_touched):
        if np.float32(acc[touched[i]]) > b:
            c += 1
            if c >= k:
                return True
    return False


@njit(nogil=True, cache=True)
def scan_candidates(postings, term_ptr, blk_id, blk_start, norms, cache, term_id, w, block_size, tf_bits,
                    doc_start, acc):
    """Add term ``term_id``'s score to docs already holding a partial score (acc != 0), by a linear scan."""
    mask = np.uint32((1 << tf_bits) - 1)
    shift = np.uint32(tf_bits)
    for e in range(term_ptr[term_id], term_ptr[term_id + 1]):
        base = np.int64(blk_id[e]) * block_size - doc_start
        for j in range(blk_start[e], blk_start[e + 1]):
            p = postings[j]
            local = base + np.int64(p >> shift)
            a = acc[local]
            if a != 0.0:
                acc[local] = a + np.float64(_term_score(w, p & mask, cache[norms[local + doc_start]]))
    return 0


@njit(nogil=True, cache=True)
def search_shard(postings, term_ptr, blk_id, blk_start, norms, cache, term_ids, weights, bounds, exact_sum,
                 k, block_size, tf_bits, doc_start, acc, touched, cands, out_docs, out_scores):
    """Exact top-k of one query in one shard; returns the number of results written (best first).

    With ``exact_sum`` (the f64 sum of the query's term scores is order-free), terms are visited in
    decreasing ``bounds`` order (MaxScore): once the bounds of the unvisited terms add up to less than
    the current k-th partial score (compared in f32, as final scores are), no unseen document can enter
    the top-k, and the remaining terms only update the surviving candidates. Without it, every term
    is added in ascending term-id order, the canonical order of FORMAT.md.
    """
    nq = term_ids.size
    if not exact_sum or nq == 1:
        order = np.arange(nq)
        n_t = score_terms(postings, term_ptr, blk_id, blk_start, norms, cache, term_ids, weights, block_size,
                          tf_bits, doc_start, acc, touched, 0, order)
        return topk_and_reset(acc, touched, n_t, k, doc_start, out_docs, out_scores, np.float32(0.0))
    order = np.argsort(-bounds, kind="mergesort")
    remaining = np.zeros(nq, dtype=np.float64)  # remaining[i]: sum of bounds of the terms after order[i]
    for i in range(nq - 2, -1, -1):
        remaining[i] = remaining[i + 1] + bounds[order[i + 1]]
    slack = 1.0 + 1e-12  # far below one f32 ulp; guards the f64 sum of bounds
    n_t = 0
    i = 0
    switched = False
    seen_bound = 0.0  # bounds of the terms scored so far: no partial score exceeds their sum
    one = np.empty(1, dtype=np.int64)
    while i < nq:
        if bounds[order[i]] == 0.0:
            break  # this and every later term are absent from the shard
        one[0] = order[i]
        n_t = score_terms(postings, term_ptr, blk_id, blk_start, norms, cache, term_ids, weights, block_size,
                          tf_bits, doc_start, acc, touched, n_t, one)
        seen_bound += bounds[order[i]]
        i += 1
        # The k-th partial score is at most seen_bound, so it is only worth computing (O(touched)) when
        # the unseen terms' bounds fall below that.
        if i < nq and n_t >= k and remaining[i - 1] * slack < seen_bound:
            if count_above(acc, touched, n_t, remaining[i - 1] * slack, k):
                switched = True
                break
    if not switched:
        return topk_and_reset(acc, touched, n_t, k, doc_start, out_docs, out_scores, np.float32(0.0))
    n_c = n_t
    view = touched
    is_sorted = False
    while i < nq and bounds[order[i]] > 0.0:
        theta = kth_largest(acc, view, n_c, k)
        n_c = prune_candidates(acc, view, n_c, remaining[i - 1] * slack, theta, cands)
        view = cands
        j = order[i]
        t = term_ids[j]
        n_post = np.int64(blk_start[term_ptr[t + 1]]) - np.int64(blk_start[term_ptr[t]])
        if n_c * 24 < n_post:
            if not is_sorted:  # pruning keeps the order, so one sort serves every later term
                cands[:n_c].sort()
                is_sorted = True
            rescore_candidates(postings, term_ptr, blk_id, blk_start, norms, cache, t, weights[j], block_size,
                               tf_bits, doc_start, acc, cands, n_c)
        else:
            scan_candidates(postings, term_ptr, blk_id, blk_start, norms, cache, t, weights[j], block_size,
                            tf_bits, doc_start, acc)
        i += 1
    return topk_and_reset(acc, view, n_c, k, doc_start, out_docs, out_scores, np.float32(0.0))


@njit(nogil=True, cache=True)
def term_max_q(term_ptr, blk_maxq):
    """Per term, the max over its block entries of ``blk_maxq`` (0 where the term is absent)."""
    V = term_ptr.size - 1
    out = np.zeros(V, dtype=np.float32)
    for t in range(V):
        m = np.float32(0.0)
        for e in range(term_ptr[t], term_ptr[t + 1]):
            if blk_maxq[e] > m:
                m = blk_maxq[e]
        out[t] = m
    return out


@njit(nogil=True, cache=True)
def general_max_q(term_ptr, blk_maxtf, blk_minnorm, cache, term_ids):
    """Per query term, a bound on q valid for any k1/b: max over entries of f32(maxtf * cache[minnorm])."""
    out = np.zeros(term_ids.size, dtype=np.float32)
    for i in range(term_ids.size):
        t = term_ids[i]
        m = np.float32(0.0)
        for e in range(term_ptr[t], term_ptr[t + 1]):
            q = np.float32(blk_maxtf[e]) * cache[blk_minnorm[e]]
            if q > m:
                m = q
        out[i] = m
    return out
