"""Host side of the ``attn_topk`` FPGA kernel (``hls_bm25/attn_topk.cpp``): packs a launch's queries and keys as the
kernel reads them from HBM and calls its C simulation (``fpga-sim``), the inner-product + reduction + top-k of
sparse attention. Only the top-k unit ids (and the unit scores, a verification port) come back. ``FpgaSimOps`` are
the attention kernels of ``kernels/cpu/attention.py`` with relevancy and selection fused in this kernel.
"""
from __future__ import annotations

import ctypes
import threading

import numpy as np

from ragserve.kernels.contract import AttentionError, Relevancy
from ragserve.kernels.cpu.attention import CpuOps
from ragserve.kernels.fpga.csim.library import load_kernel

# Mirrors hls_bm25/attn_topk.h.
MAX_DIM = 256
MAX_HEADS = 128
MAX_K = 2048
MAX_UNIT = 1024
WORD_LANES = 16
MODES = {"dots_max": 0, "dots_wrelu": 1, "bounds_max": 2}
STAT_NAMES = ("key_words", "dots", "units", "candidates", "inserts", "results")

_f32p = np.ctypeslib.ndpointer(np.float32, flags="C_CONTIGUOUS")
_u32p = np.ctypeslib.ndpointer(np.uint32, flags="C_CONTIGUOUS")
_ARGTYPES = [_f32p, _f32p, _f32p, _f32p, _f32p, _u32p, _f32p, _u32p, _u32p] + [ctypes.c_uint32] * 9
_LOCK = threading.Lock()  # the kernel's query buffers are static (on-chip RAM): one launch at a time


class FpgaLimitError(ValueError):
    """The launch exceeds what the kernel holds on chip (dim, heads, unit, k)."""


def _keys_image(keys: np.ndarray) -> np.ndarray:
    """[R, N, D] f32 keys with D zero-padded to whole 512-bit words, contiguous: the HBM image."""
    r, n, d = keys.shape
    dp = -(-d // WORD_LANES) * WORD_LANES
    out = np.zeros((r, n, dp), np.float32)
    out[..., :d] = keys
    return out


def attn_topk(mode: str, q: np.ndarray, keys: np.ndarray, unit: int, mid_start: int, mid_end: int, k: int,
              w: np.ndarray | None = None, keys_hi: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """One launch over ``R`` selection rows: q [R, h, D], keys [R, N, D] (bounds: lo, with ``keys_hi``), w [R, h].

    Returns ``scores`` [R, U] (every unit), ``ids`` [R, k] int64 and ``top`` [R, k] (the best k units of
    [mid_start, mid_end), score desc then unit asc) and ``stats`` [R, 6]; with k = 0 no unit is selected.
    """
    q = np.ascontiguousarray(q, dtype=np.float32)
    r, heads, dim = q.shape
    num_keys = keys.shape[1]
    num_units = -(-num_keys // unit)
    if not 1 <= dim <= MAX_DIM or not 1 <= heads <= MAX_HEADS or not 1 <= unit <= MAX_UNIT:
        raise FpgaLimitError(f"the FPGA kernel takes dim <= {MAX_DIM}, heads <= {MAX_HEADS} and units of <= "
                             f"{MAX_UNIT} keys (got dim {dim}, heads {heads}, unit {unit})")
    if not 0 <= k <= MAX_K:
        raise FpgaLimitError(f"the FPGA kernel's top-k holds at most {MAX_K} units, asked for {k}")
    if not 0 <= mid_start <= mid_end <= num_units or k > mid_end - mid_start:
        raise FpgaLimitError(f"bad unit range [{mid_start}, {mid_end}) for k={k} of {num_units} units")
    lo = _keys_image(np.asarray(keys, dtype=np.float32))
    hi = _keys_image(np.asarray(keys_hi, dtype=np.float32)) if keys_hi is not None else np.zeros(1, np.float32)
    wts = np.ascontiguousarray(w, dtype=np.float32) if w is not None else np.zeros(1, np.float32)
    kk = max(k, 1)  # the kernel's list needs one slot; an empty range offers it nothing
    end = mid_end if k > 0 else mid_start
    scores = np.empty((r, num_units), np.float32)
    ids = np.zeros((r, kk), np.uint32)
    top = np.zeros((r, kk), np.float32)
    counts = np.zeros(r, np.uint32)
    stats = np.zeros((r, len(STAT_NAMES)), np.uint32)
    lib = load_kernel("attn_topk", _ARGTYPES)
    with _LOCK:
        lib.attn_topk(q, wts, lo, hi, scores, ids, top, counts, stats, r, heads, dim, num_keys, unit,
                      MODES[mode], mid_start, end, kk)
    return {"scores": scores, "ids": ids[:, :k].astype(np.int64), "top": top[:, :k], "counts": counts,
            "stats": stats}


class FpgaSimOps(CpuOps):
    """The CPU's arrays and kernels, with relevancy and selection fused in the FPGA kernel's C simulation
    (``hls_bm25/attn_topk.cpp``): the same f32 operations in the same order, so the same bits as ``CpuOps``."""

    name = "fpga-sim"

    def relevancy(self, kind: str, plan: tuple[int, int, int], **arrays) -> Relevancy:
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


FPGA_SIM = FpgaSimOps()
