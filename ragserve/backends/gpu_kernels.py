"""BM25 scoring kernels of the GPU backend: one fused Triton kernel (CUDA), and the same computation in torch ops.

Both take a launch's work items (see ``gpu_items``) already placed in the device arena:
``a`` first posting (shard-local), ``n`` postings, ``e0`` first entry (arena index), ``ne`` entries,
``pbase`` arena offset of the shard's posting 0, ``rowoff`` = row * num_docs, ``w`` the term weight.
Each posting adds ``f64(s)`` with ``s = w - w / (1 + tf * cache[norm])`` (every op in f32, as ``FORMAT.md``
defines it) into ``acc[rowoff + doc]``. Within one launch an accumulator cell gets at most one addition
unless ``atomic`` is set, which the caller sets only when the f64 sums are exact in any order.
"""
from __future__ import annotations

import numpy as np
import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU wheel of torch ships without Triton: the torch path still works
    triton = None

M32 = 0xFFFFFFFF
CHUNK = 1024  # postings per Triton program


def triton_available() -> bool:
    return triton is not None


def _ranges(starts: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    """Concatenation of ``arange(starts[i], starts[i] + lens[i])`` over i."""
    total = int(lens.sum())
    idx = torch.arange(total, dtype=torch.int64, device=starts.device)
    return idx + torch.repeat_interleave(starts - (torch.cumsum(lens, 0) - lens), lens, output_size=total)


def score_torch(a, n, e0, ne, pbase, rowoff, w, post, bid, bst, norms, cache, acc_flat, tf_bits: int,
                block_shift: int) -> None:
    """Reference implementation in torch ops (any device). Items' entries cover exactly their postings."""
    n_items = a.numel()
    if n_items == 0:
        return
    ent = _ranges(e0, ne)
    ent_item = torch.repeat_interleave(torch.arange(n_items, device=a.device), ne, output_size=ent.numel())
    start = bst[ent].long() & M32
    cnt = (bst[ent + 1].long() & M32) - start
    total = int(n.sum())
    post_ent = torch.repeat_interleave(ent, cnt, output_size=total)
    post_item = torch.repeat_interleave(ent_item, cnt, output_size=total)
    p = post[_ranges(start + pbase[ent_item], cnt)].long() & M32
    doc = (bid[post_ent].long() << block_shift) + (p >> tf_bits)
    tf = p & ((1 << tf_bits) - 1)
    q = tf.to(torch.float32) * cache[norms[doc].long()]
    wi = w[post_item]
    s = wi - wi / (1 + q)
    acc_flat.index_add_(0, rowoff[post_item] + doc, s.to(torch.float64))


if triton is not None:

    @triton.jit
    def _score_kernel(unit_item, items, n_items, weights, post, bid, bst, norms, cache, acc, tf_bits, tf_mask,
                      block_shift, search_steps, ATOMIC: tl.constexpr, CHUNK_: tl.constexpr):
        pid = tl.program_id(0)
        it = tl.load(unit_item + pid).to(tl.int64)
        c0 = tl.load(items + it)
        a = tl.load(items + n_items + it)
        n = tl.load(items + 2 * n_items + it)
        e0 = tl.load(items + 3 * n_items + it)
        ne = tl.load(items + 4 * n_items + it)
        pbase = tl.load(items + 5 * n_items + it)
        rowoff = tl.load(items + 6 * n_items + it)
        w = tl.load(weights + it)
        j = a + (pid - c0) * CHUNK_ + tl.arange(0, CHUNK_).to(tl.int64)
        m = j < a + n
        p = tl.load(post + pbase + j, mask=m, other=0).to(tl.uint32, bitcast=True).to(tl.int64)
        # Block entry of each posting: the last e in [e0, e0 + ne) with blk_start[e] <= j (binary search).
        lo = tl.zeros([CHUNK_], dtype=tl.int64) + e0
        hi = lo + ne
        for _ in range(search_steps):
            open_ = (hi - lo) > 1
            mid = (lo + hi) >> 1
            v = tl.load(bst + mid, mask=m & open_, other=0).to(tl.uint32, bitcast=True).to(tl.int64)
            lo = tl.where(open_ & (v <= j), mid, lo)
            hi = tl.where(open_ & (v > j), mid, hi)
        blk = tl.load(bid + lo, mask=m, other=0).to(tl.int64)
        doc = (blk << block_shift) + (p >> tf_bits)
        tf = p & tf_mask
        nrm = tl.load(norms + doc, mask=m, other=0).to(tl.int32)
        c = tl.load(cache + nrm, mask=m, other=0.0)
        q = tf.to(tl.float32) * c
        wv = tl.zeros([CHUNK_], dtype=tl.float32) + w
        s = wv - tl.math.div_rn(wv, 1.0 + q)
        ptr = acc + rowoff + doc
        if ATOMIC:
            tl.atomic_add(ptr, s.to(tl.float64), mask=m, sem="relaxed")
        else:
            old = tl.load(ptr, mask=m, other=0.0)
            tl.store(ptr, old + s.to(tl.float64), mask=m)


def score_triton(a: np.ndarray, n: np.ndarray, e0: np.ndarray, ne: np.ndarray, pbase: np.ndarray,
                 rowoff: np.ndarray, w: np.ndarray, post, bid, bst, norms, cache, acc_flat, tf_bits: int,
                 block_shift: int, atomic: bool, num_warps: int = 4) -> None:
    """Launch the fused kernel over host-planned items (numpy arrays); one program per CHUNK postings."""
    if a.size == 0:
        return
    chunks = (n + CHUNK - 1) // CHUNK
    c0 = np.cumsum(chunks) - chunks
    units = int(chunks.sum())
    dev = acc_flat.device
    items = torch.from_numpy(np.stack([c0, a, n, e0, ne, pbase, rowoff]).astype(np.int64)).to(dev)
    unit_item = torch.from_numpy(np.repeat(np.arange(a.size, dtype=np.int32), chunks)).to(dev)
    weights = torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32)).to(dev)
    steps = int(ne.max()).bit_length()
    # enable_fp_fusion=False: tf * c + 1 must round twice (no FMA), as FORMAT.md's f32 arithmetic does.
    _score_kernel[(units,)](unit_item, items, a.size, weights, post, bid, bst, norms, cache, acc_flat, tf_bits,
                            (1 << tf_bits) - 1, block_shift, steps, ATOMIC=atomic, CHUNK_=CHUNK,
                            num_warps=num_warps, enable_fp_fusion=False)
