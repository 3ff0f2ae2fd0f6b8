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
    def _score_kernel(units, n_units, post, bid, norms, cache, acc, tf_bits, tf_mask, block_shift,
                      ATOMIC: tl.constexpr, CHUNK_: tl.constexpr):
        # One program: up to CHUNK_ postings of one block entry, so the block (hence the docid base) is a scalar.
        pid = tl.program_id(0)
        p0 = tl.load(units + pid)
        n = tl.load(units + n_units + pid)
        ent = tl.load(units + 2 * n_units + pid)
        rowoff = tl.load(units + 3 * n_units + pid)
        w = tl.load(units + 4 * n_units + pid).to(tl.int32).to(tl.float32, bitcast=True)
        blk = tl.load(bid + ent).to(tl.uint32, bitcast=True).to(tl.int64)
        offs = tl.arange(0, CHUNK_)
        m = offs < n
        p = tl.load(post + p0 + offs, mask=m, other=0).to(tl.uint32, bitcast=True).to(tl.int64)
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


def score_triton(ent: np.ndarray, pos0: np.ndarray, cnt: np.ndarray, rowoff: np.ndarray, w: np.ndarray,
                 post, bid, norms, cache, acc_flat, tf_bits: int, block_shift: int, atomic: bool,
                 num_warps: int = 4) -> None:
    """Launch the fused kernel over block entries planned on the host (numpy, one value per entry):
    arena entry index, arena index of its first posting, postings, row offset, term weight."""
    if ent.size == 0:
        return
    chunks = (cnt + CHUNK - 1) // CHUNK
    e = np.repeat(np.arange(ent.size), chunks)
    c = np.arange(e.size, dtype=np.int64) - np.repeat(np.cumsum(chunks) - chunks, chunks)
    units = np.stack([pos0[e] + c * CHUNK, np.minimum(cnt[e] - c * CHUNK, CHUNK), ent[e], rowoff[e],
                      np.ascontiguousarray(w, dtype=np.float32).view(np.int32)[e].astype(np.int64)])
    dev = acc_flat.device
    u = torch.from_numpy(units).pin_memory().to(dev, non_blocking=True) if dev.type == "cuda" else torch.from_numpy(units)
    # enable_fp_fusion=False: tf * c + 1 must round twice (no FMA), as FORMAT.md's f32 arithmetic does.
    _score_kernel[(e.size,)](u, e.size, post, bid, norms, cache, acc_flat, tf_bits, (1 << tf_bits) - 1, block_shift,
                             ATOMIC=atomic, CHUNK_=CHUNK, num_warps=num_warps, enable_fp_fusion=False)


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
