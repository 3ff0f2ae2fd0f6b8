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
    def _score_kernel(items, n_items, post, bid, bst, norms, cache, acc, tf_bits, tf_mask, block_shift,
                      search_steps, ATOMIC: tl.constexpr, CHUNK_: tl.constexpr):
        # items: 8 rows of n_items values (first program, a, n, e0, ne, pbase, rowoff, weight bits), then the
        # item of each program.
        pid = tl.program_id(0)
        it = tl.load(items + 8 * n_items + pid)
        c0 = tl.load(items + it)
        a = tl.load(items + n_items + it)
        n = tl.load(items + 2 * n_items + it)
        e0 = tl.load(items + 3 * n_items + it)
        ne = tl.load(items + 4 * n_items + it)
        pbase = tl.load(items + 5 * n_items + it)
        rowoff = tl.load(items + 6 * n_items + it)
        w = tl.load(items + 7 * n_items + it).to(tl.int32).to(tl.float32, bitcast=True)
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

    @triton.jit
    def _group_max_kernel(acc, maxima, num_docs, n_groups, GROUP: tl.constexpr, NG: tl.constexpr):
        # Max f32 score of each GROUP consecutive docs of a row.
        row = tl.program_id(1).to(tl.int64)
        offs = tl.program_id(0).to(tl.int64) * (GROUP * NG) + tl.arange(0, GROUP * NG)
        a = tl.load(acc + row * num_docs + offs, mask=offs < num_docs, other=0.0)
        g = tl.max(tl.reshape(a.to(tl.float32), (NG, GROUP)), axis=1)
        gi = tl.program_id(0).to(tl.int64) * NG + tl.arange(0, NG)
        tl.store(maxima + row * n_groups + gi, g, mask=gi < n_groups)

    @triton.jit
    def _collect_kernel(acc, thr, num_docs, out_idx, out_score, counter, cap, BLOCK: tl.constexpr):
        # Append (row * num_docs + doc, f32 score) of every doc of a row scoring >= the row's threshold.
        row = tl.program_id(1).to(tl.int64)
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        s = tl.load(acc + row * num_docs + offs, mask=offs < num_docs, other=0.0).to(tl.float32)
        sel = (offs < num_docs) & (s >= tl.load(thr + row)) & (s > 0.0)
        sel_i = sel.to(tl.int32)
        cnt = tl.sum(sel_i, axis=0)
        first = tl.atomic_add(counter, cnt, mask=cnt > 0)
        pos = first + tl.cumsum(sel_i, axis=0) - 1
        ok = sel & (pos < cap)
        tl.store(out_idx + pos, row * num_docs + offs, mask=ok)
        tl.store(out_score + pos, s, mask=ok)


def score_triton(a: np.ndarray, n: np.ndarray, e0: np.ndarray, ne: np.ndarray, pbase: np.ndarray,
                 rowoff: np.ndarray, w: np.ndarray, post, bid, bst, norms, cache, acc_flat, tf_bits: int,
                 block_shift: int, atomic: bool, num_warps: int = 4) -> None:
    """Launch the fused kernel over host-planned items (numpy arrays); one program per CHUNK postings."""
    if a.size == 0:
        return
    chunks = (n + CHUNK - 1) // CHUNK
    c0 = np.cumsum(chunks) - chunks
    units = int(chunks.sum())
    wbits = np.ascontiguousarray(w, dtype=np.float32).view(np.int32).astype(np.int64)
    table = np.concatenate([c0, a, n, e0, ne, pbase, rowoff, wbits,
                            np.repeat(np.arange(a.size, dtype=np.int64), chunks)])
    items = torch.from_numpy(table).to(acc_flat.device)  # one host-to-device copy per launch
    steps = int(ne.max()).bit_length()
    # enable_fp_fusion=False: tf * c + 1 must round twice (no FMA), as FORMAT.md's f32 arithmetic does.
    _score_kernel[(units,)](items, a.size, post, bid, bst, norms, cache, acc_flat, tf_bits, (1 << tf_bits) - 1,
                            block_shift, steps, ATOMIC=atomic, CHUNK_=CHUNK, num_warps=num_warps,
                            enable_fp_fusion=False)


GROUP, GROUPS_PER_PROGRAM, COLLECT_BLOCK = 32, 64, 2048


def group_max_triton(acc: torch.Tensor) -> torch.Tensor:
    """[rows, ceil(num_docs / GROUP)] f32 maxima of the rows' scores, GROUP consecutive docs each."""
    rows, num_docs = acc.shape
    n_groups = (num_docs + GROUP - 1) // GROUP
    maxima = torch.empty((rows, n_groups), dtype=torch.float32, device=acc.device)
    grid = (triton.cdiv(num_docs, GROUP * GROUPS_PER_PROGRAM), rows)
    _group_max_kernel[grid](acc, maxima, num_docs, n_groups, GROUP=GROUP, NG=GROUPS_PER_PROGRAM)
    return maxima


def collect_triton(acc: torch.Tensor, thr: torch.Tensor, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat indices (row * num_docs + doc) and f32 scores of the docs scoring >= their row's threshold
    (> 0), in no particular order. Reruns with a larger buffer if ``capacity`` was too small."""
    rows, num_docs = acc.shape
    grid = (triton.cdiv(num_docs, COLLECT_BLOCK), rows)
    while True:
        counter = torch.zeros(1, dtype=torch.int32, device=acc.device)
        idx = torch.empty(capacity, dtype=torch.int64, device=acc.device)
        score = torch.empty(capacity, dtype=torch.float32, device=acc.device)
        _collect_kernel[grid](acc, thr, num_docs, idx, score, counter, capacity, BLOCK=COLLECT_BLOCK)
        total = int(counter.item())
        if total <= capacity:
            return idx[:total], score[:total]
        capacity = total
