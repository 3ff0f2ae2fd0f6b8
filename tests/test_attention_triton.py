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
    assert '"radix 2x9000 k=2048": true' in r.stdout and '"quest selection": true' in r.stdout


@pytest.mark.gpu
def test_triton_attention_kernels_on_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from tests.attention_triton_checks import main
    assert main("cuda") == 0
