"""scripts/bench_concurrency.py end to end on the tiny random Llama and the HotpotQA index: every level runs through
the server's answer path, its answers equal one client's (the script checks), and the report has its figures."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests import rag_support as S

ROOT = Path(__file__).resolve().parents[1]


def test_bench_concurrency_reports_each_level(tmp_path):
    out = tmp_path / "conc.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_concurrency.py"), "--model", str(S.tiny_lm()),
                           "--index", str(S.hotpot_index()), "--engine", "reference", "--clients", "1,3",
                           "--answers", "3", "--max-new-tokens", "12", "--workdir", str(tmp_path), "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    r = json.loads(out.read_text())
    assert r["engine"] == "ReferenceEngine" and [lv["clients"] for lv in r["levels"]] == [1, 3]
    one, three = r["levels"]
    assert not one["errors"] and not three["errors"]  # includes: the same answers at both levels
    assert one["mean_batch"] == 1.0 and three["mean_batch"] > 1.0
    assert three["answers"] == 3 and three["p99_s"] >= three["p50_s"] > 0 and three["engine_s"] > 0
    assert "speedup_vs_1" in three
    assert len(r["tree"]["files_sha256"]) == 64  # stamped with the tree it measured (tools/provenance.py)
    bad = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_concurrency.py"), "--model", str(S.tiny_lm()),
                          "--clients", "0"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert bad.returncode == 2 and "must be positive" in bad.stderr
