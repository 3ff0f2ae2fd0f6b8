"""Exact inner-product top-k over a large key matrix on the device, without a full row of scores in memory.

Keys (fp16 or f32, [n, d], resident on the device) are scored a chunk of rows at a time with the relevancy
stage; each chunk keeps only its ``torch.topk`` candidates, and one exact selection over the candidates (sorted
back into key order) gives the answer ``selection.topk_rows(relevancy.inner_product(q, keys), k)`` would give:
the same entries, ties broken by position. Why the candidates suffice: fewer than k keys score above the global
k-th value T, so every chunk's k-th value is <= T and each key above T is among its chunk's candidates; only keys
equal to T can be missing, and only from a chunk whose k-th candidate equals T. Such rows (duplicate keys at the
cut) are redone with each chunk's own exact selection.

On CUDA, fp16 keys are multiplied in fp16 with f32 accumulation and f32 output (``torch.mm(..., out_dtype)``),
so no f32 copy of the keys is made. The f32 query is split into an fp16 high part and a scaled fp16 residual,
stacked as 2m rows of one product (the keys are read once), so scores keep about 22 bits of the query's
24-bit mantissa instead of fp16's 11. Scores are written for one chunk at a time: ``chunk_score_bytes`` bounds
that buffer, and its writes are 4 B per query and key against the 2d B of each fp16 key read.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ragserve.kernels.gpu import relevancy, selection

RESIDUAL_SCALE = 2048.0  # 2^11: lifts the fp16 residual of the query out of fp16's subnormal range


@dataclass(frozen=True)
class IpTopkTuning:
    chunk_score_bytes: int = 512 << 20  # f32 scores of one chunk (all queries), the only buffer that grows with n
    split_query: bool = True  # CUDA fp16 keys: two fp16 parts of the query (near-f32 scores, 2m rows of compute)


def _fp16_scores(q: torch.Tensor, chunk: torch.Tensor, split: bool) -> torch.Tensor:
    hi = q.to(chunk.dtype)
    if not split:
        return torch.mm(hi, chunk.t(), out_dtype=torch.float32)
    lo = ((q - hi.float()) * RESIDUAL_SCALE).to(chunk.dtype)
    s = torch.mm(torch.cat((hi, lo)), chunk.t(), out_dtype=torch.float32)
    m = q.shape[0]
    return s[:m].add_(s[m:], alpha=1.0 / RESIDUAL_SCALE)


_MIXED_MM: dict[torch.device, bool] = {}


def mixed_mm(keys: torch.Tensor) -> bool:
    """Whether fp16 x fp16 -> f32 products (``torch.mm(..., out_dtype=float32)``) run on the keys' device; else
    each chunk is multiplied as an f32 copy (more bytes, same scores)."""
    if keys.device.type != "cuda" or keys.dtype not in (torch.float16, torch.bfloat16):
        return False
    if keys.device not in _MIXED_MM:
        try:
            a = torch.ones((2, 8), dtype=keys.dtype, device=keys.device)
            _MIXED_MM[keys.device] = torch.mm(a, a.t(), out_dtype=torch.float32).dtype == torch.float32
        except (RuntimeError, TypeError, NotImplementedError):
            _MIXED_MM[keys.device] = False
    return _MIXED_MM[keys.device]


def chunk_scores(q: torch.Tensor, chunk: torch.Tensor, tuning: IpTopkTuning = IpTopkTuning()) -> torch.Tensor:
    """f32 scores [m, rows] of f32 queries against one chunk of keys."""
    if mixed_mm(chunk):
        return _fp16_scores(q, chunk, tuning.split_query)
    return relevancy.inner_product(q, chunk)


def chunk_rows(m: int, n: int, k: int, keys: torch.Tensor, tuning: IpTopkTuning) -> int:
    """Keys per chunk: the score buffer within budget (plus an f32 copy of the chunk where the product needs
    one), at least k."""
    mixed = mixed_mm(keys)
    per_row = 4 * m * (2 if mixed and tuning.split_query else 1) + (0 if mixed else 4 * keys.shape[1])
    return max(k, min(n, tuning.chunk_score_bytes // per_row))


def ip_topk(queries: torch.Tensor, keys: torch.Tensor, k: int,
            tuning: IpTopkTuning = IpTopkTuning()) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k of ``queries . keys`` per query: (indices int64, f32 scores) [m, min(k, n)], best first, ties
    by the smaller index. Queries are f32 [m, d] (or [d]) on the keys' device."""
    q = (queries if queries.dim() == 2 else queries[None]).float()
    m, n = q.shape[0], keys.shape[0]
    k = min(int(k), n)
    if k <= 0 or m == 0:
        return torch.zeros((m, 0), dtype=torch.int64, device=keys.device), torch.zeros((m, 0), device=keys.device)
    rows = chunk_rows(m, n, k, keys, tuning)
    starts = list(range(0, n, rows))
    if len(starts) == 1:
        return selection.topk_rows(chunk_scores(q, keys, tuning), k)
    cand_v = torch.empty((m, len(starts) * k), dtype=torch.float32, device=keys.device)
    cand_i = torch.empty((m, len(starts) * k), dtype=torch.int64, device=keys.device)
    kth = torch.full((m, len(starts)), -torch.inf, dtype=torch.float32, device=keys.device)
    width = 0
    for c, c0 in enumerate(starts):
        s = chunk_scores(q, keys[c0:c0 + rows], tuning)
        kk = min(k, s.shape[1])
        v, i = torch.topk(s, kk, dim=1, largest=True, sorted=False)
        cand_v[:, width:width + kk] = v
        cand_i[:, width:width + kk] = i + c0
        if kk < s.shape[1]:  # a chunk taken whole can hide nothing
            kth[:, c] = v.amin(dim=1)
        width += kk
    cand_i, order = torch.sort(cand_i[:, :width], dim=1)  # key order, so ties fall to the smaller index
    cand_v = torch.gather(cand_v[:, :width], 1, order)
    pos, vals = selection.topk_rows(cand_v, k)
    idx = torch.gather(cand_i, 1, pos)
    redo = (kth == vals[:, -1:]).any(dim=1).nonzero().flatten().tolist()
    for r in redo:  # keys tied at the cut may be missing from a chunk's candidates: each chunk's exact selection
        parts = [selection.topk_rows(chunk_scores(q[r:r + 1], keys[c0:c0 + rows], tuning), k) for c0 in starts]
        pi = torch.cat([p[0] + c0 for p, c0 in zip(parts, starts)], dim=1)
        pr, vals[r:r + 1] = selection.topk_rows(torch.cat([p[1] for p in parts], dim=1), k)
        idx[r:r + 1] = torch.gather(pi, 1, pr)
    return idx, vals
