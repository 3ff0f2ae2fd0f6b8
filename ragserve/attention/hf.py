"""Sparse decoding in any transformers causal LM (Llama, Qwen and the like): an attention function registered in
transformers' ``AttentionInterface`` as ``ragserve_sparse``.

The method and the per-layer indexes live in a ``Session`` set for the duration of a generation (a context variable,
so concurrent generations in other threads keep their own). With no session, or a session of the dense method, the
function is transformers' own SDPA attention. Prefill (more than one query token) is dense, and drops the layer's
index; each decode step extends the layer's index by the new tokens (prepare), then scores, selects and attends
over the selection. Keys are the cache's, after RoPE, as Quest and DSA see them.
"""
from __future__ import annotations

import contextlib
from contextvars import ContextVar
from typing import Iterator

import torch

from ragserve.attention.base import Method
from ragserve.attention.common import Index
from ragserve.kernels.contract import StageTimes

ATTN_NAME = "ragserve_sparse"


class Session:
    """One generation's sparse attention: the method, each layer's index, and what the decode steps did.

    Stage seconds are host-clock laps: on a GPU, where nothing waits for the device mid-step, they time the
    launches rather than the kernels (``scripts/bench_attention.py`` times kernels).
    """

    def __init__(self, method: Method) -> None:
        self.method = method
        self.indexes: dict[int, Index] = {}
        self.times = StageTimes()
        self.steps = 0  # layer decode steps run sparse
        self.attended = 0  # tokens attended, summed over those steps, sequences and KV groups (kept on the device)
        self.cached = 0  # tokens cached, summed likewise

    def stats(self) -> dict:
        attended = int(self.attended)
        return {"method": self.method.name, "budget": self.method.config.budget, "layer_steps": self.steps,
                "attended_share": attended / self.cached if self.cached else 1.0, **self.times.to_dict()}


_SESSION: ContextVar[Session | None] = ContextVar("ragserve_attention_session", default=None)


@contextlib.contextmanager
def session(method: Method) -> Iterator[Session]:
    """Decode with ``method`` in this context (this thread or task only)."""
    s = Session(method)
    token = _SESSION.set(s)
    try:
        yield s
    finally:
        _SESSION.reset(token)


def _key_valid(mask: torch.Tensor | None, n: int) -> torch.Tensor | None:
    """Which cached tokens the (single) query may attend, [B, N], from transformers' mask; None when all."""
    if mask is None:
        return None
    row = mask[:, 0, -1, -n:]
    valid = row if row.dtype == torch.bool else row == 0
    return None if bool(valid.all()) else valid


def sparse_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             attention_mask: torch.Tensor | None, dropout: float = 0.0,
                             scaling: float | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: query [B, Hq, T, D], key/value [B, Hkv, N, D] (the whole cache)
    -> ([B, T, Hq, D], None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    s = _SESSION.get()
    layer = getattr(module, "layer_idx", id(module))
    if s is None or not s.method.sparse or query.shape[2] != 1 or module.training:
        if s is not None:
            s.indexes.pop(layer, None)
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    out, sel, s.indexes[layer] = s.method.step(query[:, :, 0, :], key, value, scale, s.indexes.get(layer),
                                                _key_valid(attention_mask, key.shape[-2]), s.times)
    s.steps += 1
    s.attended = s.attended + sel.counts().sum() * (key.shape[1] // sel.tokens.shape[1])  # no host round trip
    s.cached += key.shape[0] * key.shape[1] * key.shape[2]
    return out[:, None, :, :], None


def install(model: torch.nn.Module) -> None:
    """Register the function (and SDPA's mask format for it) and switch ``model`` to it."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(ATTN_NAME, sparse_attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTN_NAME, sdpa_mask)
    if model.config._attn_implementation != ATTN_NAME:
        model.set_attn_implementation(ATTN_NAME)
