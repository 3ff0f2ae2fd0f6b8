"""Selection in Triton: the BM25 tile pipeline's collect of candidates (``_collect_kernel``, the fallback of
``cuda/selection.cu``'s ``collect``), and the exact top-k of long f32 rows, the selection stage of sparse attention
on the GPU.

Exact top-k of long rows: two selects, the same entries (ties: the earlier position, as ``topk_rows``):
``bucket_topk`` (four launches: a histogram of the top 12 bits, then the boundary bucket; the default, see its
section below) and ``radix_topk`` (nine).

``radix_topk``: scores become order-preserving u32 keys (negatives bit-inverted, positives with the sign bit set; -0.0 counts as
+0.0). Three histogram passes over 11, 11 and 10 bits find the k-th largest key T of each row and how many of the
keys equal to T belong to the top k (``need``), every pass reading the row once and keeping its state on the device
(no host round trip). A count pass then sizes each block's keys above T and equal to T, and a write pass puts the
ones above T, then the first ``need`` equal to T by position, in exactly k slots, so ties go to the earlier position
as ``topk_rows`` does. A stable sort of those k by score (descending) ranks them. Every pass is a grid of
(blocks, rows), so one launch serves a batch of rows, and the whole select can be captured in a CUDA graph.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

DIGITS = (11, 11, 10)  # bits resolved per histogram pass, high to low
BINS = 2048  # 2^11
BLOCK = 4096  # scores per program


@triton.jit(do_not_specialize=["num_docs", "n_groups", "n_tiles", "cap"])
def _collect_kernel(scores, maxima, tile_maxima, thr, tiny, num_docs, n_groups, n_tiles, found, cap,
                    NGB: tl.constexpr, SUB: tl.constexpr, GROUP_: tl.constexpr, TILE: tl.constexpr):
    # Append (row * num_docs + doc, score bits) pairs of the docs scoring >= the row's threshold (at least the
    # smallest positive score) to found[2:], counting them in found[0]; only the groups whose maximum reaches
    # it are read, and few do, so NGB groups are checked at once and SUB at a time read. Then clears what it
    # read, the group maxima and their tiles' maxima, so they are zero for the next batch.
    row = tl.program_id(1).to(tl.int64)
    g0 = tl.program_id(0).to(tl.int64) * NGB
    t = tl.maximum(tl.load(thr + row), tiny)
    g = g0 + tl.arange(0, NGB)
    gm = tl.load(maxima + row * n_groups + g, mask=g < n_groups, other=0.0)
    if tl.max((gm >= t).to(tl.int32), axis=0) > 0:
        for s0 in range(0, NGB, SUB):
            gs = g0 + s0 + tl.arange(0, SUB)
            sm = tl.load(maxima + row * n_groups + gs, mask=gs < n_groups, other=0.0)
            sel = sm >= t
            if tl.max(sel.to(tl.int32), axis=0) > 0:
                doc = gs[:, None] * GROUP_ + tl.arange(0, GROUP_)[None, :]
                m = sel[:, None] & (doc < num_docs)
                s = tl.load(scores + row * num_docs + doc, mask=m, other=0.0)
                ok = tl.reshape(m & (s >= t), [SUB * GROUP_])
                ok_i = ok.to(tl.int64)
                first = tl.atomic_add(found, tl.sum(ok_i, axis=0))
                pos = first + tl.cumsum(ok_i, axis=0) - 1
                keep = ok & (pos < cap)
                tl.store(found + 2 + 2 * pos, tl.reshape(row * num_docs + doc, [SUB * GROUP_]), mask=keep)
                bits = tl.reshape(s, [SUB * GROUP_]).to(tl.int32, bitcast=True).to(tl.int64)
                tl.store(found + 3 + 2 * pos, bits, mask=keep)
    tl.store(maxima + row * n_groups + g, tl.zeros([NGB], dtype=tl.float32), mask=(g < n_groups) & (gm != 0.0))
    tt = g0 * GROUP_ // TILE + tl.arange(0, NGB * GROUP_ // TILE)
    tl.store(tile_maxima + row * n_tiles + tt, tl.zeros([NGB * GROUP_ // TILE], dtype=tl.float32),
             mask=tt < n_tiles)


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


def _rows(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, int]:
    """``scores`` as contiguous f32 rows [R, N] and k clamped to N (both selections take any 1- or 2-d input)."""
    s = scores if scores.dim() == 2 else scores[None]
    s = s.float()
    if s.stride(-1) != 1:
        s = s.contiguous()
    return s, min(int(k), s.shape[1])


def radix_topk(scores: torch.Tensor, k: int, sort: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k of each row of ``scores`` [R, N] (f32): (indices int64, values) [R, min(k, N)], best first
    (ties: the earlier position), as ``selection.topk_rows``. ``sort=False`` leaves them in the order above
    the k-th value, then equal to it, each by position (the same set)."""
    s, k = _rows(scores, k)
    rows, n = s.shape
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


