"""scripts/rag_real_table.py: the shared questions, the paired bootstrap of F1 / oracle, agreement with a
reference run and each run's own n, on hand-made rows (the script reads `ragserve eval` output lines)."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import rag_real_table as rt  # noqa: E402


def row(i, f1, pred="x", seconds=1.0):
    return {"id": f"q{i}", "prediction": pred, "em": float(f1 == 1.0), "f1": f1, "precision": f1, "recall": f1,
            "support_recall": 0.5, "retrievals": 1, "tokens": 3, "seconds": seconds,
            "times": {"prepare": 0.0, "relevancy": 0.0, "retrieval": 0.1, "apply": 0.9}}


def test_common_rows_keep_the_first_runs_order_and_only_shared_ids():
    runs = {"a": [row(3, 1.0), row(1, 0.0), row(2, 0.5)], "b": [row(2, 0.2), row(3, 0.4)]}
    ids, rows = rt.common_rows(runs)
    assert ids == ["q3", "q2"]
    assert [r["f1"] for r in rows["b"]] == [0.4, 0.2]


def test_bootstrap_is_paired_across_runs():
    oracle = [row(i, f) for i, f in enumerate([1.0, 0.0, 0.8, 0.4, 0.6, 1.0, 0.2, 0.0])]
    half = [row(i, r["f1"] / 2) for i, r in enumerate(oracle)]
    noisy = [row(i, f) for i, f in enumerate([0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0])]
    ci = rt.bootstrap({"oracle": oracle, "half": half, "noisy": noisy}, "oracle", resamples=500)
    # half of the oracle's F1 on every question: every paired resample gives exactly 0.5
    assert ci["half"]["f1_over_oracle_ci"] == [0.5, 0.5]
    assert ci["oracle"]["f1_over_oracle_ci"] == [1.0, 1.0]
    lo, hi = ci["noisy"]["f1_over_oracle_ci"]
    assert lo < 1.0 < hi  # unpaired with the oracle's answers: a wide interval around 1
    lo, hi = ci["oracle"]["f1_ci"]
    assert lo < 100 * sum(r["f1"] for r in oracle) / len(oracle) < hi


def test_agreement_counts_equal_predictions():
    rows = {"single": [row(0, 1, "a"), row(1, 0, "b")], "fl": [row(0, 1, "a"), row(1, 0, "c")]}
    assert rt.agreement(rows, "single") == {"single": 1.0, "fl": 0.5}


def test_cli_table_json_and_own_n(tmp_path):
    files = {}
    for label, rows in {"oracle": [row(i, 1.0) for i in range(4)],
                        "single": [row(i, 0.5, "p") for i in range(6)]}.items():
        files[label] = tmp_path / f"{label}.jsonl"
        files[label].write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "t.json"
    r = subprocess.run([sys.executable, "scripts/rag_real_table.py", "--dataset", "d", "--same-as", "single",
                        "--own-n", "--json", str(out), "--runs", *(f"{k}={v}" for k, v in files.items())],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "| single | 4 | 0.0 | 50.0 (50.0-50.0) | 50% (50-50%) |" in r.stdout
    assert "| single | 6 |" in r.stdout  # its own n
    data = json.loads(out.read_text())
    assert data["questions"] == 4 and data["own_n"] == {"oracle": 4, "single": 6}
    assert data["summaries"]["single"]["same_as_single"] == 1.0
    assert len(data["rows"]["single"]) == 4


def test_cli_rejects_an_unknown_reference(tmp_path):
    f = tmp_path / "a.jsonl"
    f.write_text(json.dumps(row(0, 1.0)) + "\n")
    r = subprocess.run([sys.executable, "scripts/rag_real_table.py", "--dataset", "d", "--same-as", "nope",
                        "--runs", f"a={f}"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--same-as 'nope'" in r.stderr
