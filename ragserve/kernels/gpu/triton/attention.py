"""Fused sparse-attention kernels (Triton): relevancy scores straight from the keys, and attention over a selection.

Each relevancy kernel reads its keys once and writes one score per unit, keeping the per-head products in
registers (the torch path writes them out: for DSA's 64 index heads that is 64 f32 per token):
- ``wrelu_scores``: DSA's indexer, ``sum_h w_h * ReLU(q_h . k)``;
- ``bound_max_scores``: Quest's page bound, ``max_h (q_h+ . hi + q_h- . lo)``;
- ``dot_max_scores``: the largest ``q_h . k`` over heads and over each unit of keys (LServe pages, Seer blocks).
``sparse_decode`` is flash-decoding over a list of token positions: each program gathers a chunk of the selected
keys and values of one KV group, runs an online softmax for the group's query heads, and a second kernel merges the
chunks. Query heads are padded to 16 rows (the smallest matrix-unit tile); padded rows are masked out.
Inputs: f32 or bf16, head dim a power of two in [16, 256]; ``supported`` says whether a call qualifies.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

NEG = tl.constexpr(-1.0e30)  # a constexpr, as Triton allows globals in kernels; finite: a row with no valid score keeps exp(NEG - m) = 0 instead of NaN


@dataclass(frozen=True)
class TritonAttentionSettings:
    """Tuning of the fused kernels (one object, passed in)."""

    block_n: int = 128  # keys per relevancy program
    block_s: int = 64  # selected tokens per inner step of the decode kernel
    chunk: int = 256  # most selected tokens per decode program (split-K)
    programs: int = 264  # decode programs to aim for (2 per H200 SM): a batch of 1 splits its 2,048 tokens finer
    num_warps: int = 4
    select: str = "bucket"  # the top-k: "bucket" (selection.bucket_topk) or "radix" (radix_topk)


DEFAULT = TritonAttentionSettings()


def supported(dim: int, heads: int) -> bool:
    return 16 <= dim <= 256 and dim & (dim - 1) == 0 and heads <= 128


def _pad_heads(h: int) -> int:
    return max(16, triton.next_power_of_2(h))


@triton.jit
def _wrelu_kernel(q, w, keys, out, n, sq_r, sw_r, sk_r, so_r, H: tl.constexpr, HP: tl.constexpr,
                  D: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(1).to(tl.int64)  # row offsets pass 2^31 elements at 1M tokens
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    hs = tl.arange(0, HP)
    ds = tl.arange(0, D)
    qv = tl.load(q + r * sq_r + hs[:, None] * D + ds[None, :], mask=hs[:, None] < H, other=0.0)
    wv = tl.load(w + r * sw_r + hs, mask=hs < H, other=0.0).to(tl.float32)
    kv = tl.load(keys + r * sk_r + offs[:, None] * D + ds[None, :], mask=offs[:, None] < n, other=0.0)
    s = tl.dot(qv.to(kv.dtype), tl.trans(kv), input_precision="ieee")
    score = tl.sum(tl.maximum(s, 0.0) * wv[:, None], 0)
    tl.store(out + r * so_r + offs, score, mask=offs < n)


@triton.jit
def _bound_kernel(q, lo, hi, out, n, sq_r, sk_r, so_r, H: tl.constexpr, HP: tl.constexpr, D: tl.constexpr,
                  BLOCK: tl.constexpr):
    r = tl.program_id(1).to(tl.int64)  # row offsets pass 2^31 elements at 1M tokens
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    hs = tl.arange(0, HP)
    ds = tl.arange(0, D)
    qv = tl.load(q + r * sq_r + hs[:, None] * D + ds[None, :], mask=hs[:, None] < H, other=0.0)
    kmask = offs[:, None] < n
    lv = tl.load(lo + r * sk_r + offs[:, None] * D + ds[None, :], mask=kmask, other=0.0)
    hv = tl.load(hi + r * sk_r + offs[:, None] * D + ds[None, :], mask=kmask, other=0.0)
    qd = qv.to(lv.dtype)
    s = tl.dot(tl.maximum(qd, 0.0).to(lv.dtype), tl.trans(hv), input_precision="ieee")
    s += tl.dot(tl.minimum(qd, 0.0).to(lv.dtype), tl.trans(lv), input_precision="ieee")
    s = tl.where(hs[:, None] < H, s, float("-inf"))
    tl.store(out + r * so_r + offs, tl.max(s, 0), mask=offs < n)


@triton.jit
def _dot_max_kernel(q, keys, out, n, units, sq_r, sk_r, so_r, H: tl.constexpr, HP: tl.constexpr,
                    D: tl.constexpr, BLOCK: tl.constexpr, UNIT: tl.constexpr):
    r = tl.program_id(1).to(tl.int64)  # row offsets pass 2^31 elements at 1M tokens
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    hs = tl.arange(0, HP)
    ds = tl.arange(0, D)
    qv = tl.load(q + r * sq_r + hs[:, None] * D + ds[None, :], mask=hs[:, None] < H, other=0.0)
    kv = tl.load(keys + r * sk_r + offs[:, None] * D + ds[None, :], mask=offs[:, None] < n, other=0.0)
    s = tl.dot(qv.to(kv.dtype), tl.trans(kv), input_precision="ieee")
    s = tl.where((hs[:, None] < H) & (offs[None, :] < n), s, float("-inf"))
    tok = tl.max(s, 0)
    per_unit = tl.max(tl.reshape(tok, [BLOCK // UNIT, UNIT]), 1)
    u = tl.program_id(0) * (BLOCK // UNIT) + tl.arange(0, BLOCK // UNIT)
    tl.store(out + r * so_r + u, per_unit, mask=u < units)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """[..., m, D] -> [R, m, D], tokens D apart and lanes adjacent, rows at least m * D apart: a decode index's view
    of its longer store stays a view (a copy would cost a pass over the index)."""
    r = x.reshape(-1, x.shape[-2], x.shape[-1])
    if r.stride(-1) != 1 or r.stride(-2) != r.shape[-1]:
        r = r.contiguous()
    return r


def wrelu_scores(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor,
                 s: TritonAttentionSettings = DEFAULT) -> torch.Tensor:
    """q [..., H, D], w [..., H], keys [..., N, D] -> [..., N] f32."""
    lead, (h, d), n = q.shape[:-2], q.shape[-2:], keys.shape[-2]
    qr, kr, wr = _rows(q), _rows(keys), w.reshape(-1, h).contiguous()
    out = torch.empty((qr.shape[0], n), dtype=torch.float32, device=q.device)
    _wrelu_kernel[(triton.cdiv(n, s.block_n), qr.shape[0])](
        qr, wr, kr, out, n, qr.stride(0), wr.stride(0), kr.stride(0), out.stride(0), H=h, HP=_pad_heads(h), D=d,
        BLOCK=s.block_n, num_warps=s.num_warps)
    return out.reshape(*lead, n)


def bound_max_scores(q: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor,
                     s: TritonAttentionSettings = DEFAULT) -> torch.Tensor:
    """q [..., H, D], lo/hi [..., P, D] -> [..., P] f32."""
    lead, (h, d), n = q.shape[:-2], q.shape[-2:], lo.shape[-2]
    qr, lr, hr = _rows(q), _rows(lo), _rows(hi)
    out = torch.empty((qr.shape[0], n), dtype=torch.float32, device=q.device)
    _bound_kernel[(triton.cdiv(n, s.block_n), qr.shape[0])](
        qr, lr, hr, out, n, qr.stride(0), lr.stride(0), out.stride(0), H=h, HP=_pad_heads(h), D=d,
        BLOCK=s.block_n, num_warps=s.num_warps)
    return out.reshape(*lead, n)


def dot_max_scores(q: torch.Tensor, keys: torch.Tensor, unit: int,
                   s: TritonAttentionSettings = DEFAULT) -> torch.Tensor:
    """q [..., H, D], keys [..., N, D] -> [..., ceil(N / unit)] f32 (unit a power of two <= block_n)."""
    lead, (h, d), n = q.shape[:-2], q.shape[-2:], keys.shape[-2]
    units = triton.cdiv(n, unit)
    qr, kr = _rows(q), _rows(keys)
    out = torch.empty((qr.shape[0], units), dtype=torch.float32, device=q.device)
    block = max(s.block_n, unit)
    _dot_max_kernel[(triton.cdiv(n, block), qr.shape[0])](
        qr, kr, out, n, units, qr.stride(0), kr.stride(0), out.stride(0), H=h, HP=_pad_heads(h), D=d,
        BLOCK=block, UNIT=unit, num_warps=s.num_warps)
    return out.reshape(*lead, units)


@triton.jit
def _decode_kernel(q, keys, values, tokens, valid, m_out, l_out, acc_out, scale, n, sel, groups, splits,
                   tok_g_stride, H: tl.constexpr, HP: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr,
                   CHUNK: tl.constexpr):
    bg = tl.program_id(0)  # sequence b, KV group g: bg = b * groups + g
    split = tl.program_id(1)
    b = bg // groups
    g = bg % groups
    hs = tl.arange(0, HP)
    ds = tl.arange(0, D)
    qv = tl.load(q + (bg * H + hs[:, None]) * D + ds[None, :], mask=hs[:, None] < H, other=0.0)
    kv_base = bg.to(tl.int64) * n * D
    sel_base = (b * (1 + (groups - 1) * tok_g_stride) + g * tok_g_stride).to(tl.int64) * sel
    m = tl.full([HP], NEG, tl.float32)
    l = tl.zeros([HP], tl.float32)
    acc = tl.zeros([HP, D], tl.float32)
    for off in range(0, CHUNK, BLOCK):  # constant bounds: Triton 3.6's interpreter cannot loop from a program id
        j = split * CHUNK + off + tl.arange(0, BLOCK)
        inside = j < sel
        tok = tl.load(tokens + sel_base + j, mask=inside, other=0)
        ok = inside & (tl.load(valid + sel_base + j, mask=inside, other=0) != 0)
        kk = tl.load(keys + kv_base + tok[:, None] * D + ds[None, :], mask=ok[:, None], other=0.0)
        vv = tl.load(values + kv_base + tok[:, None] * D + ds[None, :], mask=ok[:, None], other=0.0)
        s = tl.dot(qv.to(kk.dtype), tl.trans(kk), input_precision="ieee") * scale
        s = tl.where(ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m - m_new)
        l = l * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(vv.dtype), vv, input_precision="ieee")
        m = m_new
    part = bg * splits + split
    tl.store(m_out + part * HP + hs, m)
    tl.store(l_out + part * HP + hs, l)
    tl.store(acc_out + (part * HP + hs[:, None]) * D + ds[None, :], acc)


@triton.jit
def _merge_kernel(m_in, l_in, acc_in, out, SPLITS: tl.constexpr, H: tl.constexpr, HP: tl.constexpr,
                  D: tl.constexpr):
    bg = tl.program_id(0)
    hs = tl.arange(0, HP)
    ds = tl.arange(0, D)
    sp = tl.arange(0, SPLITS)
    top = tl.max(tl.load(m_in + (bg * SPLITS + sp[:, None]) * HP + hs[None, :]), 0)
    num = tl.zeros([HP, D], tl.float32)
    den = tl.zeros([HP], tl.float32)
    for i in tl.static_range(SPLITS):
        part = bg * SPLITS + i
        wgt = tl.exp(tl.load(m_in + part * HP + hs) - top)
        den += tl.load(l_in + part * HP + hs) * wgt
        num += tl.load(acc_in + (part * HP + hs[:, None]) * D + ds[None, :]) * wgt[:, None]
    res = num / den[:, None]
    tl.store(out + (bg * H + hs[:, None]) * D + ds[None, :], res.to(out.dtype.element_ty), mask=hs[:, None] < H)


def sparse_decode(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, tokens: torch.Tensor,
                  valid: torch.Tensor, scale: float, s: TritonAttentionSettings = DEFAULT) -> torch.Tensor:
    """q [B, Hq, D] over keys/values [B, G, N, D] at ``tokens`` [B, Gs, S] where ``valid`` (Gs = G, or 1: the same
    tokens for every group) -> [B, Hq, D] in q's dtype."""
    b, hq, d = q.shape
    groups, n = keys.shape[1], keys.shape[2]
    h = hq // groups
    sel = tokens.shape[-1]
    hp = _pad_heads(h)
    # enough splits to fill the device (a split at least one inner step), and none longer than a chunk
    fill = min(triton.cdiv(s.programs, b * groups), triton.cdiv(sel, s.block_s))
    splits = triton.next_power_of_2(max(1, fill, triton.cdiv(sel, s.chunk)))
    chunk = triton.cdiv(triton.cdiv(sel, splits), s.block_s) * s.block_s
    qc, kc, vc = q.contiguous(), keys.contiguous(), values.contiguous()
    tok = tokens.contiguous()
    ok = (valid.view(torch.int8) if valid.dtype == torch.bool else valid.to(torch.int8)).contiguous()
    parts = b * groups * splits
    m = torch.empty((parts, hp), dtype=torch.float32, device=q.device)
    l = torch.empty_like(m)
    acc = torch.empty((parts, hp, d), dtype=torch.float32, device=q.device)
    _decode_kernel[(b * groups, splits)](
        qc, kc, vc, tok, ok, m, l, acc, float(scale), n, sel, groups, splits, 1 if tokens.shape[1] == groups else 0,
        H=h, HP=hp, D=d, BLOCK=s.block_s, CHUNK=chunk, num_warps=s.num_warps)
    out = torch.empty((b, hq, d), dtype=q.dtype, device=q.device)
    _merge_kernel[(b * groups,)](m, l, acc, out, SPLITS=splits, H=h, HP=hp, D=d, num_warps=s.num_warps)
    return out