# -- bucket select: one histogram pass, then the boundary bucket ------------------------------------------------------
# Every score gets a distinct 63-bit key, its u32 order key above 31 bits of (2^31 - 1 - position): larger is better,
# and equal scores order by position, so the top k by key are exactly ``topk_rows``'s entries and the k-th largest
# key is a threshold that no two entries share.
BUCKET_BITS = tl.constexpr(12)  # the histogram pass resolves the top 12 bits of the order key: sign, exponent, 3 more
POS_BITS = tl.constexpr(31)  # (constexprs: Triton kernels read no other globals)
POS_MASK = tl.constexpr((1 << 31) - 1)


@dataclass(frozen=True)
class BucketSettings:
    """Tuning of ``bucket_topk`` (one object, passed in)."""

    block: int = 4096  # scores per program of the grid passes
    cap: int = 16384  # candidates a row kept for the select program; more (heavy ties) and it reads the row itself
    chunk: int = 2048  # candidates per step of the select program
    num_warps: int = 8


BUCKET = BucketSettings()


@triton.jit
def _key63(x, pos):
    return (_ordered(x).to(tl.int64) << POS_BITS) | (POS_MASK - pos.to(tl.int64))


@triton.jit
def _boundary_counts(hist, row, k, HBINS: tl.constexpr):
    """The bucket holding the k-th largest score of the row (every score in a higher bucket is in the top k), the
    scores in higher buckets and the scores in it."""
    bins = tl.arange(0, HBINS)
    h = tl.load(hist + row * HBINS + bins)
    above = tl.sum(h, 0) - tl.cumsum(h, 0)
    b = tl.max(tl.where((above < k) & (above + h >= k), bins, -1), 0)
    return b, tl.sum(tl.where(bins == b, above, 0), 0), tl.sum(tl.where(bins == b, h, 0), 0)


@triton.jit
def _boundary(hist, row, k, HBINS: tl.constexpr):
    b, _, _ = _boundary_counts(hist, row, k, HBINS)
    return b


