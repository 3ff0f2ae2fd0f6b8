"""The BM25 arithmetic of ``indexer/FORMAT.md``, written once (Lucene 9 ``BM25Similarity``).

Every backend takes its per-query constants from here, so the same f32 values enter every kernel.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from indexer.norms import LENGTH_TABLE_F32

DEFAULT_K1 = 0.9
DEFAULT_B = 0.4


def avgdl_f32(sum_total_tf: int, doc_count: int) -> np.float32:
    return np.float32(float(sum_total_tf) / float(doc_count)) if doc_count else np.float32(1.0)


def idf_f32(df: np.ndarray, doc_count: int) -> np.ndarray:
    """Lucene idf, computed in f64 and rounded to f32."""
    df = np.asarray(df, dtype=np.float64)
    return np.log1p((doc_count - df + 0.5) / (df + 0.5)).astype(np.float32)


def norm_cache(k1: float, b: float, avgdl: np.float32) -> np.ndarray:
    """``cache[i] = 1 / (k1 * ((1 - b) + b * LEN[i] / avgdl))``, every operation in f32, in that order."""
    k1_ = np.float32(k1)
    b_ = np.float32(b)
    one = np.float32(1.0)
    with np.errstate(divide="ignore"):
        inner = (one - b_) + (b_ * LENGTH_TABLE_F32) / np.float32(avgdl)
        return (one / (k1_ * inner)).astype(np.float32)


def check_params(k1: float, b: float) -> None:
    if not (math.isfinite(k1) and k1 > 0):
        raise ValueError(f"k1 must be a positive number, got {k1!r}")
    if not (math.isfinite(b) and 0.0 <= b <= 1.0):
        raise ValueError(f"b must be between 0 and 1, got {b!r}")


@dataclass(frozen=True)
class QueryTerms:
    """An analysed query: distinct term ids ascending, with their boost (count in the query) and weight."""

    term_ids: np.ndarray  # u32, ascending
    boosts: np.ndarray  # f32
    weights: np.ndarray  # f32, boost * idf
    unknown: tuple[str, ...] = ()

    def __len__(self) -> int:
        return int(self.term_ids.size)


def sum_is_exact(weights: np.ndarray, min_q: float = 0.0) -> bool:
    """True when the f64 sum of the query's f32 term scores is exact, so any summation order gives the same bits.

    Term scores lie in ``(smallest possible s, w)``; the smallest possible score uses tf=1 and the
    longest length bucket, bounded below by ``w * q / (1 + q)`` with ``min_q`` the smallest q.
    """
    if weights.size <= 1:
        return True
    w = weights.astype(np.float64)
    max_s = float(w.max())
    if min_q <= 0.0:
        return False
    min_s = float(w.min()) * min_q / (1.0 + min_q) * (1 - 1e-6)
    if min_s <= 0.0:
        return False
    ulp_min = 2.0 ** (math.frexp(min_s)[1] - 24)
    return weights.size * max_s < 2.0**53 * ulp_min
