"""Sparse attention methods (ragserve.attention) on the CPU kernels (numpy) and the GPU path (torch, here on torch's
CPU device): exactness at a budget covering every token, selections against a brute-force reference with ties,
incremental prepare, the FPGA kernel's C simulation bit for bit against the CPU, and the check command."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from ragserve.attention import AttentionError, get_method, method_names
from ragserve.attention.check import CheckSpec, run_check
from ragserve.kernels.fpga.attention import FPGA_SIM
from tests.conftest import REPO
from tests.serverproc import run_main

SPARSE = [m for m in method_names() if m != "dense"]
PATHS = ["numpy", "torch"]


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def cache(b: int, hq: int, g: int, n: int, d: int, seed: int = 0, integers: bool = False):
    rng = np.random.default_rng(seed)
    if integers:  # small integers: every score is exact in any summation order, and ties are common
        q = rng.integers(-2, 3, (b, hq, d)).astype(np.float32)
        k = rng.integers(-2, 3, (b, g, n, d)).astype(np.float32)
    else:
        q = rng.standard_normal((b, hq, d), dtype=np.float32)
        k = rng.standard_normal((b, g, n, d), dtype=np.float32)
    v = rng.standard_normal((b, g, n, d), dtype=np.float32)
    return q, k, v


def on(path: str, *arrays):
    return arrays if path == "numpy" else tuple(torch.from_numpy(a) for a in arrays)


def as_np(x) -> np.ndarray:
    return x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def reference_attention(q, k, v, scale) -> np.ndarray:
    """Dense softmax attention in f64, GQA by repeating KV heads."""
    b, hq, d = q.shape
    g = k.shape[1]
    kk = np.repeat(k.astype(np.float64), hq // g, axis=1)
    vv = np.repeat(v.astype(np.float64), hq // g, axis=1)
    logits = np.einsum("bhd,bhnd->bhn", q.astype(np.float64), kk) * scale
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhn,bhnd->bhd", p, vv)


# -- exactness at full budget -----------------------------------------------------------------------
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("method", method_names())
@pytest.mark.parametrize("shape", [(2, 8, 2, 301, 32), (1, 4, 4, 130, 16), (1, 6, 1, 77, 8)])
def test_full_budget_equals_dense(method, path, shape):
    b, hq, g, n, d = shape
    q, k, v = cache(b, hq, g, n, d, seed=n)
    scale = d ** -0.5
    m = get_method(method, budget=n, threshold=0.0)
    out, sel, _ = m.step(*on(path, q, k, v), scale)
    dense, _, _ = get_method("dense").step(*on(path, q, k, v), scale)
    assert np.abs(as_np(out) - as_np(dense)).max() <= 1e-5
    assert np.abs(as_np(out) - reference_attention(q, k, v, scale)).max() <= 1e-5
    assert (as_np(sel.counts()) == n).all()


@pytest.mark.parametrize("method", SPARSE)
def test_small_budget_attends_fewer_tokens_and_differs(method):
    q, k, v = cache(1, 8, 2, 2000, 32, seed=3)
    m = get_method(method, budget=512, threshold=0.0)
    out, sel, _ = m.step(q, k, v, 32 ** -0.5)
    counts = as_np(sel.counts())
    assert counts.max() <= 512 and counts.min() >= 512 - m.unit
    assert np.abs(out - reference_attention(q, k, v, 32 ** -0.5)).max() > 1e-3


def test_bfloat16_torch_path_runs_and_stays_close():
    q, k, v = cache(1, 8, 2, 300, 64, seed=5)
    tq, tk, tv = (torch.from_numpy(x).to(torch.bfloat16) for x in (q, k, v))
    ref = reference_attention(*(x.float().numpy() for x in (tq, tk, tv)), 0.125)
    for method in SPARSE:
        out, _, _ = get_method(method, budget=300, threshold=0.0).step(tq, tk, tv, 0.125)
        assert out.dtype == torch.bfloat16
        assert np.abs(out.float().numpy() - ref).max() < 2e-2


# -- selections against brute force -----------------------------------------------------------------
def brute_unit_scores(method: str, q, k, unit: int) -> np.ndarray:
    """Unit scores [B, G, U] in f64 straight from the definitions."""
    b, hq, d = q.shape
    g, n = k.shape[1], k.shape[2]
    qg = q.reshape(b, g, hq // g, d).astype(np.float64)
    k64 = k.astype(np.float64)
    u = math.ceil(n / unit)
    out = np.zeros((b, g, u))
    for i in range(b):
        for j in range(g):
            dots = qg[i, j] @ k64[i, j].T  # [g, n]
            for p in range(u):
                sl = slice(p * unit, min(n, (p + 1) * unit))
                if method == "dsa":
                    out[i, j, p] = (np.maximum(dots[:, p], 0) / qg.shape[2]).sum()
                elif method == "lserve":
                    out[i, j, p] = dots[:, sl].max()
                elif method == "quest":
                    lo, hi = k64[i, j, sl].min(0), k64[i, j, sl].max(0)
                    out[i, j, p] = np.maximum(qg[i, j] * lo, qg[i, j] * hi).sum(-1).max()
                else:  # seer: the block's mean key
                    out[i, j, p] = (qg[i, j] @ k64[i, j, sl].mean(0)).max()
    return out


def brute_selection(scores: np.ndarray, sink: int, local: int, k: int) -> np.ndarray:
    """The k best middle units of each row, by (score desc, unit asc)."""
    b, g, u = scores.shape
    out = np.zeros((b, g, k), np.int64)
    for i in range(b):
        for j in range(g):
            mid = range(sink, u - local)
            out[i, j] = sorted(mid, key=lambda p: (-scores[i, j, p], p))[:k]
    return out


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("method", SPARSE)
@pytest.mark.parametrize("budget", [192, 384, 1024])
def test_selection_equals_brute_force_with_ties(method, path, budget):
    n = 1280  # whole blocks of 64: the seer means are exact
    q, k, v = cache(2, 8, 2, n, 16, seed=budget, integers=True)
    m = get_method(method, budget=budget, sink=16, local=64, threshold=0.0)
    index = m.prepare(on(path, k)[0])
    tq, tk = on(path, q, k)
    rel = m.relevancy(index, tq, tk)
    sel = m.retrieval(rel, n)
    unit = m.unit
    scores = brute_unit_scores(method.removesuffix("-topk").removesuffix("-threshold"), q, k, unit)
    np.testing.assert_allclose(as_np(rel.scores), scores, rtol=0, atol=1e-6)
    sink, local, kk = m.plan(n)
    ties = sum(len(np.unique(r)) < len(r) for r in scores.reshape(-1, scores.shape[-1]))
    assert ties > 0  # the data exercise the tie rule
    assert np.array_equal(as_np(sel.top), brute_selection(scores, sink, local, kk))
    expect_units = [sorted(set(range(sink)) | set(range(scores.shape[-1] - local, scores.shape[-1])) | set(t))
                    for t in brute_selection(scores, sink, local, kk).reshape(-1, kk)]
    tokens, valid = as_np(sel.tokens).reshape(len(expect_units), -1), as_np(sel.valid).reshape(len(expect_units), -1)
    for row, units in enumerate(expect_units):
        expect = [p * unit + t for p in units for t in range(unit) if p * unit + t < n]
        assert tokens[row][valid[row]].tolist() == expect


def test_seer_threshold_keeps_only_blocks_over_the_threshold():
    q, k, v = cache(1, 4, 1, 64 * 40, 16, seed=9)
    top = get_method("seer-topk", budget=64 * 20)
    _, sel_top, _ = top.step(q, k, v, 0.25)
    rel = top.relevancy(top.prepare(k), q, k)
    z = rel.scores[0, 0].astype(np.float64) * rel.scale
    probs = np.exp(z - z.max())
    probs /= probs.sum()
    picked = sel_top.top[0, 0]
    threshold = float(np.median(probs[picked]))
    thr = get_method("seer-threshold", budget=64 * 20, threshold=threshold)
    _, sel_thr, _ = thr.step(q, k, v, 0.25)
    kept = [p for p in picked if probs[p] >= threshold]
    assert 0 < len(kept) < len(picked)
    assert sel_thr.counts()[0, 0] == (len(kept) + 2) * 64  # + the sink and local blocks
    assert np.array_equal(sel_thr.top, sel_top.top)


def test_shared_index_selection_serves_every_group():
    """A DSA indexer with one index key per token (Gi = 1, as DeepSeek's) selects once for all KV groups."""
    q, k, v = cache(1, 8, 4, 400, 16, seed=2)

    class OneIndex:
        def index_keys(self, ops, keys):
            return ops.copy(keys[:, :1])

        def index_queries(self, ops, qq, groups):
            return qq[:, None, :3], ops.full_like(qq[:, None, :3, 0], 0.5)

    for path in PATHS:
        m = get_method("dsa", budget=200)
        m.indexer = OneIndex()
        out, sel, _ = m.step(*on(path, q, k, v), 0.25)
        assert tuple(sel.tokens.shape)[:2] == (1, 1) and as_np(sel.counts()).tolist() == [[200]]
        full = get_method("dsa", budget=400)
        full.indexer = OneIndex()
        out_full, _, _ = full.step(*on(path, q, k, v), 0.25)
        assert np.abs(as_np(out_full) - reference_attention(q, k, v, 0.25)).max() <= 1e-5


# -- prepare: a decode step's update equals a rebuild ---------------------------------------------------
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("method", SPARSE)
def test_incremental_prepare_equals_rebuild(method, path):
    _, k, _ = cache(1, 4, 2, 300, 8, seed=1)
    m = get_method(method, budget=256)
    index = m.prepare(on(path, k[:, :, :100])[0])
    for n in range(101, 300, 7):
        index = m.prepare(on(path, k[:, :, :n])[0], index)
        full = m.prepare(on(path, k[:, :, :n])[0])
        assert index.n == full.n == n
        for name in full.arrays:
            assert np.array_equal(as_np(index.arrays[name]), as_np(full.arrays[name]))


# -- FPGA kernel (C simulation) against the CPU -------------------------------------------------------
@pytest.mark.parametrize("method", SPARSE)
@pytest.mark.parametrize("shape", [(2, 8, 2, 1500, 40, 256), (1, 4, 1, 700, 64, 200), (1, 3, 3, 513, 5, 2000)])
def test_fpga_sim_equals_cpu_bit_for_bit(method, shape):
    b, hq, g, n, d, budget = shape
    q, k, v = cache(b, hq, g, n, d, seed=n)
    cpu = get_method(method, budget=budget, sink=16, local=16, threshold=1e-3)
    fpga = get_method(method, budget=budget, sink=16, local=16, threshold=1e-3, ops=FPGA_SIM)
    index = cpu.prepare(k)
    rc, rf = cpu.relevancy(index, q, k), fpga.relevancy(index, q, k)
    assert np.array_equal(rc.scores.view(np.uint32), rf.scores.view(np.uint32))
    sc, sf = cpu.retrieval(rc, n), fpga.retrieval(rf, n)
    assert rc.top is None and rf.top is not None  # the kernel selected, the CPU ranked afterwards
    assert np.array_equal(sc.top, sf.top) and np.array_equal(sc.tokens, sf.tokens)
    assert np.array_equal(sc.valid, sf.valid)
    oc, _, _ = cpu.step(q, k, v, 0.3)
    of, _, _ = fpga.step(q, k, v, 0.3)
    assert np.array_equal(oc, of)


def test_fpga_sim_refuses_what_the_kernel_cannot_hold():
    q, k, v = cache(1, 2, 1, 5000, 8)
    with pytest.raises(AttentionError, match="at most 2048"):
        get_method("dsa", budget=3000, ops=FPGA_SIM).step(q, k, v, 0.3)


# -- settings -----------------------------------------------------------------------------------------
def test_bad_settings_raise():
    with pytest.raises(AttentionError, match="unknown attention method"):
        get_method("nope")
    q, k, v = cache(1, 2, 1, 200, 8)
    m = get_method("seer-topk", budget=150)  # a budget covering the context needs no room for a choice
    assert m.step(q[:, :, :], k[:, :, :150], v[:, :, :150], 0.3)[1].counts().tolist() == [[150]]
    with pytest.raises(AttentionError, match="below 192 tokens"):
        m.step(q, k, v, 0.3)
    with pytest.raises(AttentionError, match="below 192 tokens"):
        m.check_budget()
    with pytest.raises(AttentionError, match="threshold"):
        get_method("seer-threshold", threshold=2.0)
    with pytest.raises(AttentionError):
        get_method("quest", page_sise=16)


# -- the check command ----------------------------------------------------------------------------------
def test_check_full_budget_is_exact_and_small_budget_is_not():
    full = run_check(CheckSpec(method="quest", context=3000, budget=3000))
    assert full["selected"] == 3000 and full["mass_recall"] == pytest.approx(1.0)
    assert full["max_abs_err"] <= 1e-5
    small = run_check(CheckSpec(method="quest", context=3000, budget=512))
    assert small["selected"] <= 512 and small["mass_recall"] < 1.0 and small["max_abs_err"] > 1e-4
    for stage in ("prepare", "relevancy", "retrieval", "apply"):
        assert small[stage] >= 0.0


def test_check_command_json_and_bad_arguments():
    cmd = [sys.executable, "-m", "ragserve", "attention", "check"]
    ok = subprocess.run(cmd + ["--method", "dsa", "--context", "4096", "--budget", "512", "--heads", "4",
                               "--kv-heads", "2", "--head-dim", "32", "--device", "fpga-sim", "--seed", "3",
                               "--json"], capture_output=True, text=True, cwd=REPO)
    assert ok.returncode == 0, ok.stderr
    out = json.loads(ok.stdout)
    for key in ("method", "context", "budget", "selected", "max_abs_err", "mass_recall", "prepare", "relevancy",
                "retrieval", "apply"):
        assert key in out
    assert out["method"] == "dsa" and out["context"] == 4096 and out["selected"] == 512
    assert 512 / 4096 < out["mass_recall"] < 1.0
    for bad in (["--method", "quest", "--context", "0", "--budget", "5"],
                ["--method", "quest", "--context", "100", "--budget", "5"],
                ["--method", "quest", "--context", "100", "--budget", "100", "--heads", "6", "--kv-heads", "4"],
                ["--method", "quest", "--context", "100", "--budget", "100", "--device", "tpu"]):
        r = run_main(*cmd[3:], *bad, "--json")  # in this process: the same parsing and exit, no interpreter start
        assert r.returncode == 2 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, (bad, r.stderr)
