"""scripts/bench_search_paths.py runs as is on the H200 (``--backend gpu``): its whole logic runs here on the small
HotpotQA index, with the cpu backend, a device queue (``fpga-sim``) and the gpu backend on torch's CPU device (the
times mean nothing; every path and the report's shape do)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PATHS = {"backend", "queue", "searcher", "searcher+text", "cli", "http"}


def _bench():
    spec = importlib.util.spec_from_file_location("bench_search_paths", ROOT / "scripts" / "bench_search_paths.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("backend", [["cpu", "--threads", "1"], ["fpga-sim"], ["gpu", "--device", "cpu"]],
                         ids=["cpu", "fpga-sim", "gpu-on-cpu"])
def test_bench_search_paths_reports_every_layer(hotpot_index, tmp_path, monkeypatch, backend):
    if backend[0] == "gpu":
        pytest.importorskip("torch")
        pytest.importorskip("triton")
        monkeypatch.setenv("TRITON_INTERPRET", "1")  # what the script sets for --device cpu, undone afterwards
    queries = tmp_path / "q.tsv"
    queries.write_text("".join(f"{i}\t{t}\n" for i, t in enumerate(
        ["which city is the capital of france", "river in germany", "who wrote the novel",
         "film directed by", "american football player"])))
    out = tmp_path / "paths.json"
    assert _bench().main(["--index", str(hotpot_index), "--queries", str(queries), "--backend", *backend, "-k", "5",
                          "--n", "3", "--repeat", "2", "--warmup", "2", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["backend"] == backend[0] and r["n"] == 3 and r["repeat"] == 2
    assert set(r["paths"]) == PATHS and set(r["components"]) == {"prepare", "hits", "hits+text"}
    for name, e in {**r["paths"], **r["components"]}.items():
        assert e["wall"]["p50_us"] > 0 and e["cpu"]["p99_us"] >= e["cpu"]["p50_us"] >= 0, name
        assert ("over_backend" in e) == (name in PATHS - {"backend"}), name
    assert all(v > 0 for v in r["searcher_stages_p50_us"].values())