@triton.jit
def _bucket_hist(scores, stride, n, hist, HBINS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(1).to(tl.int64)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < n
    key = _ordered(tl.load(scores + row * stride + offs, mask=inside, other=0.0))
    h = tl.histogram((key >> (32 - BUCKET_BITS)).to(tl.int32), HBINS, mask=inside)
    tl.atomic_add(hist + row * HBINS + tl.arange(0, HBINS), h, mask=h > 0, sem="relaxed")  # most bins are empty


@triton.jit
def _bucket_count(scores, stride, n, k, hist, counts, nblocks, HBINS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(1).to(tl.int64)
    blk = tl.program_id(0)
    offs = blk * BLOCK + tl.arange(0, BLOCK)
    inside = offs < n
    key = _ordered(tl.load(scores + row * stride + offs, mask=inside, other=0.0))
    b = _boundary(hist, row, k, HBINS)
    take = inside & ((key >> (32 - BUCKET_BITS)).to(tl.int32) >= b)
    tl.store(counts + row * nblocks + blk, tl.sum(take.to(tl.int32), 0))


@triton.jit
def _bucket_write(scores, stride, n, k, hist, counts, nblocks, cand, CAP: tl.constexpr, HBINS: tl.constexpr,
                  BLOCK: tl.constexpr, MAXB: tl.constexpr):
    """The scores of the boundary bucket and above as 63-bit keys, in position order (after the earlier blocks')."""
    row = tl.program_id(1).to(tl.int64)
    blk = tl.program_id(0)
    offs = blk * BLOCK + tl.arange(0, BLOCK)
    inside = offs < n
    x = tl.load(scores + row * stride + offs, mask=inside, other=0.0)
    b = _boundary(hist, row, k, HBINS)
    take = inside & ((_ordered(x) >> (32 - BUCKET_BITS)).to(tl.int32) >= b)
    bs = tl.arange(0, MAXB)
    base = tl.sum(tl.load(counts + row * nblocks + bs, mask=bs < blk, other=0), 0)
    slot = base + tl.cumsum(take.to(tl.int32), 0) - 1
    tl.store(cand + row * CAP + slot, _key63(x, offs), mask=take & (slot < CAP))


@triton.jit
def _cand_keys(cand, scores, stride, row, fits, start, m, CAP: tl.constexpr, CHUNK: tl.constexpr):
    """Keys ``start``.. of the row's candidates: from the candidate list, or (when it overflowed) the row itself;
    -1 (below every key) past the end."""
    j = start + tl.arange(0, CHUNK)
    in_cand = tl.where(fits != 0, m, 0)  # (bounds, not a scalar and a block of masks: the interpreter mistypes those)
    from_cand = tl.load(cand + row * CAP + j, mask=j < in_cand, other=-1)
    x = tl.load(scores + row * stride + j, mask=j < m - in_cand, other=0.0)
    return tl.where(j < in_cand, from_cand, tl.where(j < m, _key63(x, j), -1))


@triton.jit
def _bucket_select(scores, stride, n, k, hist, counts, nblocks, cand, out_idx, out_val, out_k, offset,
                   CAP: tl.constexpr, HBINS: tl.constexpr, CHUNK: tl.constexpr, MAXB: tl.constexpr):
    """One program a row: the k-th largest key by radix select within the boundary bucket (11 bits a round, from
    the top, until the keys matching the prefix are exactly those still needed; keys are distinct, so it ends),
    then every candidate at or above it, in position order."""
    row = tl.program_id(0).to(tl.int64)
    bs = tl.arange(0, MAXB)
    total = tl.sum(tl.load(counts + row * nblocks + bs, mask=bs < nblocks, other=0), 0)
    fits = (total <= CAP).to(tl.int32)
    m = tl.where(fits != 0, total, n)
    bins = tl.arange(0, 2048)
    b, above_b, in_b = _boundary_counts(hist, row, k, HBINS)
    low = (63 - BUCKET_BITS) + tl.zeros([], tl.int32)  # the key's bits from `low` up are known: the bucket's
    prefix = b.to(tl.int64) << low  # the bits of the k-th largest key found so far
    need = k - above_b  # keys still to take among those matching the prefix
    matching = in_b
    while matching > need:
        shift = tl.maximum(low - 11, 0)
        h = tl.zeros([2048], tl.int32)
        for start in range(0, m, CHUNK):
            key = _cand_keys(cand, scores, stride, row, fits, start, m, CAP, CHUNK)
            match = (key >> low) == (prefix >> low)  # padding (-1) never matches: keys are >= 0
            h += tl.histogram(((key >> shift) & ((1 << (low - shift)) - 1)).to(tl.int32), 2048, mask=match)
        above = tl.sum(h, 0) - tl.cumsum(h, 0)
        digit = tl.max(tl.where((above < need) & (above + h >= need), bins, -1), 0)
        need -= tl.sum(tl.where(bins == digit, above, 0), 0)
        matching = tl.sum(tl.where(bins == digit, h, 0), 0)
        prefix |= digit.to(tl.int64) << shift
        low = shift
    # every key >= prefix: the higher digits' (counted above) and the matching ones (all still needed)
    written = tl.zeros([], tl.int32)
    for start in range(0, m, CHUNK):
        key = _cand_keys(cand, scores, stride, row, fits, start, m, CAP, CHUNK)
        take = key >= prefix
        slot = written + tl.cumsum(take.to(tl.int32), 0) - 1
        pos = POS_MASK - (key & POS_MASK)
        tl.store(out_idx + row * out_k + slot, pos + offset, mask=take)
        tl.store(out_val + row * out_k + slot, tl.load(scores + row * stride + pos, mask=take, other=0.0), mask=take)
        written += tl.sum(take.to(tl.int32), 0)


def bucket_topk(scores: torch.Tensor, k: int, sort: bool = True, s: BucketSettings = BUCKET,
                offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``radix_topk``'s result (ties: the earlier position) in four launches whatever the row length: a histogram of
    the top 12 bits of every score, a count and a write of the boundary bucket's and higher scores (the candidates,
    a few times k on spread scores), and one program a row that selects the k among them. ``sort=False`` leaves
    the k in position order. Rows of up to 2^31 scores. Indices count from ``offset`` (a range's scores: no
    launch to shift them)."""
    x, k = _rows(scores, k)
    rows, n = x.shape
    dev = x.device
    if k <= 0:
        return torch.zeros((rows, 0), dtype=torch.int64, device=dev), x[:, :0]
    nblocks = triton.cdiv(n, s.block)
    maxb = triton.next_power_of_2(nblocks)
    hbins = 1 << BUCKET_BITS.value
    hist = torch.zeros((rows, hbins), dtype=torch.int32, device=dev)
    counts = torch.empty((rows, nblocks), dtype=torch.int32, device=dev)
    cand = torch.empty((rows, s.cap), dtype=torch.int64, device=dev)
    idx = torch.empty((rows, k), dtype=torch.int64, device=dev)
    val = torch.empty((rows, k), dtype=torch.float32, device=dev)
    grid = (nblocks, rows)
    _bucket_hist[grid](x, x.stride(0), n, hist, HBINS=hbins, BLOCK=s.block, num_warps=s.num_warps)
    _bucket_count[grid](x, x.stride(0), n, k, hist, counts, nblocks, HBINS=hbins, BLOCK=s.block,
                        num_warps=s.num_warps)
    _bucket_write[grid](x, x.stride(0), n, k, hist, counts, nblocks, cand, CAP=s.cap, HBINS=hbins, BLOCK=s.block,
                        MAXB=maxb, num_warps=s.num_warps)
    _bucket_select[(rows,)](x, x.stride(0), n, k, hist, counts, nblocks, cand, idx, val, k, offset, CAP=s.cap,
                            HBINS=hbins, CHUNK=s.chunk, MAXB=maxb, num_warps=s.num_warps)
    if sort:  # stable: among equal scores the earlier position stays first
        val, order = torch.sort(val, dim=1, descending=True, stable=True)
        idx = torch.gather(idx, 1, order)
    return idx, val
