"""CPU relevancy stage (numba): BM25 term scores of one block entry added into a block's f64 accumulator.

f32 arithmetic is kept f32 by casting every constant (numba would otherwise promote to f64 and change the bits).
All kernels release the GIL so a batch runs one query per thread.
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
def score_entry(postings, lo, hi, w, cache, norms, base, acc, touched, n_t, shift, mask):
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
def scan_entry(postings, lo, hi, w, cache, norms, base, acc, shift, mask):
    """Add one entry's scores to the docs that are still candidates (acc != 0), by a linear scan."""
    for j in range(lo, hi):
        p = postings[j]
        off = np.int64(p >> shift)
        a = acc[off]
        if a != 0.0:
            acc[off] = a + np.float64(_term_score(w, p & mask, cache[norms[base + off]]))


@njit(nogil=True, cache=True)
def probe_entry(postings, lo, hi, w, cache, norms, base, acc, cands, n_c, shift, mask):
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


def inner_product(queries: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Relevancy of dense vectors: ``scores[i, j] = queries[i] . keys[j]`` in f32 (BLAS), shape [m, n]."""
    q = np.atleast_2d(np.asarray(queries, dtype=np.float32))
    return q @ np.asarray(keys, dtype=np.float32).T


# Fixed-order dense relevancy: the arithmetic the FPGA's inner-product engine (hls_bm25/attn_topk.cpp) performs,
# so the two agree bit for bit. Each lane's f32 product (or Quest bound term), then a pairwise tree over the lanes
# padded with zeros to a power of two: level by level, lane i = lane 2i + lane 2i+1. BLAS sums in an order of its
# own choosing, which is why ``inner_product`` cannot be the reference for the FPGA.

@njit(nogil=True, cache=True, inline="always")
def _tree(buf, width):
    w = width
    while w > 1:
        w >>= 1
        for i in range(w):
            buf[i] = buf[2 * i] + buf[2 * i + 1]
    return buf[0]


def _lanes(dim: int) -> int:
    width = 1
    while width < dim:
        width *= 2
    return width


@njit(nogil=True, cache=True)
def _dots_tree(q, keys, width, out):
    m, dim = q.shape
    buf = np.zeros(width, np.float32)
    for j in range(keys.shape[0]):
        for i in range(m):
            for d in range(dim):
                buf[d] = q[i, d] * keys[j, d]
            for d in range(dim, width):
                buf[d] = np.float32(0.0)
            out[i, j] = _tree(buf, width)


@njit(nogil=True, cache=True)
def _bounds_tree(q, lo, hi, width, out):
    m, dim = q.shape
    buf = np.zeros(width, np.float32)
    for j in range(lo.shape[0]):
        for i in range(m):
            for d in range(dim):
                a = q[i, d] * lo[j, d]
                b = q[i, d] * hi[j, d]
                buf[d] = b if b > a else a  # as the FPGA's fmax_first: which of two equal zeros is kept
            for d in range(dim, width):
                buf[d] = np.float32(0.0)
            out[i, j] = _tree(buf, width)


def inner_product_tree(queries: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """``scores[i, j] = queries[i] . keys[j]`` in f32, summed by the fixed pairwise tree: shape [m, n]."""
    q = np.ascontiguousarray(np.atleast_2d(queries), dtype=np.float32)
    k = np.ascontiguousarray(keys, dtype=np.float32)
    out = np.empty((q.shape[0], k.shape[0]), np.float32)
    _dots_tree(q, k, _lanes(q.shape[1]), out)
    return out


def bound_tree(queries: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Quest's upper bound of ``queries[i] . k`` over keys between ``lo[j]`` and ``hi[j]`` (elementwise):
    ``sum_d max(q_d * lo_d, q_d * hi_d)`` in f32 by the same tree, shape [m, n]."""
    q = np.ascontiguousarray(np.atleast_2d(queries), dtype=np.float32)
    lo = np.ascontiguousarray(lo, dtype=np.float32)
    hi = np.ascontiguousarray(hi, dtype=np.float32)
    out = np.empty((q.shape[0], lo.shape[0]), np.float32)
    _bounds_tree(q, lo, hi, _lanes(q.shape[1]), out)
    return out
