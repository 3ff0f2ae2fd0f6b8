"""The Triton sparse-attention kernels (radix select, fused relevancy, sparse decode) against the torch path and the
CPU reference, on one device. tests/test_attention_triton.py runs it in a fresh process with TRITON_INTERPRET=1
(Triton reads it when the kernels are defined) on the CPU, and in process on a CUDA device.

    [TRITON_INTERPRET=1] python -m tests.attention_triton_checks cpu|cuda
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np
import torch

from ragserve.attention import get_method
from ragserve.kernels.gpu.attention import TORCH, TritonOps
from ragserve.kernels.cpu.selection import topk_rows
from ragserve.kernels.gpu.triton import attention as A
from ragserve.kernels.gpu.triton.selection import BucketSettings, bucket_topk, radix_topk

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def _t(x: np.ndarray, device: str) -> torch.Tensor:
    return torch.from_numpy(x).to(device)


def select_checks(device: str) -> dict[str, bool]:
    rng = np.random.default_rng(0)
    shapes = [(3, 5000, 100), (2, 9000, 2048), (1, 300, 300), (2, 4097, 1)]
    if device == "cuda":
        shapes += [(1, 1 << 20, 2048), (8, 1 << 17, 2048), (64, 65536, 124)]
    out = {}
    for rows, n, k in shapes:
        s = rng.standard_normal((rows, n)).astype(np.float32)
        s[0] = rng.integers(-3, 3, n).astype(np.float32)  # heavy ties at the k-th value
        if rows > 1:
            s[1, ::3] = -np.inf
            s[1, 1::7] = -0.0
            s[1, 2::11] = 0.0
        i, v = radix_topk(_t(s, device), k)
        ri, rv = topk_rows(s, k)
        out[f"radix {rows}x{n} k={k}"] = bool(np.array_equal(i.cpu().numpy(), ri)
                                              and np.array_equal(v.cpu().numpy(), rv))
        if INTERPRETED and n > 5000:
            continue  # the bucket select's rounds are slow interpreted; the small rows cover its paths
        # the bucket select: default settings compiled (on CUDA the 1M integer row overflows the candidate list:
        # the select program reads the row itself); interpreted, small blocks and a list of 1024
        settings = BucketSettings(block=512, cap=1024, chunk=256) if INTERPRETED else BucketSettings()
        for sort in (True, False):
            i, v = bucket_topk(_t(s, device), k, sort=sort, s=settings)
            ri, rv = topk_rows(s, k)
            if not sort:  # unsorted: the same entries in position order
                order = np.argsort(ri, axis=1)
                ri, rv = np.take_along_axis(ri, order, 1), np.take_along_axis(rv, order, 1)
            out[f"bucket {rows}x{n} k={k}{'' if sort else ' unsorted'}"] = bool(
                np.array_equal(i.cpu().numpy(), ri) and np.array_equal(v.cpu().numpy(), rv))
    # more candidates than the list holds (it takes 64): the select program reads the rows themselves
    s = rng.standard_normal((2, 3000)).astype(np.float32)
    i, v = bucket_topk(_t(s, device), 700, s=BucketSettings(block=1024, cap=64, chunk=128))
    ri, rv = topk_rows(s, 700)
    out["bucket overflow 2x3000 k=700"] = bool(np.array_equal(i.cpu().numpy(), ri)
                                               and np.array_equal(v.cpu().numpy(), rv))
    i, _ = bucket_topk(_t(s, device), 70, s=BucketSettings(block=1024), offset=5)
    out["bucket offset"] = bool(np.array_equal(i.cpu().numpy(), topk_rows(s, 70)[0] + 5))
    return out


def kernel_checks(device: str) -> dict[str, bool]:
    rng = np.random.default_rng(1)
    b, g, h, n, d = 2, 2, 4, 700, 32
    q = _t(rng.standard_normal((b, g, h, d), dtype=np.float32), device)
    k = _t(rng.standard_normal((b, g, n, d), dtype=np.float32), device)
    v = _t(rng.standard_normal((b, g, n, d), dtype=np.float32), device)
    w = torch.full((b, g, h), 0.25, device=device)
    lo, hi = TORCH.unit_minmax(k, 16, 0)

    def close(a, r, tol=1e-4):
        return bool(torch.allclose(a.float().cpu(), r.float().cpu(), rtol=tol, atol=tol))

    out = {"wrelu": close(A.wrelu_scores(q, w, k), TORCH.dots_wrelu(q, w, k)),
           "bound": close(A.bound_max_scores(q, lo, hi), TORCH.bounds_max(q, lo, hi))}
    # a decode index: views of longer stores (rows further apart than their length)
    room_lo, room_hi = TORCH.grow(lo, lo.shape[-2], lo.shape[-2] + 37), TORCH.grow(hi, hi.shape[-2], hi.shape[-2] + 37)
    out["bound on views"] = close(A.bound_max_scores(q, room_lo[..., :lo.shape[-2], :], room_hi[..., :hi.shape[-2], :]),
                                  TORCH.bounds_max(q, lo, hi))
    for unit in (1, 16, 64):
        out[f"dot_max unit {unit}"] = close(A.dot_max_scores(q, k, unit), TORCH.dots_max(q, k, unit))
    qf = q.reshape(b, g * h, d)
    tok = _t(rng.integers(0, n, (b, g, 300)), device)
    ok = _t(rng.random((b, g, 300)) > 0.2, device)
    small = A.TritonAttentionSettings(chunk=64, block_s=32)
    out["decode"] = close(A.sparse_decode(qf, k, v, tok, ok, 0.2, small), TORCH.attend_selected(qf, k, v, tok, ok, 0.2))
    out["decode shared"] = close(A.sparse_decode(qf, k, v, tok[:, :1], ok[:, :1], 0.2),
                                 TORCH.attend_selected(qf, k, v, tok[:, :1], ok[:, :1], 0.2))
    # units to tokens in one launch: the same (token, valid) pairs as the torch path (which orders them by unit)
    for unit, n_tok, with_keep in ((1, 700, False), (16, 700, True), (64, 700, False)):
        units = -(-n_tok // unit)
        top = torch.stack([torch.randperm(units - 3, generator=torch.Generator().manual_seed(i))[:4] + 1
                           for i in range(b * g)]).reshape(b, g, 4).to(device)
        keep = (torch.arange(4, device=device) % 2 == 0).expand(b, g, 4) if with_keep else None
        tokens, valid = A.expand_units(top, keep, 1, 2, units, unit, n_tok)
        ref = TORCH.expand_units(top, keep, 1, 2, units, unit, n_tok)
        pairs = (tokens * 2 + valid).sort(-1).values
        out[f"expand unit {unit}"] = bool(torch.equal(pairs.cpu(), (ref.tokens * 2 + ref.valid).sort(-1).values.cpu()))
    return out


def _brute_top(method, rel, n: int) -> np.ndarray:
    """The brute-force selection (CPU ``topk_rows``: score descending, ties by position) of the middle units of
    ``rel``'s own scores: whatever the order the device summed them in, the selection must be this one."""
    sink, local, k = method.plan(n)
    scores = rel.scores.float().cpu().numpy()
    b, gs, m = scores.shape
    idx, _ = topk_rows(scores[..., sink:m - local].reshape(b * gs, -1), k)
    return idx.reshape(b, gs, -1) + sink


