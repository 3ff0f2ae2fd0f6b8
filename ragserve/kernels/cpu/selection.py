"""CPU selection stage (numba): the running top-k heap of a query, a block's k-th score and its candidate pruning.

The heap is a min-heap on (score, -docid): a later document (larger docid) enters only strictly above the k-th.
"""
from __future__ import annotations

import numpy as np
from numba import njit


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
def flush_block(acc, idx, n, base, hs, hd, hn, k):
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
def count_above(acc, idx, n, bound, k):
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
def kth_largest(acc, idx, n, k):
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
def prune_candidates(acc, src, n_src, remaining, local_theta, heap_full, heap_theta, cands):
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


def topk_rows(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k of each row of ``scores`` [m, n]: (indices int64, values) [m, min(k, n)], best first.

    Ties are broken by position (the smaller index first), so every device selects the same entries.
    """
    s = np.atleast_2d(np.asarray(scores))
    m, n = s.shape
    k = min(int(k), n)
    if k <= 0:
        return np.zeros((m, 0), np.int64), np.zeros((m, 0), s.dtype)
    kth = np.partition(s, n - k, axis=1)[:, n - k:n - k + 1]
    gt = s > kth
    eq = s == kth
    take = gt | (eq & (np.cumsum(eq, axis=1) <= k - gt.sum(axis=1, keepdims=True)))
    idx = np.nonzero(take)[1].reshape(m, k)  # row-major: ascending positions within each row
    vals = np.take_along_axis(s, idx, axis=1)
    order = np.argsort(-vals, axis=1, kind="stable")  # stable: equal values keep ascending positions
    return np.take_along_axis(idx, order, axis=1).astype(np.int64), np.take_along_axis(vals, order, axis=1)
