"""``ragserve eval`` and ``ragserve eval build-index``: closed-corpus index in one command, JSON lines
written per question, resume after an interruption, summary table and JSON, user errors."""
from __future__ import annotations

import json

import pytest

from ragserve.cli import main
from ragserve.retrieval.searcher import Searcher
from tests import rag_support as S
from tests.conftest import shared


@pytest.fixture(scope="module", autouse=True)
def _threads():
    with S.one_torch_thread():
        yield


def eval_args(out, method="flare", limit=2, *extra):
    return ["eval", "--dataset", str(shared(*S.HOTPOT_IRCOT)), "--method", method, "--model", str(S.tiny_lm()),
            "--index", str(S.hotpot_index()), "--backend", "cpu", "--device", "cpu", "--limit", str(limit),
            "--out", str(out), "--max-new-tokens", "24", "--quiet", *extra]


def test_build_index_from_dataset_paragraphs(tmp_path, capsys):
    out = tmp_path / "hp-train"
    assert main(["eval", "build-index", "--dataset", str(shared("hotpotqa-train100-original", "hotpotqa_train.json")),
                 "--out", str(out), "--workers", "1"]) == 0
    assert "indexed 994 paragraphs of 100 hotpotqa questions" in capsys.readouterr().out
    corpus = [json.loads(l) for l in (tmp_path / "hp-train.corpus.jsonl").read_text().splitlines()]
    assert len(corpus) == 994 and set(corpus[0]) == {"_id", "title", "text"}
    s = Searcher(out)
    hits = s.search("Lilu mythology demon", k=3)
    assert hits[0].title == "Lilu (mythology)"
    s.close()
    # refuses to overwrite without --overwrite
    assert main(["eval", "build-index", "--dataset", str(shared("hotpotqa-train100-original", "hotpotqa_train.json")),
                 "--out", str(out), "--workers", "1"]) == 2
    assert "already exists" in capsys.readouterr().err


def test_build_index_needs_paragraphs(tmp_path, capsys):
    assert main(["eval", "build-index", "--dataset", str(shared("nq-open", "topics.dpr.nq.dev.txt")),
                 "--out", str(tmp_path / "x"), "--limit", "5"]) == 2
    assert "no context paragraphs" in capsys.readouterr().err


def test_eval_writes_rows_summary_and_resumes(tmp_path, capsys):
    out, summary = tmp_path / "flare.jsonl", tmp_path / "summary.json"
    assert main(eval_args(out, "flare", 2)) == 0
    first = out.read_text().splitlines()
    assert len(first) == 2
    row = json.loads(first[0])
    assert row["method"] == "flare" and row["dataset"] == "dev_subsampled.jsonl"
    assert set(row) >= {"id", "question", "answers", "prediction", "em", "f1", "precision", "recall",
                        "support_recall", "retrievals", "tokens", "times", "seconds", "steps", "output"}
    assert row["retrievals"] == sum(s["kind"] == "retrieve" for s in row["steps"]) >= 1
    table = capsys.readouterr().out
    assert "retrieval share%" in table and "flare" in table

    # an interrupted run: a torn last line; the rerun cuts it, keeps both rows and adds two more
    with open(out, "a") as f:
        f.write('{"id": "5a8c7595554299585d9e36b6", "method": "fl')
    assert main(eval_args(out, "flare", 4, "--summary-json", str(summary))) == 0
    lines = out.read_text().splitlines()
    assert lines[:2] == first and len(lines) == 4
    ids = [json.loads(l)["id"] for l in lines]
    assert ids == [e.id for e in S.hotpot_examples()[:4]]
    s = json.loads(summary.read_text())
    assert s["questions"] == 4 and s["backend"] == "cpu" and s["method"] == "flare"
    assert 0 <= s["retrieval_share"] <= 1 and abs(sum(s["stage_shares"].values()) - 1) < 1e-9
    assert s["support_recall"] is not None

    # a complete rerun does no work
    assert main(eval_args(out, "flare", 4)) == 0
    assert out.read_text().splitlines() == lines

    # another method into the same file is refused
    assert main(eval_args(out, "single", 4)) == 2
    assert "holds results for method 'flare'" in capsys.readouterr().err


def test_eval_two_stage_and_user_errors(tmp_path, capsys):
    out = tmp_path / "ts.jsonl"
    assert main(eval_args(out, "two-stage", 1, "--reranker", str(S.tiny_cross_encoder()), "--rerank-depth", "10",
                          "--reranker-device", "cpu")) == 0
    (row,) = [json.loads(l) for l in out.read_text().splitlines()]
    assert row["retrievals"] == 1 and len(row["steps"][0]["hits"]) == 3
    capsys.readouterr()
    assert main(eval_args(tmp_path / "e.jsonl", "two-stage", 1)) == 2
    assert "reranker" in capsys.readouterr().err
    args = eval_args(tmp_path / "e.jsonl", "single", 1)
    i = args.index("--index")
    assert main(args[:i] + args[i + 2:]) == 2
    assert "needs --index" in capsys.readouterr().err
    assert main(eval_args(tmp_path / "e.jsonl", "single", 1, "--index", str(tmp_path / "nope"))) == 2
    assert "no such index" in capsys.readouterr().err
    assert main(["eval", "--method", "none"]) == 2
    assert "missing --dataset" in capsys.readouterr().err
