"""scripts/bench_attention.py runs once, blind, on the H200: its whole logic is run here on tiny shapes with
``--device cpu`` and the Triton kernels interpreted (the times mean nothing; the report's shape and the absence of
errors do)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[1]


def test_bench_script_runs_every_method_and_reports(tmp_path):
    out = tmp_path / "bench.json"
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=path)
    r = subprocess.run([sys.executable, "scripts/bench_attention.py", "--device", "cpu", "--contexts", "300",
                        "--batches", "1", "--reps", "1", "--select-n", "3000", "--select-rows", "1", "--out",
                        str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["errors"] == [] and report["skipped"] == []
    runs = {(s["method"], s["path"]) for s in report["steps"]}
    assert runs == {("dense", "sdpa")} | {(m, p) for m in ("dsa", "quest", "lserve", "seer-topk")
                                          for p in ("triton", "torch")}
    for s in report["steps"]:
        assert s["step_ms"] > 0 and s["floor_ms"] > 0 and s["x_floor"] > 0
        if s["method"] != "dense":
            assert 0 <= s["memory_share"] <= 1 and s["selected_per_group"] == 300  # budget 2048 > context
    (sel,) = report["selection"]
    assert sel["same_values_as_torch_topk"] and sel["radix_ms"] > 0 and sel["bucket_ms"] > 0
    assert sel["torch_topk_ms"] > 0
    assert "| dsa | triton | 300 | 1 |" in r.stdout  # the table for RESULTS.md


def test_bench_script_keeps_what_ran_past_its_time_limit(tmp_path):
    """Nothing starts past --time-limit; the JSON says what was skipped (and is there though the run stopped)."""
    out = tmp_path / "bench.json"
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=path)
    r = subprocess.run([sys.executable, "scripts/bench_attention.py", "--device", "cpu", "--contexts", "300",
                        "--batches", "1", "--reps", "1", "--select-n", "3000", "--select-rows", "1",
                        "--methods", "quest", "--time-limit", "0", "--out", str(out)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["steps"] == [] and report["selection"] == []
    assert [sorted(k for k in s if k != "why") for s in report["skipped"]] == [["selection_rows"],
                                                                             ["batch", "context"]]
