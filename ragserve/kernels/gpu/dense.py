"""The GPU backend's scoring in torch ops (any device): the dense reference path (the CUDA path is ``gpu_tiles``).

It takes a launch's work items (see ``gpu_items``) already placed in the device arena:
``a`` first posting (shard-local), ``n`` postings, ``e0`` first entry (arena index), ``ne`` entries,
``pbase`` arena offset of the shard's posting 0, ``rowoff`` = row * num_docs, ``w`` the term weight.
Each posting adds ``f64(s)`` with ``s = w - w / (1 + tf * cache[norm])`` (every op in f32, as ``FORMAT.md``
defines it) into ``acc[rowoff + doc]``; the caller orders launches so that every cell sums in the canonical
order unless the query's f64 sums are exact in any order.
"""
from __future__ import annotations

import torch

M32 = 0xFFFFFFFF


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
