"""Tile ranges in Triton (``_bounds_kernel``): where each query term's postings cross each tile of a doc block,
the fallback of ``cuda/planning.cu``'s ``bounds``."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["n_ent"])
def _bounds_kernel(ent, n_ent, post, bounds, tf_bits, TILE: tl.constexpr, TPB: tl.constexpr, STEPS: tl.constexpr):
    # bounds[e, j] = first posting of entry e whose doc offset is >= j * TILE (binary search per lane).
    # STEPS is a constexpr: Triton 3.6's interpreter cannot take a runtime scalar as a loop bound (it converts
    # the 1-element array with int(), which NumPy 2.4 refuses).
    e = tl.program_id(0).to(tl.int64)
    st = tl.load(ent + e)
    cnt = tl.load(ent + n_ent + e)
    j = tl.arange(0, TPB).to(tl.int64)
    target = (j * TILE) << tf_bits
    lo = tl.zeros([TPB], dtype=tl.int64)
    hi = lo + cnt
    for _ in range(STEPS):
        open_ = lo < hi
        mid = (lo + hi) >> 1
        v = tl.load(post + st + mid, mask=open_, other=0).to(tl.uint32, bitcast=True).to(tl.int64)
        right = v < target
        lo = tl.where(open_ & right, mid + 1, lo)
        hi = tl.where(open_ & (v >= target), mid, hi)
    tl.store(bounds + e * TPB + j, lo.to(tl.int32))
