"""CPU decode kernels (numba): the matrix-vector products and the attention of one decode step of a few sequences.

Every output row of every sequence is one fixed loop over its inputs, whatever else shares the call, so a row's
value is the same bits whether it is computed alone or beside other sequences (the engine's batch invariance).
Weights are read once a call for all the sequences. The kernels are parallel over tiles of output rows; on a busy
machine one thread is the safe choice (a parallel region waits for its slowest thread, and a thread that has to
share its core with another job makes every one of the ~70 regions of a step wait).

Group-quantized weights (``qmatvec``) hold a weight as ``a * q - c``: int8 ``q``, f32 scale ``a`` and offset ``c``
per group of ``G`` consecutive inputs. GGUF's Q8_0, Q5_0, Q4_K and Q6_K blocks all convert to it without loss and
``a * q`` is exact in f32 (an f16 scale times small integers), so these are exactly the f32 weights that the
GGUF's own de-quantization (gguf-py's, which transformers loads) gives. The kernel takes their dot products with the
f32 inputs as ``a * sum(q * x) - c * sum(x)`` per group: the same real sum regrouped, so its results differ from an
f32 matmul's only by f32 rounding, as any other order of the sums would (no activation is quantized).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

MAX_TILE = 2048  # output rows of one tile: long inner loops, and its accumulators stay in the L1/L2 cache


def tile_width(n_out: int) -> int:
    """Output rows a tile holds: the largest multiple of 16 dividing ``n_out``, at most ``MAX_TILE`` and a quarter of
    the rows (tiles are the parallel tasks); ``n_out`` itself when none does."""
    best = n_out
    for t in range(16, min(MAX_TILE, n_out // 4) + 1, 16):
        if n_out % t == 0:
            best = t
    return best


def tile_rows(m: np.ndarray, width: int) -> np.ndarray:
    """[out, k] as [out / width, k, width]: a tile's rows side by side, one input after another."""
    n_out, k = m.shape
    return np.ascontiguousarray(m.reshape(n_out // width, width, k).transpose(0, 2, 1))


# The kernels run over tiles of output rows laid out input-major ([tiles, inputs, width], ``tile_rows``): the inner
# loop runs along a tile's rows (long, no reduction: it vectorises fully), one input at a time, so each row's sum is
# taken in input order, the same whatever the batch.
@njit(parallel=True, nogil=True, cache=True, fastmath=True, error_model="numpy")
def qmatvec(qt, at, ct, group, x, y):
    """``y[b, o] = sum_i (a[o, i // group] * q[o, i] - c[o, i // group]) * x[b, i]``, the weights tiled
    (``qt`` int8 [tiles, in, width], ``at``/``ct`` f32 [tiles, in // group, width]; ``ct`` of shape (0, 0, 0): no
    offsets), evaluated group by group as ``a * sum(q * x) - c * sum(x)``: the same sum regrouped, so the scales
    are read once a group instead of once a weight."""
    n_tiles, n_in, width = qt.shape
    n_b = x.shape[0]
    offsets = ct.shape[0] > 0
    for t in prange(n_tiles):
        acc = np.zeros((n_b, width), np.float32)
        part = np.empty((n_b, width), np.float32)
        for g in range(n_in // group):
            part[:, :] = 0.0
            for i in range(g * group, (g + 1) * group):
                qi = qt[t, i]
                for b in range(n_b):
                    xi = x[b, i]
                    pb = part[b]
                    for o in range(width):
                        pb[o] += np.float32(qi[o]) * xi
            ai = at[t, g]
            for b in range(n_b):
                pb = part[b]
                ab = acc[b]
                if offsets:
                    ci = ct[t, g]
                    xs = np.float32(0.0)
                    for i in range(g * group, (g + 1) * group):
                        xs += x[b, i]
                    for o in range(width):
                        ab[o] += ai[o] * pb[o] - ci[o] * xs
                else:
                    for o in range(width):
                        ab[o] += ai[o] * pb[o]
        for b in range(n_b):
            ab = acc[b]
            for o in range(width):
                y[b, t * width + o] = ab[o]


@njit(parallel=True, nogil=True, cache=True, fastmath=True, error_model="numpy")
def matvec(wt, x, y):
    """``y[b, o] = sum_i w[o, i] * x[b, i]`` for f32 weights tiled as ``qmatvec``'s (a model without a GGUF)."""
    n_tiles, n_in, width = wt.shape
    n_b = x.shape[0]
    for t in prange(n_tiles):
        acc = np.zeros((n_b, width), np.float32)
        for i in range(n_in):
            wi = wt[t, i]
            for b in range(n_b):
                xi = x[b, i]
                ab = acc[b]
                for o in range(width):
                    ab[o] += wi[o] * xi
        for b in range(n_b):
            ab = acc[b]
            for o in range(width):
                y[b, t * width + o] = ab[o]


@njit(parallel=True, nogil=True, cache=True, fastmath=True, error_model="numpy")
def attend(q, k_cache, v_cache, slots, lengths, window, scaling, out):
    """One query position per sequence over its own cache: ``q`` [B, H, D]; caches [slots, KV, L, D];
    ``lengths[b]`` positions cached for ``slots[b]`` (the query's own key and value already written at
    ``lengths[b] - 1``); ``window`` > 0 keeps the last ``window`` positions. Softmax in f32 with the maximum
    subtracted, as torch's; ``out`` [B, H, D]."""
    n_b, n_h, d = q.shape
    n_kv = k_cache.shape[1]
    group = n_h // n_kv
    for t in prange(n_b * n_h):
        b = t // n_h
        h = t % n_h
        s = slots[b]
        kv = h // group
        hi = lengths[b]
        lo = max(0, hi - window) if window > 0 else 0
        p = np.empty(hi - lo, np.float32)
        top = -np.inf
        for j in range(lo, hi):
            acc = np.float32(0.0)
            for e in range(d):
                acc += q[b, h, e] * k_cache[s, kv, j, e]
            v = acc * scaling
            p[j - lo] = v
            top = max(top, v)
        total = np.float32(0.0)
        for j in range(hi - lo):
            p[j] = np.exp(p[j] - top)
            total += p[j]
        for e in range(d):
            out[b, h, e] = 0.0
        for j in range(lo, hi):
            pj = p[j - lo] / total
            for e in range(d):
                out[b, h, e] += pj * v_cache[s, kv, j, e]
