"""The CPU's attention kernels (``CpuOps``, numpy): each stage of a sparse-attention method on the fixed-order
relevancy kernels of ``relevancy`` and ``selection.topk_rows``. Every device's ``attention`` module offers the same
operations under the same names (``kernels/gpu/attention.py``, ``kernels/fpga/attention.py``); the methods of
``ragserve.attention`` pick one through ``kernels.registry.attention_ops``.

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

from ragserve.kernels.contract import Relevancy, Selection
from ragserve.kernels.cpu import relevancy as cpu_rel
from ragserve.kernels.cpu import selection as cpu_sel

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


CPU = CpuOps()
