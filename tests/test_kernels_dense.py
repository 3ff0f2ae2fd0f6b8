"""The dense relevancy (inner product) and row top-k of every device against a brute-force reference."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from ragserve.kernels.cpu import relevancy as cpu_rel
from ragserve.kernels.cpu import selection as cpu_sel
from ragserve.kernels.gpu import relevancy as gpu_rel
from ragserve.kernels.gpu import selection as gpu_sel


def brute_topk(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row sorted by (score desc, position asc), cut at k."""
    idx = np.array([sorted(range(scores.shape[1]), key=lambda j: (-scores[i, j], j))[:k]
                    for i in range(scores.shape[0])], dtype=np.int64).reshape(scores.shape[0], -1)
    return idx, np.take_along_axis(scores, idx, axis=1)


@pytest.mark.parametrize("k", [1, 5, 37, 200, 300])
def test_topk_rows_equal_brute_force_with_ties(k: int) -> None:
    rng = np.random.default_rng(k)
    scores = rng.integers(0, 12, size=(6, 200)).astype(np.float32)  # many ties, some at the k-th value
    scores[2] = 3.0  # a row of one value: positions decide
    scores[3, ::2] = -np.inf
    ref_i, ref_v = brute_topk(scores, k)
    ci, cv = cpu_sel.topk_rows(scores, k)
    gi, gv = gpu_sel.topk_rows(torch.from_numpy(scores), k)
    assert np.array_equal(ci, ref_i) and np.array_equal(cv, ref_v)
    assert np.array_equal(gi.numpy(), ref_i) and np.array_equal(gv.numpy(), ref_v)


def test_inner_product_devices_agree() -> None:
    rng = np.random.default_rng(0)
    q = rng.standard_normal((3, 64)).astype(np.float32)
    keys = rng.standard_normal((500, 64)).astype(np.float32)
    ref = q.astype(np.float64) @ keys.astype(np.float64).T
    c = cpu_rel.inner_product(q, keys)
    g = gpu_rel.inner_product(torch.from_numpy(q), torch.from_numpy(keys)).numpy()
    assert c.shape == g.shape == (3, 500) and c.dtype == g.dtype == np.float32
    np.testing.assert_allclose(c, ref, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(g, ref, rtol=1e-5, atol=1e-4)
    assert np.array_equal(cpu_sel.topk_rows(c, 10)[0], gpu_sel.topk_rows(torch.from_numpy(c), 10)[0].numpy())
