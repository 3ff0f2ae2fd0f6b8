"""The kernels each attention stage runs, under the same names on every device: ``CpuOps`` (numpy, the fixed-order
CPU relevancy kernels of ``kernels.cpu.relevancy`` and ``kernels.cpu.selection.topk_rows``) and ``TorchOps`` (torch
on any device: ``kernels.gpu.relevancy`` and ``kernels.gpu.selection.topk_rows``).

Relevancy comes in three kinds, the reductions an inner-product engine feeds (the FPGA kernel's modes):
- ``dots_max``: per token the largest ``q_h . k`` over the group's query heads, then the largest over each unit's
  tokens (LServe's page score with units of a page, SeerAttention's pooled-key gate with units of one pooled key);
- ``dots_wrelu``: per token ``sum_h w_h * ReLU(q_h . k)`` over index heads, in head order (DSA's indexer);
- ``bounds_max``: per page the largest over heads of ``sum_d max(q_d * lo_d, q_d * hi_d)`` (Quest's bound).
Shapes: q [B, Gs, h, D] (h query or index heads per selection group), keys [B, Gs, N, D], unit scores [B, Gs, U].
"""
from __future__ import annotations

import numpy as np
import torch

from ragserve.attention.common import AttentionError, Relevancy, Selection
from ragserve.kernels.cpu import relevancy as cpu_rel
from ragserve.kernels.cpu import selection as cpu_sel
from ragserve.kernels.gpu import relevancy as gpu_rel
from ragserve.kernels.gpu import selection as gpu_sel

NEG_INF = float("-inf")
# Added to maxima: -0.0 + 0.0 = +0.0, so a max never depends on which of two equal zeros it kept (the FPGA
# kernel does the same), and the scores agree bit for bit.
ZERO = np.float32(0.0)


