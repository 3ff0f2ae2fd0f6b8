"""The Triton kernels of the sparse-attention GPU path (radix select, fused relevancy, sparse decode): exact
selections with ties by position, and outputs equal to the torch path; interpreted on the CPU here, compiled on a
CUDA device (marked ``gpu``)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[1]


def test_triton_attention_kernels_interpreted():
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=path)
    r = subprocess.run([sys.executable, "-m", "tests.attention_triton_checks", "cpu"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "\"bucket overflow 2x3000 k=700\": true" in r.stdout
    assert '"radix 2x9000 k=2048": true' in r.stdout and '"quest selection": true' in r.stdout
    assert '"lserve selection = brute force on its scores": true' in r.stdout


@pytest.mark.gpu
def test_triton_attention_kernels_on_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from tests.attention_triton_checks import main
    assert main("cuda") == 0


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["dsa", "quest", "lserve", "seer-topk", "seer-threshold"])
def test_check_command_on_cuda(method):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from ragserve.attention.check import CheckSpec, run_check

    full = run_check(CheckSpec(method=method, context=20000, budget=20000, device="cuda", threshold=0.0))
    assert full["selected"] == 20000 and full["max_abs_err"] <= 1e-5 and full["mass_recall"] == pytest.approx(1.0)
    cpu = run_check(CheckSpec(method=method, context=20000, budget=2048, device="cpu"))
    gpu = run_check(CheckSpec(method=method, context=20000, budget=2048, device="cuda"))
    assert gpu["selected"] == cpu["selected"] and gpu["mass_recall"] == pytest.approx(cpu["mass_recall"], abs=1e-3)
    bf16 = run_check(CheckSpec(method=method, context=200000, budget=2048, device="cuda", dtype="bfloat16",
                               heads=32, kv_heads=8, head_dim=128))
    assert bf16["selected"] <= 2048 and 0 < bf16["mass_recall"] < 1