def method_checks(device: str) -> dict[str, bool]:
    rng = np.random.default_rng(2)
    b, hq, g, n, d = 2, 8, 2, 1280, 32
    out = {}
    qi = rng.integers(-2, 3, (b, hq, d)).astype(np.float32)
    ki = rng.integers(-2, 3, (b, g, n, d)).astype(np.float32)
    qf = rng.standard_normal((b, hq, d), dtype=np.float32)
    kf = rng.standard_normal((b, g, n, d), dtype=np.float32)
    vf = rng.standard_normal((b, g, n, d), dtype=np.float32)
    ranked, unranked = TritonOps(sort_top=True), TritonOps()
    for name in ("dsa", "quest", "lserve", "seer-topk", "seer-threshold"):
        # The reference is explicit: on CUDA a method without ``ops`` runs TritonOps too (whose ``top`` comes
        # unranked), which is how the last H200 run compared ranked against unranked units and failed.
        fast = get_method(name, budget=384, threshold=0.0, ops=ranked)
        loose = get_method(name, budget=384, threshold=0.0, ops=unranked)
        ref = get_method(name, budget=384, threshold=0.0, ops=TORCH)
        # Float data: the selection equals the brute force on the kernel's own scores (exact by construction,
        # near-ties included), ranked; the unranked path selects the same set.
        tq, tk = _t(qf, device), _t(kf, device)
        rel = fast.relevancy(fast.prepare(tk), tq, tk)
        top = fast.retrieval(rel, n).top.cpu().numpy()
        out[f"{name} selection = brute force on its scores"] = bool(np.array_equal(top, _brute_top(fast, rel, n)))
        top_u = loose.retrieval(loose.relevancy(loose.prepare(tk), tq, tk), n).top.cpu().numpy()
        out[f"{name} unranked selection, same set"] = bool(np.array_equal(np.sort(top_u, -1), np.sort(top, -1)))
        # Integer data (exact sums in any order, many ties): the kernel's scores equal the torch path's bit for
        # bit, so the selections are the same units in the same rank order.
        tq, tk = _t(qi, device), _t(ki, device)
        rel_f = fast.relevancy(fast.prepare(tk), tq, tk)
        rel_r = ref.relevancy(ref.prepare(tk), tq, tk)
        sel_f, sel_r = fast.retrieval(rel_f, n), ref.retrieval(rel_r, n)
        out[f"{name} selection"] = bool(torch.equal(rel_f.scores.cpu(), rel_r.scores.cpu())
                                        and torch.equal(sel_f.top.cpu(), sel_r.top.cpu()))
        # the whole step at a budget covering the context: dense attention within 1e-5 (f32)
        full = get_method(name, budget=n, threshold=0.0, ops=ranked)
        tq, tk, tv = _t(qf, device), _t(kf, device), _t(vf, device)
        o, sel, _ = full.step(tq, tk, tv, d ** -0.5)
        dense, _, _ = get_method("dense", ops=TORCH).step(tq, tk, tv, d ** -0.5)
        out[f"{name} full budget"] = bool((o - dense).abs().max() <= 1e-5 and (sel.counts() == n).all())
        if INTERPRETED:
            continue  # the interpreter's bf16 tl.dot is wrong (Triton 3.9): bf16 is checked compiled only
        o16, _, _ = full.step(tq.bfloat16(), tk.bfloat16(), tv.bfloat16(), d ** -0.5)
        out[f"{name} bf16"] = bool(o16.dtype == torch.bfloat16 and (o16.float() - dense).abs().max() < 3e-2)
    return out


