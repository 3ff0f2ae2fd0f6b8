"""The GPU's attention kernels: ``TorchOps`` (torch on any device: ``relevancy.batched_inner_product`` /
``bound_inner_product`` and ``selection.topk_rows``) and ``TritonOps`` (the fused Triton kernels of
``triton/attention.py``, loaded only when asked for: a CPU-only install never imports Triton). The same operations
under the same names as ``kernels/cpu/attention.py``; see it for the relevancy kinds and shapes."""
from __future__ import annotations

import numpy as np
import torch

from ragserve.kernels.contract import Relevancy, Selection
from ragserve.kernels.gpu import relevancy as gpu_rel
from ragserve.kernels.gpu import selection as gpu_sel

NEG_INF = float("-inf")


class TorchOps:
    """torch tensors on any device; scores in f32 (matrix products: the summation order is the library's)."""

    name = "torch"

    @staticmethod
    def asarray(x) -> torch.Tensor:
        return x if isinstance(x, torch.Tensor) else torch.from_numpy(np.asarray(x))

    @staticmethod
    def cat(arrays, axis: int):
        return torch.cat(arrays, dim=axis)

    @staticmethod
    def take(x, idx):
        return torch.gather(x, -1, idx)

    @staticmethod
    def copy(x):
        return x.clone()

    @staticmethod
    def grow(store, used: int, units: int):
        out = torch.empty(store.shape[:-2] + (units, store.shape[-1]), dtype=store.dtype, device=store.device)
        out[..., :used, :] = store[..., :used, :]
        return out

    @staticmethod
    def full_like(x, value: float):
        return torch.full(x.shape, value, dtype=torch.float32, device=x.device)

    @staticmethod
    def unit_minmax(keys, unit: int, u0: int):
        k = keys[..., u0 * unit:, :]
        n = k.shape[-2]
        full = n // unit * unit
        shape = k.shape[:-2] + (-1, unit, k.shape[-1])
        lo, hi = k[..., :full, :].reshape(shape).amin(-2), k[..., :full, :].reshape(shape).amax(-2)
        if full < n:  # the last unit holds fewer tokens
            lo = torch.cat([lo, k[..., full:, :].amin(-2, keepdim=True)], -2)
            hi = torch.cat([hi, k[..., full:, :].amax(-2, keepdim=True)], -2)
        return lo, hi

    @staticmethod
    def unit_mean(keys, unit: int, u0: int):
        k = keys[..., u0 * unit:, :].float()
        n = k.shape[-2]
        pad = -n % unit
        s = torch.nn.functional.pad(k, (0, 0, 0, pad)).reshape(k.shape[:-2] + (-1, unit, k.shape[-1])).sum(-2)
        counts = (n - torch.arange(s.shape[-2], device=k.device) * unit).clamp(max=unit).float()
        return s / counts[:, None]

    def relevancy(self, kind: str, plan: tuple[int, int, int], **arrays) -> Relevancy:
        return Relevancy(getattr(self, kind)(**arrays))

    def dots_max(self, q, keys, unit: int = 1, key_valid=None):
        tok = gpu_rel.batched_inner_product(q, keys).amax(-2)
        return self._unit_max(self._masked(tok, key_valid), unit)

    def dots_wrelu(self, q, w, keys, key_valid=None):
        dots = gpu_rel.batched_inner_product(q, keys).clamp_(min=0)
        return self._masked(torch.matmul(w.float()[..., None, :], dots).squeeze(-2), key_valid)

    @staticmethod
    def bounds_max(q, lo, hi):
        return gpu_rel.bound_inner_product(q, lo, hi).amax(-2)

    @staticmethod
    def _masked(tok, key_valid):
        if key_valid is None:
            return tok
        return tok.masked_fill(~key_valid[:, None, :], NEG_INF)

    @staticmethod
    def _unit_max(tok, unit: int):
        if unit == 1:
            return tok
        pad = -tok.shape[-1] % unit
        t = torch.nn.functional.pad(tok, (0, pad), value=NEG_INF)
        return t.reshape(tok.shape[:-1] + (-1, unit)).amax(-1)

    @staticmethod
    def top_units(mid, k: int, offset: int):
        b, gs, m = mid.shape
        idx, _ = gpu_sel.topk_rows(mid.reshape(b * gs, m), k)
        return idx.reshape(b, gs, -1) + offset

    @staticmethod
    def gate_probs(scores, scale: float):
        return torch.softmax(scores.double() * scale, -1)

    @staticmethod
    def expand_units(top, keep, sink: int, local: int, num_units: int, unit: int, n: int) -> Selection:
        b, gs, _ = top.shape
        dev = top.device
        fixed = torch.cat([torch.arange(sink, device=dev), torch.arange(num_units - local, num_units, device=dev)])
        units = torch.cat([fixed.expand(b, gs, -1), top], -1)
        kept = torch.ones(units.shape, dtype=torch.bool, device=dev)
        if keep is not None:
            kept[..., fixed.numel():] = keep
        units, order = torch.sort(units, dim=-1, stable=True)
        kept = torch.gather(kept, -1, order)
        tokens = (units[..., None] * unit + torch.arange(unit, device=dev)).reshape(b, gs, -1)
        valid = (tokens < n) & kept.repeat_interleave(unit, -1)
        return Selection(tokens.clamp(max=n - 1), valid, top)

    @staticmethod
    def everything(b: int, n: int, device=None) -> Selection:
        tokens = torch.arange(n, device=device).expand(b, 1, n)
        return Selection(tokens, torch.ones(tokens.shape, dtype=torch.bool, device=device),
                         torch.zeros((b, 1, 0), dtype=torch.int64, device=device))

    @staticmethod
    def attend_selected(q, keys, values, tokens, valid, scale: float, key_valid=None):
        b, hq, d = q.shape
        g = keys.shape[1]
        tok = tokens.expand(b, g, -1)
        ok = valid.expand(b, g, -1)
        if key_valid is not None:
            ok = ok & torch.gather(key_valid[:, None, :].expand(b, g, -1), -1, tok)
        idx = tok[..., None].expand(-1, -1, -1, keys.shape[-1])
        kk, vv = torch.gather(keys, 2, idx), torch.gather(values, 2, idx)
        qg = q.reshape(b, g, hq // g, d)
        out = torch.nn.functional.scaled_dot_product_attention(qg, kk, vv, attn_mask=ok[:, :, None, :], scale=scale)
        return out.reshape(b, hq, d)

    @staticmethod
    def attend_dense(q, keys, values, scale: float, key_valid=None):
        mask = None if key_valid is None else key_valid[:, None, None, :]
        out = torch.nn.functional.scaled_dot_product_attention(q[:, :, None, :], keys, values, attn_mask=mask,
                                                               scale=scale, enable_gqa=True)
        return out[:, :, 0, :]


class TritonOps(TorchOps):
    """torch tensors with the fused Triton kernels (``kernels.gpu.triton.attention``) and the bucket (or radix)
    select (``kernels.gpu.triton.selection``) where the shapes qualify, torch elsewhere. The selected units (``top``)
    come unranked (``sort_top=False``: by position) and the tokens sink, local, then top: attention does not need
    them ranked, and a sort costs a launch. No stage syncs with the host: a whole step can be one CUDA graph."""

    name = "triton"

    def __init__(self, settings=None, sort_top: bool = False) -> None:
        from ragserve.kernels.gpu.triton import attention as attention_triton

        self.k = attention_triton
        self.settings = settings or attention_triton.DEFAULT
        self.sort_top = sort_top

    def _fits(self, q, key_valid=None) -> bool:
        return key_valid is None and self.k.supported(q.shape[-1], q.shape[-2])

    def dots_max(self, q, keys, unit: int = 1, key_valid=None):
        if self._fits(q, key_valid) and unit & (unit - 1) == 0 and unit <= 1024:
            return self.k.dot_max_scores(q, keys, unit, self.settings)
        return super().dots_max(q, keys, unit, key_valid)

    def dots_wrelu(self, q, w, keys, key_valid=None):
        if self._fits(q, key_valid):
            return self.k.wrelu_scores(q, w, keys, self.settings)
        return super().dots_wrelu(q, w, keys, key_valid)

    def bounds_max(self, q, lo, hi):
        if self._fits(q):
            return self.k.bound_max_scores(q, lo, hi, self.settings)
        return super().bounds_max(q, lo, hi)

    def top_units(self, mid, k: int, offset: int):
        b, gs, m = mid.shape
        if self.settings.select == "bucket":  # it counts from the offset itself: one launch fewer
            idx, _ = gpu_sel.topk_rows_bucket(mid.reshape(b * gs, m), k, sort=self.sort_top, offset=offset)
            return idx.reshape(b, gs, -1)
        idx, _ = gpu_sel.topk_rows_radix(mid.reshape(b * gs, m), k, sort=self.sort_top)
        return idx.reshape(b, gs, -1) + offset

    def expand_units(self, top, keep, sink: int, local: int, num_units: int, unit: int, n: int) -> Selection:
        """The sink, local and top units' tokens in one launch (``expand_kernel``), in that order."""
        tokens, valid = self.k.expand_units(top, keep, sink, local, num_units, unit, n)
        return Selection(tokens, valid, top)

    def attend_selected(self, q, keys, values, tokens, valid, scale: float, key_valid=None):
        if self._fits(q.reshape(q.shape[0], keys.shape[1], -1, q.shape[-1]), key_valid):
            return self.k.sparse_decode(q, keys, values, tokens, valid, scale, self.settings)
        return super().attend_selected(q, keys, values, tokens, valid, scale, key_valid)


TORCH = TorchOps()
