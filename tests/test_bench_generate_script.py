"""scripts/bench_generate.py --device cuda runs once, blind, on the H200: its whole logic runs here at toy size on
torch's CPU device (the times mean nothing; the report's shape and the absence of errors do). The compiled step
goes through torch.compile's aot_eager backend here (tests/test_engine_gemma3_compile.py proves inductor's)."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_mode_runs_at_toy_size_on_the_cpu(tmp_path):
    out = tmp_path / "gpu.json"
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    r = subprocess.run([sys.executable, "scripts/bench_generate.py", "--device", "cuda", "--toy", "--torch-device",
                        "cpu", "--compile-backend", "aot_eager", "--out", str(out)], cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=path), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["toy"] and report["dtype"] == "bfloat16" and report["params"] > 0
    assert [run["batch"] for run in report["runs"]] == [1, 8]
    for run in report["runs"]:
        assert run["graph_ms"] > 0 and run["eager_ms"] > 0 and 0 < run["floor_ms"] < run["graph_ms"]
        # the server's engine: 8 slots of 4,096 positions; the toy's 24 + 4 positions read one 256-column bucket
        assert (run["max_slots"], run["max_length"]) == (8, 4096) and run["fixed_graph_ms"] > 0
        assert run["bucket"] == [run["batch"], 256] and run["read_bytes"] < run["fixed_read_bytes"]
        assert run["kv_bytes"] > 0 and run["x_floor"] == run["graph_ms"] / run["floor_ms"]
        assert run["compiled"] and run["compile_s"] > 0 and run["compiled_graph_ms"] > 0
        assert run["compiled_x_floor"] == run["compiled_graph_ms"] / run["floor_ms"]
        # aot_eager runs the step's own aten ops: the same tokens as the eager step
        assert run["greedy_equal"] and run["compiled_greedy_equal"] and run["compiled_first_difference"] is None
    assert "| batch | bucket (slots x columns) | compiled graph ms/step | graph ms/step |" in r.stdout


def test_gpu_mode_without_cuda_says_so():
    import torch

    if torch.cuda.is_available():
        return
    r = subprocess.run([sys.executable, "scripts/bench_generate.py", "--device", "cuda"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                           p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)))
    assert r.returncode == 2 and "CUDA is not available" in r.stderr
