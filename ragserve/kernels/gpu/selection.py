"""Exact top-k of accumulator rows on the device, with the ranking rule of ``FORMAT.md``.

First a threshold per row that at least k matched documents reach, then every doc scoring at least that
threshold (ties included) becomes a candidate, and the candidates are sorted by (row, score desc, docid asc)
on the device; the host keeps each row's first k. Two ways to get the threshold:
- ``topk``: the row's exact k-th largest f32 score, from ``torch.topk`` (whose tie order is arbitrary, hence
  only its value is used);
- ``blockmax``: the k-th largest of the maxima of groups of ``GROUP`` consecutive docs. At least k groups,
  so at least k docs, reach it, so it is <= the k-th score: a lower bound found in a 1/GROUP-sized array.
  Candidates are then at most GROUP times the number of groups reaching it (plus ties).
This is the dense path (torch ops, any device); ``gpu_tiles`` does the same selection without dense rows.
"""
from __future__ import annotations

import numpy as np
import torch

from ragserve.kernels.contract import TopK

TINY = float(np.finfo(np.float32).smallest_subnormal)  # the smallest positive f32 score
GROUP = 32
METHODS = ("blockmax", "topk")


def _threshold(scores: torch.Tensor, k: int, method: str) -> torch.Tensor:
    rows, num_docs = scores.shape
    if method == "blockmax" and num_docs >= GROUP * k:
        full = num_docs // GROUP * GROUP
        maxima = scores[:, :full].view(rows, -1, GROUP).amax(dim=2)
        if full < num_docs:
            maxima = torch.cat((maxima, scores[:, full:].amax(dim=1, keepdim=True)), dim=1)
        return torch.topk(maxima, k, dim=1, largest=True, sorted=False).values.min(dim=1).values
    return torch.topk(scores, min(k, num_docs), dim=1, largest=True, sorted=False).values.min(dim=1).values


def ranked(rows: int, k: int, r: torch.Tensor, d: torch.Tensor, s: torch.Tensor) -> list[TopK]:
    """Candidates (row, doc, score), already ordered by (row, doc), ranked per row and cut at k."""
    # Positive f32 scores order like their bit patterns; a stable sort keeps docid order among ties.
    key = (r << 32) | (0x7FFFFFFF - s.view(torch.int32).long())
    key, order = torch.sort(key, stable=True)
    out = torch.stack((key, d[order])).cpu().numpy()  # one transfer
    r = out[0] >> 32
    s = (0x7FFFFFFF - (out[0] & 0xFFFFFFFF)).astype(np.int32).view(np.float32)
    bounds = np.searchsorted(r, np.arange(rows + 1))
    return [TopK(out[1, bounds[i]:min(bounds[i] + k, bounds[i + 1])].astype(np.int64),
                 s[bounds[i]:min(bounds[i] + k, bounds[i + 1])].copy()) for i in range(rows)]


def select_topk(acc: torch.Tensor, k: int, method: str = "blockmax") -> list[TopK]:
    """Top-k of each row of ``acc`` (f64 sums, 0 = doc not matched), best first; zeroes ``acc`` for reuse."""
    rows, num_docs = acc.shape
    scores = acc.to(torch.float32)
    acc.zero_()
    kth = _threshold(scores, k, method)
    # Only matched docs (score > 0) rank; a row with fewer than k of them keeps them all.
    r, d = (scores >= kth.clamp_min(TINY)[:, None]).nonzero(as_tuple=True)  # row-major, docid ascending
    return ranked(rows, k, r, d, scores[r, d])


def topk_rows(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k of each row of ``scores`` [m, n]: (indices int64, values) [m, min(k, n)], best first.

    ``torch.topk`` gives the k-th value; its tie order is arbitrary, so the entries are chosen again by rule:
    all above the k-th, then the first (by position) of those equal to it, as ``cpu.selection.topk_rows``.
    """
    s = scores if scores.dim() == 2 else scores[None]
    m, n = s.shape
    k = min(int(k), n)
    if k <= 0:
        return torch.zeros((m, 0), dtype=torch.int64, device=s.device), s[:, :0]
    kth = torch.topk(s, k, dim=1, largest=True, sorted=False).values.amin(dim=1, keepdim=True)
    gt = s > kth
    eq = s == kth
    need = k - gt.sum(dim=1, keepdim=True)
    take = gt | (eq & (torch.cumsum(eq, dim=1, dtype=torch.int32) <= need))
    idx = take.nonzero(as_tuple=True)[1].view(m, k)  # row-major: ascending positions within each row
    vals = torch.gather(s, 1, idx)
    vals, order = torch.sort(vals, dim=1, descending=True, stable=True)
    return torch.gather(idx, 1, order), vals
