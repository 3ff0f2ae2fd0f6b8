"""The attn_topk performance model (tools/fpga_model.py): its counters equal those the C-simulated kernel reports,
its expected top-k insertions match random-order scores, and the step model switches from on-chip to HBM keys."""
from __future__ import annotations

import numpy as np
import pytest

from ragserve.kernels.fpga.attention import STAT_NAMES, attn_topk
from tools import fpga_model as M


@pytest.mark.parametrize("mode,rows,heads,dim,keys,unit,k", [
    ("dots_wrelu", 2, 4, 40, 3000, 1, 300), ("bounds_max", 3, 2, 64, 500, 1, 40),
    ("dots_max", 1, 8, 16, 2000, 16, 20), ("dots_max", 2, 2, 24, 999, 64, 0)])
def test_model_counts_equal_simulated_counts(mode, rows, heads, dim, keys, unit, k):
    rng = np.random.default_rng(keys)
    q = rng.standard_normal((rows, heads, dim), dtype=np.float32)
    lo = rng.standard_normal((rows, keys, dim), dtype=np.float32)
    units = -(-keys // unit)
    r = attn_topk(mode, q, lo, unit, 1, units - 2, k, w=rng.random((rows, heads), dtype=np.float32),
                  keys_hi=lo + 1 if mode == "bounds_max" else None)
    predicted = M.attn_counts(mode, rows, heads, dim, keys, unit, 1, units - 2, k)
    assert M.ATTN_STATS == STAT_NAMES
    for name in M.ATTN_PREDICTED:
        i = M.ATTN_STATS.index(name)
        assert np.array_equal(r["stats"][:, i], predicted[:, i]), name
    if k:  # random scores in random order: insertions near the expectation
        got = r["stats"][:, M.ATTN_STATS.index("inserts")].mean()
        assert got == pytest.approx(M.expected_inserts(units - 3, k), rel=0.25)
    assert M.attn_kernel_cycles(predicted, heads, dim) >= predicted[:, 1].sum()  # one head a cycle at best


def test_step_model_keys_on_chip_then_in_hbm():
    small = M.attn_step_model("seer-topk", 1 << 20)
    assert small["resident"] and small["bytes"] == 8 * (1 << 14) * 128 * 2
    big = M.attn_step_model("quest", 1 << 20)
    assert not big["resident"] and big["read_s"] == pytest.approx(big["bytes"] / 460e9)
    # DSA's indexer at 64 heads x 128 is compute-bound on the DSPs whatever the memory
    dsa = M.attn_step_model("dsa", 1 << 20)
    assert dsa["bound"] == "compute" and dsa["seconds"] > dsa["read_s"]
    assert M.attn_step_model("dsa", 1 << 20, batch=8)["seconds"] > 7 * dsa["compute_s"]
