"""GPU relevancy stage for dense vectors (torch, any device): inner products of queries against keys."""
from __future__ import annotations

import torch


def inner_product(queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """``scores[i, j] = queries[i] . keys[j]``, shape [m, n], accumulated in f32 whatever the inputs' dtype."""
    q = queries if queries.dim() == 2 else queries[None]
    return torch.matmul(q.float(), keys.float().transpose(0, 1))
