"""Exact top-k of long f32 rows by radix select (Triton): the selection stage of sparse attention on the GPU.

Scores become order-preserving u32 keys (negatives bit-inverted, positives with the sign bit set; -0.0 counts as
+0.0). Three histogram passes over 11, 11 and 10 bits find the k-th largest key T of each row and how many of the
keys equal to T belong to the top k (``need``), every pass reading the row once and keeping its state on the device
(no host round trip). A count pass then sizes each block's keys above T and equal to T, and a write pass puts the
ones above T, then the first ``need`` equal to T by position, in exactly k slots, so ties go to the earlier position
as ``topk_rows`` does. A stable sort of those k by score (descending) ranks them. Every pass is a grid of
(blocks, rows), so one launch serves a batch of rows, and the whole select can be captured in a CUDA graph.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

DIGITS = (11, 11, 10)  # bits resolved per histogram pass, high to low
BINS = 2048  # 2^11
BLOCK = 4096  # scores per program


@triton.jit
def _ordered(x):
    """f32 -> u32 with the order of the floats; -0.0 maps as +0.0."""
    u = x.to(tl.uint32, bitcast=True)
    u = tl.where(u == 0x80000000, 0, u)
    neg = (u >> 31) == 1
    return tl.where(neg, ~u, u | 0x80000000)


@triton.jit
def _hist_pass(scores, stride, n, state, hist, shift, fixed_mask, BINS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(1).to(tl.int64)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < n
    key = _ordered(tl.load(scores + row * stride + offs, mask=inside, other=0.0))
    prefix = tl.load(state + row * 2).to(tl.uint32)
    match = inside & ((key & fixed_mask) == prefix)
    digit = ((key >> shift) & (BINS - 1)).to(tl.int32)
    h = tl.histogram(digit, BINS, mask=match)
    tl.atomic_add(hist + row * BINS + tl.arange(0, BINS), h, mask=h > 0, sem="relaxed")  # most bins are empty


@triton.jit
def _pick_digit(state, hist, shift, BINS: tl.constexpr):
    """The digit holding the need-th largest key among those matching the prefix; clears the histogram."""
    row = tl.program_id(0)
    bins = tl.arange(0, BINS)
    h = tl.load(hist + row * BINS + bins)
    need = tl.load(state + row * 2 + 1)
    above = tl.sum(h) - tl.cumsum(h, 0)  # keys in higher digits
    hit = (above < need) & (above + h >= need)
    digit = tl.max(tl.where(hit, bins, -1), 0)
    taken = tl.sum(tl.where(bins == digit, above, 0))
    prefix = tl.load(state + row * 2).to(tl.uint32) | (digit.to(tl.uint32) << shift)
    tl.store(state + row * 2, prefix.to(tl.int32, bitcast=True))
    tl.store(state + row * 2 + 1, need - taken)
    tl.store(hist + row * BINS + bins, tl.zeros([BINS], tl.int32))


@triton.jit
def _count_pass(scores, stride, n, state, counts, nblocks, BLOCK: tl.constexpr):
    row = tl.program_id(1).to(tl.int64)
    blk = tl.program_id(0)
    offs = blk * BLOCK + tl.arange(0, BLOCK)
    inside = offs < n
    key = _ordered(tl.load(scores + row * stride + offs, mask=inside, other=0.0))
    t = tl.load(state + row * 2).to(tl.uint32)
    tl.store(counts + (row * nblocks + blk) * 2, tl.sum((inside & (key > t)).to(tl.int32)))
    tl.store(counts + (row * nblocks + blk) * 2 + 1, tl.sum((inside & (key == t)).to(tl.int32)))


@triton.jit
def _write_pass(scores, stride, n, k, state, counts, nblocks, out_idx, out_val, BLOCK: tl.constexpr,
                MAXB: tl.constexpr):
    row = tl.program_id(1).to(tl.int64)
    blk = tl.program_id(0)
    offs = blk * BLOCK + tl.arange(0, BLOCK)
    inside = offs < n
    x = tl.load(scores + row * stride + offs, mask=inside, other=0.0)
    key = _ordered(x)
    t = tl.load(state + row * 2).to(tl.uint32)
    need = tl.load(state + row * 2 + 1)
    # Where this block's keys go: after the earlier blocks' (an exclusive scan over the block counts).
    b = tl.arange(0, MAXB)
    earlier = b < blk
    gt_base = tl.sum(tl.where(earlier, tl.load(counts + (row * nblocks + b) * 2, mask=b < nblocks, other=0), 0))
    eq_base = tl.sum(tl.where(earlier, tl.load(counts + (row * nblocks + b) * 2 + 1, mask=b < nblocks, other=0), 0))
    gt = inside & (key > t)
    eq = inside & (key == t)
    gt_rank = gt_base + tl.cumsum(gt.to(tl.int32), 0) - 1
    eq_rank = eq_base + tl.cumsum(eq.to(tl.int32), 0) - 1
    slot = tl.where(gt, gt_rank, (k - need) + eq_rank)
    keep = gt | (eq & (eq_rank < need))
    tl.store(out_idx + row * k + slot, offs.to(tl.int64), mask=keep)
    tl.store(out_val + row * k + slot, x, mask=keep)


def radix_topk(scores: torch.Tensor, k: int, sort: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k of each row of ``scores`` [R, N] (f32): (indices int64, values) [R, min(k, N)], best first
    (ties: the earlier position), as ``selection.topk_rows``. ``sort=False`` leaves them in the order above
    the k-th value, then equal to it, each by position (the same set)."""
    s = scores if scores.dim() == 2 else scores[None]
    s = s.float()
    if s.stride(-1) != 1:
        s = s.contiguous()
    rows, n = s.shape
    k = min(int(k), n)
    dev = s.device
    if k <= 0:
        return torch.zeros((rows, 0), dtype=torch.int64, device=dev), s[:, :0]
    nblocks = triton.cdiv(n, BLOCK)
    state = torch.zeros((rows, 2), dtype=torch.int32, device=dev)
    state[:, 1] = k
    hist = torch.zeros((rows, BINS), dtype=torch.int32, device=dev)
    grid = (nblocks, rows)
    shift, fixed = 32, 0
    for bits in DIGITS:
        shift -= bits
        _hist_pass[grid](s, s.stride(0), n, state, hist, shift, fixed, BINS=BINS, BLOCK=BLOCK)
        _pick_digit[(rows,)](state, hist, shift, BINS=BINS)
        fixed |= ((1 << bits) - 1) << shift
    counts = torch.empty((rows, nblocks, 2), dtype=torch.int32, device=dev)
    _count_pass[grid](s, s.stride(0), n, state, counts, nblocks, BLOCK=BLOCK)
    idx = torch.empty((rows, k), dtype=torch.int64, device=dev)
    val = torch.empty((rows, k), dtype=torch.float32, device=dev)
    _write_pass[grid](s, s.stride(0), n, k, state, counts, nblocks, idx, val, BLOCK=BLOCK,
                      MAXB=triton.next_power_of_2(nblocks))
    if sort:
        val, order = torch.sort(val, dim=1, descending=True, stable=True)
        idx = torch.gather(idx, 1, order)
    return idx, val
