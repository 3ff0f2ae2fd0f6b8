"""scripts/bench_rag_scale.py at toy size on torch's CPU device: its whole logic (the synthetic layout, the query
mapping, the loops one question at a time, the served path with decodes batched, the batched decode, the FPGA
model, the gpu backend on torch's CPU device through Triton's interpreter) runs here in about a minute; the times
mean nothing, the report's shape and the answers' identity across paths do."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_bench_rag_scale_toy_run(tmp_path):
    pytest.importorskip("triton")
    out = tmp_path / "scale.json"
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_rag_scale.py"), "--quick", "--docs", "20000",
                           "--methods", "single,flare", "--backends", "cpu,gpu", "--device", "cpu", "--clients", "2",
                           "--limit", "2", "--warmup", "0", "--batch-rounds", "1", "--max-new-tokens", "12",
                           "--engine", "reference", "--workers", "1", "--deadline-s", "600",
                           "--workdir", str(tmp_path / "work"), "--out", str(out)],
                          capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(out.read_text())
    cells = {(c["method"], c["path"], c["backend"]): c for c in r["cells"]}
    assert not r["skipped"], r["skipped"]
    for method in ("single", "flare"):
        for backend in ("cpu", "gpu"):
            assert (method, "loop", backend) in cells and (method, "served", backend) in cells
            served = cells[(method, "served", backend)]
            assert served["batch"] == 2 and served["summary"]["questions"] == 2
            assert served["same_outputs_as_loop"] is True  # decodes batched, answers unchanged
            assert served["mean_decode_batch"] > 1.0
        assert cells[(method, "loop", "gpu")]["same_outputs_as_cpu"] is True
        assert cells[(method, "loop", "fpga")]["label"].startswith("fpga MODELLED")
    assert ("single", "batched", "cpu") in cells
    assert r["models"]["engine"] == "ReferenceEngine" and r["clients"] == 2
    assert "| single | served | 2 |" in r["table"]


def test_a_generator_directory_without_weights_gets_random_ones(tmp_path):
    """What a machine the weights cannot reach is given: the configuration and the tokenizer only."""
    import importlib.util
    import shutil

    from tests import rag_support as S

    for f in S.tiny_lm().iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, tmp_path / f.name)
    spec = importlib.util.spec_from_file_location("bench_rag_scale", ROOT / "scripts" / "bench_rag_scale.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    random = bench.load_generator(tmp_path, "cpu", "reference", 2)
    trained = bench.load_generator(S.tiny_lm(), "cpu", "reference", 2)
    assert random.name.startswith("random weights") and not trained.name.startswith("random")
    assert random.model.config.to_dict()["hidden_size"] == trained.model.config.hidden_size
    assert random.engine.max_slots == 2 and random.generate("Hello", 3).tokens_generated >= 1