def graph_checks(device: str) -> dict[str, bool]:
    """CUDA only: a whole sparse step (relevancy, selection, expansion, attention) captured as one CUDA graph
    replays to the eager step's output bit for bit (every kernel on the path is deterministic, none syncs)."""
    if device != "cuda":
        return {}
    rng = np.random.default_rng(3)
    b, hq, g, n, d = 2, 16, 4, 20000, 64
    q = _t(rng.standard_normal((b, hq, d), dtype=np.float32), device).bfloat16()
    k = _t(rng.standard_normal((b, g, n, d), dtype=np.float32), device).bfloat16()
    v = _t(rng.standard_normal((b, g, n, d), dtype=np.float32), device).bfloat16()
    out = {}
    for name in ("dsa", "quest", "lserve", "seer-topk", "seer-threshold"):
        m = get_method(name, budget=2048, ops=TritonOps())
        index = m.prepare(k)

        def step():
            return m.apply(q, k, v, m.retrieval(m.relevancy(index, q, k), n), d ** -0.5)

        eager = step()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = step()
        graph.replay()
        torch.cuda.synchronize()
        out[f"{name} step as one CUDA graph"] = bool(torch.equal(captured, eager))
    return out


def main(device: str) -> int:
    results = {**select_checks(device), **kernel_checks(device), **method_checks(device), **graph_checks(device)}
    print(json.dumps(results, indent=1))
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    if INTERPRETED:
        from tests.interpreter_compat import repair_scalar_index

        repair_scalar_index()
    sys.exit(main(sys.argv[1]))
