"""CPU relevancy stage (numba): BM25 term scores of a run of postings added into a window's f64 accumulator.

f32 arithmetic is kept f32 by casting every constant (numba would otherwise promote to f64 and change the bits).
All kernels release the GIL so a batch runs one query per thread. ``error_model="numpy"`` drops the division-by-zero
test numba adds to every division (1 + q is at least 1).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ragserve.kernels.cpu.hints import LINE, prefetch

F1 = np.float32(1.0)


@njit(nogil=True, cache=True, error_model="numpy", inline="always")
def _term_score(w, tf, c):
    q = np.float32(tf) * c
    return w - w / (F1 + q)


# Offsets are kept unsigned: numba adds a negative-index fix-up to every access through a signed index.
U = np.uint64
NORM_BITS = 8


@njit(nogil=True, cache=True, error_model="numpy", inline="always")
def _norm(p, nb, off, fused, tf_bits):
    """A posting's length byte: from the posting itself where the norms are fused in (``fuse_norms``: the byte
    sits between tf and the doc offset, and ``shift`` skips it), else from the norms (a random read)."""
    return U((p >> tf_bits) & np.uint32(0xFF)) if fused else U(nb[off])


@njit(nogil=True, cache=True, error_model="numpy")
def fuse_norms(postings, blk_id, blk_start, norms, tf_bits, block_size, out):
    """Write into ``out`` the postings with each doc's length byte between tf and the doc offset:
    ``(offset << (tf_bits + 8)) | (norm << tf_bits) | tf``. The order of the postings by doc offset is kept, so
    ``p >> (tf_bits + 8)`` serves every search; scoring then reads no norms (needs offset bits + tf_bits + 8
    <= 32)."""
    shift = np.uint32(tf_bits)
    mask = np.uint32((1 << tf_bits) - 1)
    for e in range(blk_id.size):
        base = np.int64(blk_id[e]) * block_size
        for j in range(np.int64(blk_start[e]), np.int64(blk_start[e + 1])):
            p = postings[j]
            off = p >> shift
            nrm = np.uint32(norms[base + np.int64(off)])
            out[j] = (off << np.uint32(tf_bits + NORM_BITS)) | (nrm << shift) | (p & mask)


@njit(nogil=True, cache=True, error_model="numpy", inline="always")
def _score_run(postings, lo, hi, w, cache, nb, uw0, acc, live, touched, n, shift, mask, fused, tf_bits):
    for j in range(lo, hi):
        p = postings[j]
        off = U(p >> shift)
        s = _term_score(w, p & mask, cache[_norm(p, nb, off, fused, tf_bits)])
        i = off - uw0
        a = acc[i]
        # Branch-free first-touch bookkeeping: whether a doc was seen before is unpredictable.
        touched[n] = i
        n += U(a == 0.0)
        acc[i] = a + np.float64(s)
        live[i] = 1
    return n


@njit(nogil=True, cache=True, error_model="numpy")
def score_entry(postings, lo, hi, w, cache, norms, base, w0, acc, live, touched, n_t, shift, mask, fused, tf_bits):
    """Add postings ``lo:hi`` into ``acc``, a window's accumulator (index: block offset - w0), and mark their docs
    in ``live``; returns the touched count. ``base`` is the block's first docid (for the norms)."""
    n = _score_run(postings, U(lo), U(hi), w, cache, norms[U(base):], U(w0), acc, live, touched, U(n_t), shift, mask,
                   fused, tf_bits)
    return np.int64(n)


@njit(nogil=True, cache=True, error_model="numpy")
def score_blocks(postings, lo, hi, fine_maxq, f, fstart, fine_block, others, slack, theta, w, cache, norms, base, w0,
                 acc, live, touched, n_t, shift, mask, fused, tf_bits):
    """``score_entry`` by fine blocks (``f`` holds ``lo``, ``fstart`` is its first posting), passing over a block
    whose bound plus ``others`` (the f64 sum of the other terms' bounds in the window), times ``slack``, rounds to
    no more than ``theta``: no doc of its doc range can enter the top-k, so the partial score such a doc may get
    from the other terms is never kept either. Returns (touched count, postings passed over)."""
    nb = norms[U(base):]
    uw0 = U(w0)
    n = U(n_t)
    dead = 0
    a = lo
    while a < hi:
        b = min(fstart + fine_block, hi)
        q = fine_maxq[f]
        if np.float32((np.float64(w - w / (F1 + q)) + others) * slack) <= theta:
            dead += b - a
        else:
            n = _score_run(postings, U(a), U(b), w, cache, nb, uw0, acc, live, touched, n, shift, mask, fused,
                           tf_bits)
        a = b
        f += 1
        fstart += fine_block
    return np.int64(n), dead


@njit(nogil=True, cache=True, error_model="numpy")
def scan_entry(postings, lo, hi, w, cache, norms, base, w0, acc, live, shift, mask, fused, tf_bits):
    """Add postings ``lo:hi`` to the docs that are still candidates, by a linear scan. Membership is read from
    ``live`` (one byte a doc: 32 KiB for a window of 32768 docs, in L1) rather than from ``acc`` (8 bytes a doc)."""
    nb = norms[U(base):]
    uw0 = U(w0)
    for j in range(U(lo), U(hi)):
        p = postings[j]
        off = U(p >> shift)
        if live[off - uw0]:
            acc[off - uw0] += np.float64(_term_score(w, p & mask, cache[_norm(p, nb, off, fused, tf_bits)]))


@njit(nogil=True, cache=True, error_model="numpy")
def probe_entry(postings, lo, hi, fine_last, f, fstart, fine_block, w, cache, norms, base, w0, acc, cands, n_c,
                shift, mask, fused, tf_bits):
    """Add postings ``lo:hi`` to the candidates (ascending window offsets) by search: for few candidates.

    ``f`` is the fine block holding ``lo`` and ``fstart`` its first posting. A candidate's fine block is found by
    walking the (dense) last offsets; its postings are then fetched at once and binary-searched branch-free (a
    conditional move per step: which half holds a doc is unpredictable). A search over the whole range would
    wait on a cache miss at most of its steps, each step's load depending on the one before."""
    nb = norms[U(base):]
    uw0 = U(w0)
    lo = U(lo)
    hi = U(hi)
    fs = U(fstart)
    fb = U(fine_block)
    fetched = U(0)
    for ci in range(U(n_c)):
        target = np.uint32(cands[ci] + w0)
        while fine_last[f] < target:  # the block whose last offset is at or past target holds it if any does
            f += 1
            fs += fb
            if fs >= hi:
                return
        first = max(lo, fs)
        end = min(fs + fb, hi)
        if fetched != fs + U(1):
            for j in range(first, end, U(LINE // 4)):
                prefetch(postings, j)
            fetched = fs + U(1)
        n = end - first
        while n > U(1):  # the first posting at or past target is in [first, first + n]
            half = n >> U(1)
            first = first + half if (postings[first + half] >> shift) < target else first
            n -= half
        if n == U(1) and (postings[first] >> shift) < target:
            first += U(1)
        if first == hi:
            return
        lo = first
        p = postings[first]
        if (p >> shift) == target:
            off = U(target)
            acc[off - uw0] += np.float64(_term_score(w, p & mask, cache[_norm(p, nb, off, fused, tf_bits)]))


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