@triton.jit
def _expand_kernel(top, keep, tokens, valid, k, s_len, sink, local, num_units, n, HAS_KEEP: tl.constexpr,
                   UNIT: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(1).to(tl.int64)
    j = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = j < s_len
    slot = j // UNIT  # the sink units, the local units, then the top ones
    is_top = slot >= sink + local
    t = slot - sink - local
    picked = tl.load(top + r * k + t, mask=inside & is_top, other=0)
    unit = tl.where(slot < sink, slot, tl.where(is_top, picked, num_units - local + slot - sink))
    tok = unit * UNIT + j % UNIT
    ok = tok < n
    if HAS_KEEP:
        ok = ok & (tl.load(keep + r * k + t, mask=inside & is_top, other=1) != 0)
    tl.store(tokens + r * s_len + j, tl.minimum(tok, n - 1), mask=inside)
    tl.store(valid + r * s_len + j, ok.to(tl.int8), mask=inside)


def expand_units(top: torch.Tensor, keep: torch.Tensor | None, sink: int, local: int, num_units: int, unit: int,
                 n: int, block: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """Token positions and their validity [B, Gs, (sink + local + k) * unit] of the sink units, the local units and
    ``top`` [B, Gs, k] (in that order), in one launch: past the cache's end, or a unit ``keep`` drops, is not valid
    (its position clamped into the cache)."""
    b, gs, k = top.shape
    s_len = (sink + local + k) * unit
    tp = top.contiguous()
    kp = keep.to(torch.int8).contiguous() if keep is not None else tp
    tokens = torch.empty((b, gs, s_len), dtype=torch.int64, device=top.device)
    valid = torch.empty((b, gs, s_len), dtype=torch.int8, device=top.device)
    _expand_kernel[(triton.cdiv(s_len, block), b * gs)](
        tp, kp, tokens, valid, k, s_len, sink, local, num_units, n, HAS_KEEP=keep is not None, UNIT=unit,
        BLOCK=block)
    return tokens, valid.view(torch.bool)