class CpuOps:
    """numpy arrays; every score in f32 by the fixed-order kernels (bf16 inputs are widened exactly)."""

    name = "cpu"

    # -- array helpers ----------------------------------------------------------------------------------
    @staticmethod
    def asarray(x) -> np.ndarray:
        if isinstance(x, torch.Tensor):
            x = x.detach().cpu()
            return (x.float() if x.dtype == torch.bfloat16 else x).numpy()
        return np.asarray(x)

    @staticmethod
    def cat(arrays, axis: int):
        return np.concatenate(arrays, axis=axis)

    @staticmethod
    def take(x, idx):
        return np.take_along_axis(x, idx, axis=-1)

    @staticmethod
    def copy(x):
        return np.array(x, copy=True)

    @staticmethod
    def grow(store, used: int, units: int):
        """A store of ``units`` units along axis -2 holding the first ``used`` of ``store``."""
        out = np.empty(store.shape[:-2] + (units, store.shape[-1]), store.dtype)
        out[..., :used, :] = store[..., :used, :]
        return out

    @staticmethod
    def full_like(x, value: float):
        return np.full(x.shape, value, np.float32)

    # -- prepare ----------------------------------------------------------------------------------------
    @staticmethod
    def unit_minmax(keys, unit: int, u0: int):
        """Elementwise min and max keys of units ``u0`` onwards: [B, G, U - u0, D] each (keys' dtype)."""
        k = keys[..., u0 * unit:, :]
        pad = -k.shape[-2] % unit
        lo = np.pad(k, [(0, 0)] * (k.ndim - 2) + [(0, pad), (0, 0)], constant_values=np.inf)
        hi = np.pad(k, [(0, 0)] * (k.ndim - 2) + [(0, pad), (0, 0)], constant_values=-np.inf)
        shape = k.shape[:-2] + (-1, unit, k.shape[-1])
        return lo.reshape(shape).min(-2), hi.reshape(shape).max(-2)

    @staticmethod
    def unit_mean(keys, unit: int, u0: int):
        """Mean key of units ``u0`` onwards (f32, in token order; the last unit over the tokens it holds)."""
        k = keys[..., u0 * unit:, :].astype(np.float32)
        n = k.shape[-2]
        pad = -n % unit
        s = np.pad(k, [(0, 0)] * (k.ndim - 2) + [(0, pad), (0, 0)])
        s = s.reshape(k.shape[:-2] + (-1, unit, k.shape[-1])).sum(-2)
        counts = np.minimum(unit, n - np.arange(s.shape[-2]) * unit).astype(np.float32)
        return s / counts[:, None]

    # -- relevancy --------------------------------------------------------------------------------------
    def relevancy(self, kind: str, plan: tuple[int, int, int], **arrays) -> Relevancy:
        """Unit scores of one kind (see the module doc); ``plan`` (sink, local, k) is for devices that fuse the
        selection, which these kernels do not."""
        return Relevancy(getattr(self, kind)(**arrays))

    @staticmethod
    def _rows(q, keys):
        b, gs = q.shape[:2]
        return [(i, j) for i in range(b) for j in range(gs)], b, gs

    def dots_max(self, q, keys, unit: int = 1, key_valid=None):
        q, keys = self.asarray(q), self.asarray(keys)
        rows, b, gs = self._rows(q, keys)
        n = keys.shape[-2]
        tok = np.empty((b, gs, n), np.float32)
        for i, j in rows:
            tok[i, j] = cpu_rel.inner_product_tree(q[i, j], keys[i, j]).max(0)
        return self._unit_max(self._masked(tok + ZERO, key_valid), unit)

    def dots_wrelu(self, q, w, keys, key_valid=None):
        q, w, keys = self.asarray(q), self.asarray(w).astype(np.float32), self.asarray(keys)
        rows, b, gs = self._rows(q, keys)
        out = np.empty((b, gs, keys.shape[-2]), np.float32)
        for i, j in rows:
            dots = cpu_rel.inner_product_tree(q[i, j], keys[i, j])
            acc = np.zeros(dots.shape[1], np.float32)
            for h in range(dots.shape[0]):  # head order: the FPGA's reduction unit adds in this order
                acc = acc + w[i, j, h] * np.maximum(dots[h], np.float32(0))
            out[i, j] = acc
        return self._masked(out, key_valid)

    def bounds_max(self, q, lo, hi):
        q, lo, hi = self.asarray(q), self.asarray(lo), self.asarray(hi)
        rows, b, gs = self._rows(q, lo)
        out = np.empty((b, gs, lo.shape[-2]), np.float32)
        for i, j in rows:
            out[i, j] = cpu_rel.bound_tree(q[i, j], lo[i, j], hi[i, j]).max(0)
        return out + ZERO

    @staticmethod
    def _masked(tok, key_valid):
        if key_valid is None:
            return tok
        return np.where(np.asarray(key_valid)[:, None, :], tok, np.float32(NEG_INF))

    @staticmethod
    def _unit_max(tok, unit: int):
        if unit == 1:
            return tok
        pad = -tok.shape[-1] % unit
        t = np.pad(tok, [(0, 0), (0, 0), (0, pad)], constant_values=NEG_INF)
        return t.reshape(tok.shape[:-1] + (-1, unit)).max(-1) + ZERO

    # -- retrieval --------------------------------------------------------------------------------------
    @staticmethod
    def top_units(mid, k: int, offset: int):
        """The k best units of each row of ``mid`` [B, Gs, M] (ties: the earlier unit), as unit numbers."""
        b, gs, m = mid.shape
        idx, _ = cpu_sel.topk_rows(mid.reshape(b * gs, m), k)
        return idx.reshape(b, gs, -1) + offset

    @staticmethod
    def gate_probs(scores, scale: float):
        z = scores.astype(np.float64) * scale
        z = np.exp(z - z.max(-1, keepdims=True))
        return z / z.sum(-1, keepdims=True)

    @staticmethod
    def expand_units(top, keep, sink: int, local: int, num_units: int, unit: int, n: int) -> Selection:
        b, gs, _ = top.shape
        fixed = np.concatenate([np.arange(sink), np.arange(num_units - local, num_units)]).astype(np.int64)
        units = np.concatenate([np.broadcast_to(fixed, (b, gs, fixed.size)), top], -1)
        kept = np.ones(units.shape, bool)
        if keep is not None:
            kept[..., fixed.size:] = keep
        order = np.argsort(units, -1, kind="stable")
        units, kept = np.take_along_axis(units, order, -1), np.take_along_axis(kept, order, -1)
        tokens = (units[..., None] * unit + np.arange(unit)).reshape(b, gs, -1)
        valid = (tokens < n) & np.repeat(kept, unit, -1)
        return Selection(np.minimum(tokens, n - 1), valid, top)

    @staticmethod
    def everything(b: int, n: int, device=None) -> Selection:
        tokens = np.broadcast_to(np.arange(n), (b, 1, n))
        return Selection(tokens, np.ones(tokens.shape, bool), np.zeros((b, 1, 0), np.int64))

    # -- apply ------------------------------------------------------------------------------------------
    def attend_selected(self, q, keys, values, tokens, valid, scale: float, key_valid=None):
        """Each query head over its group's tokens [B, Gs, S] (Gs = 1: the same tokens for every group)."""
        q, keys, values = self.asarray(q), self.asarray(keys), self.asarray(values)
        b, hq, d = q.shape
        g = keys.shape[1]
        tok = np.broadcast_to(tokens, (b, g, tokens.shape[-1]))
        ok = np.broadcast_to(valid, tok.shape)
        if key_valid is not None:
            ok = ok & np.take_along_axis(np.asarray(key_valid)[:, None, :], tok, -1)
        kk = np.take_along_axis(keys, tok[..., None], 2).astype(np.float32)
        vv = np.take_along_axis(values, tok[..., None], 2).astype(np.float32)
        qg = q.reshape(b, g, hq // g, d).astype(np.float32)
        logits = np.matmul(qg, kk.swapaxes(-1, -2)) * np.float32(scale)
        logits = np.where(ok[:, :, None, :], logits, np.float32(NEG_INF))
        p = np.exp(logits - logits.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        return np.matmul(p, vv).reshape(b, hq, d)

    def attend_dense(self, q, keys, values, scale: float, key_valid=None):
        n = keys.shape[-2]
        tokens = np.arange(n)[None, None, :]
        return self.attend_selected(q, keys, values, tokens, np.ones(tokens.shape, bool), scale, key_valid)


class FpgaSimOps(CpuOps):
    """The CPU's arrays and kernels, with relevancy and selection fused in the FPGA kernel's C simulation
    (``hls_bm25/attn_topk.cpp``): the same f32 operations in the same order, so the same bits as ``CpuOps``."""

    name = "fpga-sim"

    def relevancy(self, kind: str, plan: tuple[int, int, int], **arrays) -> Relevancy:
        from ragserve.kernels.fpga.attention import FpgaLimitError, attn_topk

        if arrays.get("key_valid") is not None:
            raise AttentionError("fpga-sim does not take a key mask")
        q = self.asarray(arrays["q"])
        keys = self.asarray(arrays["lo" if kind == "bounds_max" else "keys"])
        b, gs = q.shape[:2]
        unit = arrays.get("unit", 1)
        num_units = -(-keys.shape[-2] // unit)
        sink, local, k = plan
        try:
            r = attn_topk(kind, q.reshape(b * gs, *q.shape[2:]), keys.reshape(b * gs, *keys.shape[2:]), unit,
                          sink, num_units - local, k,
                          w=None if "w" not in arrays else self.asarray(arrays["w"]).reshape(b * gs, -1),
                          keys_hi=None if kind != "bounds_max" else self.asarray(arrays["hi"]).reshape(
                              b * gs, *keys.shape[2:]))
        except FpgaLimitError as e:
            raise AttentionError(str(e)) from None
        return Relevancy(r["scores"].reshape(b, gs, -1), top=r["ids"].reshape(b, gs, -1))


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
    """torch tensors with the fused Triton kernels (``kernels.gpu.attention_triton``) and the bucket (or radix)
    select (``kernels.gpu.select_triton``) where the shapes qualify, torch elsewhere. The selected units (``top``)
    come unranked (``sort_top=False``: by position) and the tokens sink, local, then top: attention does not need
    them ranked, and a sort costs a launch. No stage syncs with the host: a whole step can be one CUDA graph."""

    name = "triton"

    def __init__(self, settings=None, sort_top: bool = False) -> None:
        from ragserve.kernels.gpu import attention_triton

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


CPU = CpuOps()
FPGA_SIM = FpgaSimOps()
TORCH = TorchOps()
_TRITON: list = []


def ops_for(x):
    """The kernels for arrays like ``x``: numpy -> CPU; torch on a CUDA device -> Triton where it imports, else
    torch; torch elsewhere -> torch."""
    if not isinstance(x, torch.Tensor):
        return CPU
    if x.is_cuda:
        if not _TRITON:
            try:
                _TRITON.append(TritonOps())
            except ImportError:
                _TRITON.append(TORCH)
        return _TRITON[0]
    return TORCH
