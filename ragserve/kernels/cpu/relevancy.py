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
